"""The channel's operations: which fields each takes, how they are decoded and
validated, and the handler that runs each through the command gateway.

Every op's fields are listed in :data:`OP_FIELDS`; any other field is refused
(``invalid_argument``, the channel ends), as REST refuses an unknown field of a body,
so ``{"op":"publish","routng_key":"jobs"}`` is an error rather than a publish with an
empty key. The ops that have a REST twin decode their fields with the same decoder
(``broker.api.fields``), so both accept and refuse the same inputs the same way.

A handler is ``handler(session, op)``: it decodes, asks ``s.access.require(...)`` for
what it touches, runs its core command through ``s.batch`` (effects carried out at
the end of the chunk, after the reply is queued) or ``s.batch.run_durable`` (waits
for the records it logged), and queues its reply.

Over 500 lines: one handler per op, in one table, a few with their cluster-mode path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from broker.api.channel.replyto import REPLY_TO, cancel_reply, consume_reply
from broker.api.channel.session import ServedChannel
from broker.api.codec import message_json
from broker.api.fields import (
    BINDING_FIELDS,
    DEFAULT_EXCHANGE_ALIAS,
    EXCHANGE_DECLARE_FIELDS,
    LOCK_ACQUIRE_FIELDS,
    LOCK_REFRESH_FIELDS,
    LOCK_RELEASE_FIELDS,
    QUEUE_DECLARE_FIELDS,
    Binding,
    Fields,
    decode_binding,
    decode_exchange_declare,
    decode_queue_declare,
    exchange_name,
    unknown_fields,
)
from broker.core import (
    SERVER_NAMED_PREFIX,
    Broker,
    ChannelError,
    ErrorReply,
    InvalidArgument,
    LockBusy,
    NotLockHolder,
    check_delay,
    check_json_value,
)
from broker.runtime import ClusterLocksPort

__all__ = [
    "ENVELOPE",
    "OPS",
    "OP_FIELDS",
    "PUBLISH_FIELDS",
    "SETTLE_OPS",
    "ChannelClosed",
    "ack_each",
    "check_fields",
    "check_id",
    "echo_id",
    "op_delay",
    "reply",
]

#: The fields every op may carry: its name and a correlation ``id`` (echoed).
ENVELOPE = frozenset({"op", "id"})
#: The fields of a publish (besides the envelope).
PUBLISH_FIELDS = frozenset(
    {"exchange", "routing_key", "body", "body_b64", "properties", "mandatory", "delay_s", "deadline_ms", "dedup"}
)

#: Op name -> the fields it takes (envelope included). Anything else is refused.
OP_FIELDS: dict[str, frozenset[str]] = {
    name: ENVELOPE | fields
    for name, fields in {
        "publish": PUBLISH_FIELDS,
        # ``arguments``: consumer arguments (``x-priority`` is used; others are kept for clients that send them)
        "consume": frozenset({"queue", "consumer_tag", "prefetch", "no_ack", "exclusive", "ack_timeout_ms", "arguments"}),
        "cancel": frozenset({"consumer_tag"}),
        "get": frozenset({"queue", "no_ack"}),
        "qos": frozenset({"prefetch", "global"}),
        "ack": frozenset({"delivery_tag", "multiple", "delivery_tags"}),
        "nack": frozenset({"delivery_tag", "multiple", "requeue", "delay_s"}),
        "reject": frozenset({"delivery_tag", "requeue", "delay_s"}),
        "touch": frozenset({"delivery_tag"}),
        "declare_exchange": EXCHANGE_DECLARE_FIELDS | {"exchange"},
        "delete_exchange": frozenset({"exchange", "if_unused"}),
        "declare_queue": QUEUE_DECLARE_FIELDS | {"queue"},
        "delete_queue": frozenset({"queue", "if_unused", "if_empty"}),
        "purge_queue": frozenset({"queue"}),
        "bind": BINDING_FIELDS,
        "unbind": BINDING_FIELDS,
        "close": frozenset(),
        "tx_select": frozenset(),
        "tx_commit": frozenset(),
        "tx_rollback": frozenset(),
        "lock_acquire": LOCK_ACQUIRE_FIELDS | {"lock"},
        "lock_refresh": LOCK_REFRESH_FIELDS | {"lock"},
        "lock_release": LOCK_RELEASE_FIELDS | {"lock"},
        "lock_info": frozenset({"lock"}),
    }.items()
}


class ChannelClosed(Exception):
    """The channel ends normally (close op or end of input): stop reading."""


def check_fields(op: dict[str, Any], name: str, allowed: frozenset[str]) -> None:
    """Raises InvalidArgument if ``op`` carries a field its op does not take."""
    if not allowed.issuperset(op):
        raise unknown_fields(op, allowed, f"{name} op")


def echo_id(op: dict[str, Any]) -> tuple[bool, Any]:
    """(whether to echo, the id): an op's ``id`` (any JSON value: the client's
    correlation token) is echoed only within the bounds of every JSON value the broker
    keeps (``check_json_value``): one nested too deep could not even be encoded."""
    if "id" not in op:
        return False, None
    try:
        check_json_value(op["id"], "id")
    except InvalidArgument:
        return False, None
    return True, op["id"]


def check_id(op: dict[str, Any]) -> None:
    """Raises InvalidArgument for an ``id`` that cannot be echoed."""
    if "id" in op:
        check_json_value(op["id"], "id")


def reply(request: dict[str, Any], ev: str, /, **fields: Any) -> dict[str, Any]:
    """The reply event ``ev`` to the op ``request`` (echoing its ``id``). Positional-only
    parameters: replies carry a field named ``op``."""
    event: dict[str, Any] = {"ev": ev}
    echo, op_id = echo_id(request)
    if echo:
        event["id"] = op_id
    event.update(fields)
    return event


def _get(op: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = op.get(name, default)
    if value is None and default is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidArgument(f"field {name} has the wrong type")
    return value


def ack_tags(op: dict[str, Any]) -> list[int]:
    """An ``ack`` op's ``delivery_tags`` (many acks in one op, each as ``multiple``
    false), which go without ``delivery_tag`` and ``multiple``."""
    if "delivery_tag" in op or "multiple" in op:
        raise InvalidArgument("an ack op takes delivery_tags or delivery_tag (and multiple), not both")
    tags = op["delivery_tags"]
    if not isinstance(tags, list) or not all(type(tag) is int for tag in tags):
        raise InvalidArgument("field delivery_tags must be a list of integers")
    return tags


def ack_each(core: Broker, channel_id: int, tags: list[int]) -> None:
    """Ack each of ``tags`` in order (an unknown one raises, the ones before it stay
    acked: as many ``ack`` ops would)."""
    ack = core.ack
    for tag in tags:
        ack(channel_id, tag, False)


def op_delay(op: dict[str, Any]) -> float | None:
    """An op's ``delay_s`` (none: no delay)."""
    value = op.get("delay_s")
    return None if value is None else check_delay(value)


def _fields(op: dict[str, Any]) -> Fields:
    """The op as typed fields (its field list was checked by the reader)."""
    name = op["op"]
    return Fields(op, OP_FIELDS[name], f"{name} op")


# -- consumers and settling ------------------------------------------------------------


async def _op_consume(s: ServedChannel, op: dict[str, Any]) -> None:
    timeout_ms = _get(op, "ack_timeout_ms", (int, float), None)
    queue = _get(op, "queue", str, None) or ""
    priority = _get(op, "arguments", dict, {}).get("x-priority")  # (validated by the core)
    consumer_tag = _get(op, "consumer_tag", str, "")
    prefetch = _get(op, "prefetch", int, None)
    no_ack, exclusive = _get(op, "no_ack", bool, False), _get(op, "exclusive", bool, False)
    if queue == REPLY_TO:  # direct reply-to (replyto.py): no queue, no permission asked
        return consume_reply(s, reply(op, "consume_ok"), consumer_tag, no_ack)
    s.access.require("consume", queue)
    if s.principal is not None:
        s.principal.check_consumer(s.gateway.runtime.core)
    cid = s.channel_id
    ack_timeout_s = timeout_ms / 1000.0 if timeout_ms is not None else None

    def consume(core: Broker) -> tuple[str, bool]:
        tag = core.consume(
            cid, queue, consumer_tag=consumer_tag, prefetch=prefetch, no_ack=no_ack,
            exclusive=exclusive, ack_timeout_s=ack_timeout_s, priority=priority,
        )
        return tag, core.consumer_active(cid, tag)

    relayed = s.relayed_consumers()
    located = relayed.remote_owner(queue) if relayed is not None and queue else None
    if relayed is not None and located is not None:
        s.batch.flush()
        tag, active = await relayed.consume(queue, located[0], located[1], op)
        s.send_event(reply(op, "consume_ok", consumer_tag=tag, active=active))
        relayed.started(tag)
        return
    if relayed is not None and consumer_tag and relayed.has_consumer(consumer_tag):
        raise ChannelError(f"consumer tag {consumer_tag!r} is in use on this channel", code="not_allowed")
    tag, active = s.batch.run(consume)
    if relayed is not None and not s.forwarded:  # a quorum queue's consumer outlives this node's leadership
        relayed.local.noted(queue, tag, op)
    s.send_event(reply(op, "consume_ok", consumer_tag=tag, active=active))


async def _op_cancel(s: ServedChannel, op: dict[str, Any]) -> None:
    tag = _get(op, "consumer_tag", str, None)
    if tag is None:
        raise InvalidArgument("field consumer_tag is required")
    # AMQP 0-9-1 basic.cancel: an unknown tag is not an error ("the server MUST ignore
    # it", as RabbitMQ does): the broker may have cancelled the consumer itself (its
    # queue was deleted) while the client's cancel was on its way.
    cid = s.channel_id
    if s.views.has_consumer(cid, tag):
        s.batch.run(lambda core: core.cancel(cid, tag))
        if s.relayed is not None:
            s.relayed.local.forget(tag)
    elif not cancel_reply(s, tag) and s.relayed is not None:  # (direct reply-to's: replyto.py)
        await s.relayed.cancel(tag)
    s.send_event(reply(op, "cancel_ok", consumer_tag=tag))


async def _op_get(s: ServedChannel, op: dict[str, Any]) -> None:
    """One message of a queue, delivered on this channel (AMQP's ``basic.get``):
    ``get_ok`` with a delivery tag to settle like a consumer's (unacked until then,
    unless ``no_ack``) and the ready messages left, or ``get_empty``."""
    queue = _get(op, "queue", str, None) or ""
    no_ack = _get(op, "no_ack", bool, False)
    s.access.require("get", queue)
    relayed = s.relayed_consumers()
    located = relayed.remote_owner(queue) if relayed is not None and queue else None
    if relayed is not None and located is not None:
        s.batch.flush()
        got_event = await relayed.get(queue, located[0], located[1], no_ack)
        s.send_event(reply(op, "get_empty") if got_event is None else {**got_event, **reply(op, "get_ok")})
        return
    cid = s.channel_id
    got = s.batch.run(lambda core: core.channel_get(cid, queue, no_ack=no_ack))
    if got is None:
        s.send_event(reply(op, "get_empty"))
        return
    s.send_event(reply(op, "get_ok", delivery_tag=got.delivery_tag, redelivered=got.redelivered,
                       exchange=got.message.exchange, routing_key=got.message.routing_key,
                       message_count=got.message_count, message=message_json(got.message)))


async def _op_qos(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    prefetch, global_ = _get(op, "prefetch", int, 0), _get(op, "global", bool, False)
    s.batch.run(lambda core: core.qos(cid, prefetch, global_))
    if s.relayed is not None:  # cluster mode: the owners of relayed consumers too
        await s.relayed.qos(prefetch, global_)
    s.send_event(reply(op, "ok", op="qos"))


async def _relayed_settle(s: ServedChannel, op: dict[str, Any], tag: Any, multiple: bool) -> bool:
    """Cluster mode: settle the relayed deliveries ``op`` names on their owners;
    True when ``tag`` is a relayed one (this core has nothing to settle then)."""
    relayed = s.relayed
    if relayed is None:
        return False
    remote_fields = {k: v for k, v in op.items() if k in ("op", "requeue", "delay_s")}
    if relayed.owns(tag):
        await relayed.settle(remote_fields, tag, multiple)
        return True
    if multiple:
        await relayed.settle(remote_fields, tag, True)
    return False


async def _op_ack(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    if op.get("delivery_tags") is not None:
        tags = ack_tags(op)
        if s.relayed is None:
            s.batch.run(lambda core: ack_each(core, cid, tags))
            return
        for each in tags:  # cluster mode: some may be relayed deliveries
            if not await _relayed_settle(s, {"op": "ack"}, each, False):
                s.batch.run(lambda core: ack_each(core, cid, [each]))  # noqa: B023 - run at once
        return
    tag, multiple = _get(op, "delivery_tag", int, None), _get(op, "multiple", bool, False)
    if not await _relayed_settle(s, op, tag, multiple):
        s.batch.run(lambda core: core.ack(cid, tag, multiple))


async def _op_nack(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    tag, multiple = _get(op, "delivery_tag", int, None), _get(op, "multiple", bool, False)
    requeue, delay_s = _get(op, "requeue", bool, True), op_delay(op)
    if not await _relayed_settle(s, op, tag, multiple):
        s.batch.run(lambda core: core.nack(cid, tag, multiple, requeue, delay_s=delay_s))


async def _op_reject(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    tag, requeue, delay_s = _get(op, "delivery_tag", int, None), _get(op, "requeue", bool, True), op_delay(op)
    if not await _relayed_settle(s, op, tag, False):
        s.batch.run(lambda core: core.reject(cid, tag, requeue, delay_s=delay_s))


async def _op_touch(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    tag = _get(op, "delivery_tag", int, None)
    if not await _relayed_settle(s, op, tag, False):
        s.batch.run(lambda core: core.touch(cid, tag))


# -- topology --------------------------------------------------------------------------


async def _op_declare_exchange(s: ServedChannel, op: dict[str, Any]) -> None:
    name = exchange_name(_get(op, "exchange", str, None) or "")
    d = decode_exchange_declare(_fields(op))
    if not d.passive:
        s.access.require_declare("declare_exchange", name or DEFAULT_EXCHANGE_ALIAS, d.arguments)
    s.batch.flush()
    exchange, created = await s.gateway.declare_exchange(
        name, d.type, durable=d.durable, auto_delete=d.auto_delete, internal=d.internal,
        arguments=d.arguments, passive=d.passive,
    )
    s.send_event(reply(op, "ok", op="declare_exchange", exchange=exchange, created=created))


async def _op_delete_exchange(s: ServedChannel, op: dict[str, Any]) -> None:
    name = exchange_name(_get(op, "exchange", str, None) or "")
    s.access.require("delete_exchange", name or DEFAULT_EXCHANGE_ALIAS)
    if_unused = _get(op, "if_unused", bool, False)
    s.batch.flush()
    await s.gateway.delete_exchange(name, if_unused=if_unused)
    s.send_event(reply(op, "ok", op="delete_exchange"))


async def _op_declare_queue(s: ServedChannel, op: dict[str, Any]) -> None:
    name = _get(op, "queue", str, "")
    d = decode_queue_declare(_fields(op))
    if not d.passive:
        # A server-named queue is checked as "amq.gen-" (RabbitMQ names them amq.gen-*).
        s.access.require_declare("declare_queue", name or SERVER_NAMED_PREFIX, d.arguments)
    s.batch.flush()
    queue, created = await s.gateway.declare_queue(
        s.channel_id, name, durable=d.durable, exclusive=d.exclusive, auto_delete=d.auto_delete,
        arguments=d.arguments, passive=d.passive,
    )
    info = s.views.queue_info(queue) or {"messages_ready": 0, "consumers": 0}
    s.send_event(
        reply(
            op, "ok", op="declare_queue", queue=queue, created=created,
            messages=info["messages_ready"], consumers=info["consumers"],
        )
    )


async def _op_delete_queue(s: ServedChannel, op: dict[str, Any]) -> None:
    name = _get(op, "queue", str, None) or ""
    s.access.require("delete_queue", name)
    if_unused, if_empty = _get(op, "if_unused", bool, False), _get(op, "if_empty", bool, False)
    s.batch.flush()
    count = await s.gateway.delete_queue(s.channel_id, name, if_unused=if_unused, if_empty=if_empty)
    s.send_event(reply(op, "ok", op="delete_queue", messages=count))


async def _op_purge_queue(s: ServedChannel, op: dict[str, Any]) -> None:
    name = _get(op, "queue", str, None) or ""
    s.access.require("purge", name)
    cid = s.channel_id
    cluster = s.runtime.cluster
    located = cluster.owner_of(name) if cluster is not None else None
    if cluster is not None and located is not None and located[0] != cluster.node_name:
        s.batch.flush()
        count = await cluster.purge_remote(name)  # on its owner
    else:
        count = s.batch.run(lambda core: core.purge_queue(name, channel_id=cid))
    s.send_event(reply(op, "ok", op="purge_queue", messages=count))


def _authorize_binding(s: ServedChannel, operation: str, b: Binding) -> None:
    """Write on the destination, read on the source (exchanges by their path names)."""
    s.access.require(
        operation,
        (b.destination or DEFAULT_EXCHANGE_ALIAS) if b.to_exchange else b.destination,
        source=b.source or DEFAULT_EXCHANGE_ALIAS,
    )


async def _op_bind(s: ServedChannel, op: dict[str, Any]) -> None:
    b = decode_binding(_fields(op))
    _authorize_binding(s, "bind", b)
    s.batch.flush()
    await s.gateway.bind(s.channel_id, b.source, b.destination, b.routing_key, b.arguments, to_exchange=b.to_exchange)
    s.send_event(reply(op, "ok", op="bind"))


async def _op_unbind(s: ServedChannel, op: dict[str, Any]) -> None:
    b = decode_binding(_fields(op))
    _authorize_binding(s, "unbind", b)
    s.batch.flush()
    await s.gateway.bind(
        s.channel_id, b.source, b.destination, b.routing_key, b.arguments, to_exchange=b.to_exchange, unbind=True
    )
    s.send_event(reply(op, "ok", op="unbind"))


# -- transactions ----------------------------------------------------------------------


async def _op_tx_select(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    s.batch.run(lambda core: core.tx_select(cid))
    s.send_event(reply(op, "ok", op="tx_select"))


async def _op_tx_commit(s: ServedChannel, op: dict[str, Any]) -> None:
    """Apply the transaction in one step; answer once it is on disk (its publishes'
    confirms come first)."""
    cid = s.channel_id
    count = await s.gateway.tx_commit(cid, s.relayed)  # (in a cluster: other owners' shares too)
    s.send_event(reply(op, "ok", op="tx_commit", operations=count))


async def _op_tx_rollback(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    count = s.batch.run(lambda core: core.tx_rollback(cid))
    if s.relayed is not None:  # cluster mode: its settles of relayed deliveries too
        count += s.relayed.rollback_held()
    s.send_event(reply(op, "ok", op="tx_rollback", operations=count))


# -- locks -----------------------------------------------------------------------------


def _refused(op: dict[str, Any], exc: LockBusy | NotLockHolder) -> dict[str, Any]:
    """A ``refused`` event: the op was declined, the channel goes on."""
    return reply(op, "refused", op=op.get("op"), error=exc.code, message=exc.message, lock=exc.info)


async def _op_lock_acquire(s: ServedChannel, op: dict[str, Any]) -> None:
    """Acquire a lock: ``ok`` at once, or once it is granted after waiting in line
    (other ops go on meanwhile; the answer echoes the op's ``id``), or ``refused``."""
    echo, op_id = echo_id(op)
    name = _get(op, "lock", str, None) or ""
    s.access.require("lock", name)
    cid = s.channel_id
    owner, ttl_s, wait_s = op.get("owner"), op.get("ttl_s", 30), op.get("wait_s", 0)
    ref = {"id": op_id} if echo else {}
    cluster = s.runtime.cluster
    if cluster is not None:  # held in etcd for the whole cluster
        s.batch.flush()
        if isinstance(wait_s, (int, float)) and not isinstance(wait_s, bool) and wait_s > 0 and s.tasks is not None:
            s.tasks.start_soon(_cluster_lock_wait, s, op, cluster.locks, (name, owner, ttl_s, wait_s))
            return  # other ops go on meanwhile, as on a single node
        try:
            granted = await cluster.locks.acquire(name, owner, ttl_s, wait_s)
        except LockBusy as exc:
            s.send_event(_refused(op, exc))
            return
        s.send_event(reply(op, "ok", op="lock_acquire", lock=granted))
        return
    try:
        info, _waiter = await s.batch.run_durable(
            lambda core: core.lock_acquire(cid, name, owner, ttl_s, wait_s, ref=ref)
        )
    except LockBusy as exc:
        s.send_event(_refused(op, exc))
        return
    if info is not None:
        s.send_event(reply(op, "ok", op="lock_acquire", lock=info))


async def _cluster_lock_wait(s: ServedChannel, op: dict[str, Any], locks: ClusterLocksPort, args: tuple[Any, ...]) -> None:
    """A cluster lock acquire that may wait, answered when it ends (its ``id`` echoed);
    a grant the channel can no longer be told of is released."""
    name, owner = args[0], args[1]
    try:
        granted = await locks.acquire(*args)
    except LockBusy as exc:
        if not s.finished:
            s.send_event(_refused(op, exc))
        return
    except ErrorReply as exc:  # etcd unreachable, a bad field: refused, the channel goes on
        if not s.finished:
            s.send_event(reply(op, "refused", op="lock_acquire", error=exc.code, message=exc.message, lock=None))
        return
    if s.finished:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await locks.release(name, owner, granted["token"])
            except ErrorReply:
                pass  # it lapses with its TTL
        return
    s.send_event(reply(op, "ok", op="lock_acquire", lock=granted))


async def _op_lock_refresh(s: ServedChannel, op: dict[str, Any]) -> None:
    name = _get(op, "lock", str, None) or ""
    s.access.require("lock", name)
    owner, token, ttl_s = op.get("owner"), op.get("token"), op.get("ttl_s")
    cluster = s.runtime.cluster
    try:
        if cluster is not None:
            info = await cluster.locks.refresh(name, owner, token, ttl_s)
        else:
            info = await s.batch.run_durable(lambda core: core.lock_refresh(name, owner, token, ttl_s))
    except NotLockHolder as exc:
        s.send_event(_refused(op, exc))
        return
    s.send_event(reply(op, "ok", op="lock_refresh", lock=info))


async def _op_lock_release(s: ServedChannel, op: dict[str, Any]) -> None:
    name = _get(op, "lock", str, None) or ""
    s.access.require("lock", name)
    owner, token = op.get("owner"), op.get("token")
    cluster = s.runtime.cluster
    try:
        if cluster is not None:
            info = await cluster.locks.release(name, owner, token)
        else:
            info = await s.batch.run_durable(lambda core: core.lock_release(name, owner, token))
    except NotLockHolder as exc:
        s.send_event(_refused(op, exc))
        return
    s.send_event(reply(op, "ok", op="lock_release", lock=info))


async def _op_lock_info(s: ServedChannel, op: dict[str, Any]) -> None:
    name = _get(op, "lock", str, None) or ""
    cluster = s.runtime.cluster
    info = await cluster.locks.info(name) if cluster is not None else s.views.lock_info(name)
    s.send_event(reply(op, "ok", op="lock_info", lock=info))


# -- the end ---------------------------------------------------------------------------


async def _op_close(s: ServedChannel, op: dict[str, Any]) -> None:
    await s.flush_confirms()
    s.stop_consumers()
    s.send_final(reply(op, "close_ok"))
    raise ChannelClosed()


Handler = Callable[[ServedChannel, dict[str, Any]], Awaitable[None]]

#: Op name -> its handler (``publish`` is the reader's own fast path).
OPS: dict[str, Handler] = {
    "consume": _op_consume,
    "cancel": _op_cancel,
    "get": _op_get,
    "qos": _op_qos,
    "ack": _op_ack,
    "nack": _op_nack,
    "reject": _op_reject,
    "touch": _op_touch,
    "declare_exchange": _op_declare_exchange,
    "delete_exchange": _op_delete_exchange,
    "declare_queue": _op_declare_queue,
    "delete_queue": _op_delete_queue,
    "purge_queue": _op_purge_queue,
    "bind": _op_bind,
    "unbind": _op_unbind,
    "close": _op_close,
    "tx_select": _op_tx_select,
    "tx_commit": _op_tx_commit,
    "tx_rollback": _op_tx_rollback,
    "lock_acquire": _op_lock_acquire,
    "lock_refresh": _op_lock_refresh,
    "lock_release": _op_lock_release,
    "lock_info": _op_lock_info,
}
#: Ops with no reply: they do not pump first (their effects leave with the chunk's).
SETTLE_OPS = frozenset({"ack", "nack", "reject", "touch"})

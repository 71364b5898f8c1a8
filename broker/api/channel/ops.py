"""The channel's operations: the handler of each op, which decodes its fields, asks
for the permission, runs its core command through the command gateway and queues its
reply (each op's fields and the envelope every op shares: ``opfields.py``; the lock
ops: ``lock_ops.py``; direct reply-to's consume: ``replyto.py``).

The ops that have a REST twin decode their fields with the same decoder
(``broker.api.fields``), so both accept and refuse the same inputs the same way.

A handler is ``handler(session, op)``: it decodes, asks ``s.access.require(...)`` for
what it touches, runs its core command through ``s.batch`` (effects carried out at
the end of the chunk, after the reply is queued) or ``s.batch.run_durable`` (waits
for the records it logged), and queues its reply.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from broker.api.channel.lock_ops import LOCK_OPS
from broker.api.channel.opfields import (
    ChannelClosed,
    ack_each,
    ack_tags,
    get_field,
    op_delay,
    reply,
    typed_fields,
)
from broker.api.channel.reply_declare import declare_reply, is_reply_name
from broker.api.channel.replyto import REPLY_TO, cancel_reply, consume_reply
from broker.api.channel.session import ServedChannel
from broker.api.codec import message_json
from broker.api.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    Binding,
    decode_binding,
    decode_exchange_declare,
    decode_queue_declare,
    exchange_name,
)
from broker.core import (
    SERVER_NAMED_PREFIX,
    Broker,
    InvalidArgument,
)

__all__ = ["OPS", "SETTLE_OPS"]

# -- consumers and settling ------------------------------------------------------------


async def _op_consume(s: ServedChannel, op: dict[str, Any]) -> None:
    timeout_ms = get_field(op, "ack_timeout_ms", (int, float), None)
    queue = get_field(op, "queue", str, None) or ""
    priority = get_field(op, "arguments", dict, {}).get("x-priority")  # (validated by the core)
    consumer_tag = get_field(op, "consumer_tag", str, "")
    prefetch = get_field(op, "prefetch", int, None)
    no_ack, exclusive = get_field(op, "no_ack", bool, False), get_field(op, "exclusive", bool, False)
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
    tag, active = s.batch.run(consume)  # (a tag in use, of any kind: the core's not_allowed)
    if relayed is not None and not s.forwarded:  # a quorum queue's consumer outlives this node's leadership
        relayed.local.noted(queue, tag, op)
    s.send_event(reply(op, "consume_ok", consumer_tag=tag, active=active))


async def _op_cancel(s: ServedChannel, op: dict[str, Any]) -> None:
    tag = get_field(op, "consumer_tag", str, None)
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
    queue = get_field(op, "queue", str, None) or ""
    no_ack = get_field(op, "no_ack", bool, False)
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
    prefetch, global_ = get_field(op, "prefetch", int, 0), get_field(op, "global", bool, False)
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
    tag, multiple = get_field(op, "delivery_tag", int, None), get_field(op, "multiple", bool, False)
    if not await _relayed_settle(s, op, tag, multiple):
        s.batch.run(lambda core: core.ack(cid, tag, multiple))


async def _op_nack(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    tag, multiple = get_field(op, "delivery_tag", int, None), get_field(op, "multiple", bool, False)
    requeue, delay_s = get_field(op, "requeue", bool, True), op_delay(op)
    if not await _relayed_settle(s, op, tag, multiple):
        s.batch.run(lambda core: core.nack(cid, tag, multiple, requeue, delay_s=delay_s))


async def _op_reject(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    tag, requeue, delay_s = get_field(op, "delivery_tag", int, None), get_field(op, "requeue", bool, True), op_delay(op)
    if not await _relayed_settle(s, op, tag, False):
        s.batch.run(lambda core: core.reject(cid, tag, requeue, delay_s=delay_s))


async def _op_touch(s: ServedChannel, op: dict[str, Any]) -> None:
    cid = s.channel_id
    tag = get_field(op, "delivery_tag", int, None)
    if not await _relayed_settle(s, op, tag, False):
        s.batch.run(lambda core: core.touch(cid, tag))


# -- topology --------------------------------------------------------------------------


async def _op_declare_exchange(s: ServedChannel, op: dict[str, Any]) -> None:
    name = exchange_name(get_field(op, "exchange", str, None) or "")
    d = decode_exchange_declare(typed_fields(op))
    if not d.passive:
        s.access.require_declare("declare_exchange", name or DEFAULT_EXCHANGE_ALIAS, d.arguments)
    s.batch.flush()
    exchange, created = await s.gateway.declare_exchange(
        name, d.type, durable=d.durable, auto_delete=d.auto_delete, internal=d.internal,
        arguments=d.arguments, passive=d.passive,
    )
    s.send_event(reply(op, "ok", op="declare_exchange", exchange=exchange, created=created))


async def _op_delete_exchange(s: ServedChannel, op: dict[str, Any]) -> None:
    name = exchange_name(get_field(op, "exchange", str, None) or "")
    s.access.require("delete_exchange", name or DEFAULT_EXCHANGE_ALIAS)
    if_unused = get_field(op, "if_unused", bool, False)
    s.batch.flush()
    await s.gateway.delete_exchange(name, if_unused=if_unused)
    s.send_event(reply(op, "ok", op="delete_exchange"))


async def _op_declare_queue(s: ServedChannel, op: dict[str, Any]) -> None:
    name = get_field(op, "queue", str, "")
    d = decode_queue_declare(typed_fields(op))
    if is_reply_name(name):  # direct reply-to's check (reply_declare.py), before any other rule
        declare_reply(s, op, name)
        return
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
    name = get_field(op, "queue", str, None) or ""
    s.access.require("delete_queue", name)
    if_unused, if_empty = get_field(op, "if_unused", bool, False), get_field(op, "if_empty", bool, False)
    s.batch.flush()
    count = await s.gateway.delete_queue(s.channel_id, name, if_unused=if_unused, if_empty=if_empty)
    s.send_event(reply(op, "ok", op="delete_queue", messages=count))


async def _op_purge_queue(s: ServedChannel, op: dict[str, Any]) -> None:
    name = get_field(op, "queue", str, None) or ""
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
    b = decode_binding(typed_fields(op))
    _authorize_binding(s, "bind", b)
    s.batch.flush()
    await s.gateway.bind(s.channel_id, b.source, b.destination, b.routing_key, b.arguments, to_exchange=b.to_exchange)
    s.send_event(reply(op, "ok", op="bind"))


async def _op_unbind(s: ServedChannel, op: dict[str, Any]) -> None:
    b = decode_binding(typed_fields(op))
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
    **LOCK_OPS,
}
#: Ops with no reply: they do not pump first (their effects leave with the chunk's).
SETTLE_OPS = frozenset({"ack", "nack", "reject", "touch"})

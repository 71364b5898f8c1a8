"""The AMQP methods that are not per message: declares, binds, deletes, purges,
consume and cancel, get, qos, recover, confirm and tx, each a handler from the
method's pamqp class to the ``Broker`` facade's commands, after the permission check
the HTTP API makes for the same operation; and :func:`handle`, which routes every
event of the connection to its handler or to the session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pamqp import commands

from broker.amqp.events import (
    Acks,
    ChannelClosedByPeer,
    ChannelFailed,
    ChannelOpened,
    ConnectionEnded,
    Content,
    Login,
    Method,
    Opened,
)
from broker.amqp.frames import (
    ACK,
    Ack,
    Nack,
    Reject,
    encode_cancel_ok,
    encode_consume_ok,
    encode_declare_ok,
    encode_get_ok,
    encode_sent_properties,
)
from broker.amqp.relays import (
    consume_fields,
    quorum_of,
    relay_consume,
    relay_get,
    remote_owner,
    settle_relayed,
)
from broker.amqp.replies import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
)
from broker.amqp.replyto import (
    REPLY_TO,
    is_reply_queue,
    reply_cancel,
    reply_consume,
    reply_declare,
    reused_tag,
)
from broker.amqp.session import (
    DEFAULT_EXCHANGE_ALIAS,
    AMQPChannel,
    AMQPException,
    AMQPSession,
    exchange_alias,
)
from broker.core import (
    EXCHANGE_TYPES,
    SERVER_NAMED_PREFIX,
    ConsumerTagInUse,
    ErrorReply,
    NotFound,
)

__all__ = ["handle"]

log = logging.getLogger("ackbus.amqp")


def _plain(value: Any) -> Any:
    """pamqp's decoded table values as JSON (declare arguments)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "timestamp"):
        return int(value.timestamp())
    return str(value)  # Decimal


async def handle(s: AMQPSession, event: Any) -> None:
    """Carry out one event of the connection: a method by its handler, the rest by
    the session."""
    if s.handle_nowait(event):  # a publish or a settlement
        s.wake()
        return
    kind = type(event)
    if kind is Content:  # a publish while publishing is blocked
        await s.publish_when_allowed(event)
    elif kind is Acks:  # acks on a channel with relayed deliveries: one by one
        for tag in event.tags:
            await handle(s, Method(event.channel, ACK, Ack(tag, False)))
    elif kind is Method:
        method = event.method
        ch = s.channels.get(event.channel)
        if ch is None:
            return
        handler = HANDLERS.get(type(method))
        index = event.index
        try:
            if handler is None:
                raise AMQPException(NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - {method.name} is not supported")
            s.bridge.flush()  # earlier ops' deliveries and confirms first
            s.run_failures()  # (a publish before it may have closed the channel)
            if s.channels.get(event.channel) is not ch:
                return
            await handler(s, ch, method)
        except (AMQPException, ErrorReply) as exc:
            s.raise_on(ch, exc, index >> 16, index & 0xFFFF)
    elif kind is ChannelOpened:
        await s.open_channel(event.channel)
    elif kind is ChannelClosedByPeer:
        ch = s.channels.pop(event.channel, None)
        if ch is not None:
            s.release(ch, "closed by client")
        s.conn.channel_close_ok(event.channel)
    elif kind is ChannelFailed:
        ch = s.channels.pop(event.channel, None)
        if ch is not None:
            s.release(ch, f"channel error {event.code}")
        log.info("amqp channel closed on error", extra={"fields": {"channel": event.channel, "code": event.code, "text": event.text}})
    elif kind is Login:
        await s.authenticate(event)
    elif kind is Opened:
        log.info("amqp connection opened", extra={"fields": {"remote": s.remote, "user": s.conn.username}})
    elif kind is ConnectionEnded:
        fields = {"remote": s.remote, "code": event.code, "text": event.text[:200], "by_client": event.by_peer}
        if event.code >= 500 or event.code == 403:
            log.warning("amqp connection closed on error", extra={"fields": fields})
        else:
            log.info("amqp connection closed", extra={"fields": fields})
        s.release_all("connection closed")
    s.wake()


async def _exchange_declare(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    name = exchange_alias(m.exchange or "")
    if not m.passive:
        s.access.require("declare_exchange", name or DEFAULT_EXCHANGE_ALIAS)
    if name == "" and not m.passive:
        raise AMQPException(ACCESS_REFUSED, "ACCESS_REFUSED - operation not permitted on the default exchange")
    if not m.passive and m.exchange_type not in EXCHANGE_TYPES:
        # RabbitMQ: a connection exception
        raise AMQPException(COMMAND_INVALID, f"COMMAND_INVALID - invalid exchange type '{m.exchange_type}'")
    await s.bridge.gateway.declare_exchange(
        name, m.exchange_type or "direct", durable=bool(m.durable), auto_delete=bool(m.auto_delete),
        internal=bool(m.internal), arguments=_plain(m.arguments or {}), passive=bool(m.passive),
    )
    s.reply(ch, commands.Exchange.DeclareOk(), m.nowait)


async def _exchange_delete(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    name = exchange_alias(m.exchange or "")
    s.access.require("delete_exchange", name or DEFAULT_EXCHANGE_ALIAS)
    if name == "":
        raise AMQPException(ACCESS_REFUSED, "ACCESS_REFUSED - operation not permitted on the default exchange")
    if not s.views.exchange_exists(name):
        # RabbitMQ 3.x: deleting an exchange that does not exist succeeds.
        s.reply(ch, commands.Exchange.DeleteOk(), m.nowait)
        return
    await s.bridge.gateway.delete_exchange(name, if_unused=bool(m.if_unused))
    s.reply(ch, commands.Exchange.DeleteOk(), m.nowait)


async def _exchange_bind(s: AMQPSession, ch: AMQPChannel, m: Any, unbind: bool = False) -> None:
    source, dest = exchange_alias(m.source or ""), exchange_alias(m.destination or "")
    op = "unbind" if unbind else "bind"
    s.access.require(op, dest or DEFAULT_EXCHANGE_ALIAS, source=source or DEFAULT_EXCHANGE_ALIAS)
    args = _plain(m.arguments or {})
    key = m.routing_key or ""
    await _bind(s, ch, source, dest, key, args, to_exchange=True, unbind=unbind)
    s.reply(ch, commands.Exchange.UnbindOk() if unbind else commands.Exchange.BindOk(), m.nowait)


async def _bind(
    s: AMQPSession, ch: AMQPChannel, source: str, dest: str, key: str, args: dict[str, Any], *, to_exchange: bool,
    unbind: bool,
) -> None:
    """Bind or unbind. An unbind succeeds when the binding, its exchange or its
    destination is not there: RabbitMQ 3.x answers unbind-ok then too."""
    try:
        await s.bridge.gateway.bind(ch.core_id, source, dest, key, args, to_exchange=to_exchange, unbind=unbind)
    except NotFound:
        if not unbind:
            raise


async def _exchange_unbind(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    await _exchange_bind(s, ch, m, unbind=True)


async def _queue_declare(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    name = m.queue or ""
    if is_reply_queue(name):  # direct reply-to's check (replyto.py), before any other
        reply_declare(s, ch, name, bool(m.nowait))
        return
    if not m.passive:
        s.access.require("declare_queue", name or SERVER_NAMED_PREFIX)
    elif not name:
        name = ch.last_queue
    # through the gateway: in cluster mode decided in etcd, placed on a node, and
    # seen by every node (exclusive and server-named queues stay this node's)
    queue, _created = await s.bridge.gateway.declare_queue(
        ch.core_id, name, durable=bool(m.durable), exclusive=bool(m.exclusive), auto_delete=bool(m.auto_delete),
        arguments=_plain(m.arguments or {}), passive=bool(m.passive),
    )
    ch.last_queue = queue
    if not m.nowait:
        ready, consumers = await s.bridge.gateway.queue_counts(queue)
        s.reply_raw(ch, encode_declare_ok(ch.number, queue, ready, consumers))


def _queue_name(ch: AMQPChannel, name: str | None) -> str:
    return name or ch.last_queue


async def _queue_bind(s: AMQPSession, ch: AMQPChannel, m: Any, unbind: bool = False) -> None:
    queue = _queue_name(ch, m.queue)
    source = exchange_alias(m.exchange or "")
    op = "unbind" if unbind else "bind"
    s.access.require(op, queue, source=source or DEFAULT_EXCHANGE_ALIAS)
    args = _plain(m.arguments or {})
    key = m.routing_key or ""
    await _bind(s, ch, source, queue, key, args, to_exchange=False, unbind=unbind)
    if unbind:
        s.reply(ch, commands.Queue.UnbindOk())
        return
    s.reply(ch, commands.Queue.BindOk(), m.nowait)


async def _queue_unbind(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    await _queue_bind(s, ch, m, unbind=True)


async def _queue_purge(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    queue = _queue_name(ch, m.queue)
    s.access.require("purge", queue)
    count = await s.bridge.run_durable(lambda core: core.purge_queue(queue, channel_id=ch.core_id))
    s.reply(ch, commands.Queue.PurgeOk(message_count=count), m.nowait)


async def _queue_delete(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    queue = _queue_name(ch, m.queue)
    s.access.require("delete_queue", queue)
    if not s.bridge.gateway.queue_exists(queue):
        # RabbitMQ 3.x: deleting a queue that does not exist succeeds with 0.
        s.reply(ch, commands.Queue.DeleteOk(message_count=0), m.nowait)
        return
    count = await s.bridge.gateway.delete_queue(
        ch.core_id, queue, if_unused=bool(m.if_unused), if_empty=bool(m.if_empty))
    s.reply(ch, commands.Queue.DeleteOk(message_count=count), m.nowait)


async def _basic_qos(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    if m.prefetch_size:
        raise AMQPException(NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - prefetch_size!=0 ({m.prefetch_size})")
    prefetch, global_ = m.prefetch_count or 0, bool(m.global_)

    def apply(core: Any) -> None:
        core.qos(ch.core_id, prefetch, global_)
        if not global_:  # RabbitMQ's rule: a per-consumer qos lifts the channel-wide limit
            core.qos(ch.core_id, 0, True)

    s.bridge.run(apply)
    if ch.relayed is not None:  # cluster mode: the owners of relayed consumers too
        await ch.relayed.qos(prefetch, global_)
        if not global_:
            await ch.relayed.qos(0, True)
    s.reply(ch, commands.Basic.QosOk())


async def _basic_consume(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    if m.queue == REPLY_TO:  # direct reply-to (replyto.py): no queue, no permission asked
        await reply_consume(s, ch, m, m.consumer_tag or s.next_tag("amq.ctag-"))
        return
    queue = _queue_name(ch, m.queue)
    s.access.require("consume", queue)
    if s.principal is not None:
        s.principal.check_consumer(s.bridge.core_for_limits())
    tag = m.consumer_tag or s.next_tag("amq.ctag-")
    located = remote_owner(s, ch, queue)
    if located is not None:  # cluster mode: another node's queue, consumed there
        await relay_consume(s, ch, queue, tag, m, located)
        return
    priority = (m.arguments or {}).get("x-priority")
    try:
        s.bridge.now(lambda core: core.consume(ch.core_id, queue, consumer_tag=tag, no_ack=bool(m.no_ack),
                                               exclusive=bool(m.exclusive), priority=priority))
    except ConsumerTagInUse:  # (a consumer of any kind: relayed ones hold their tags in the core too)
        raise reused_tag(tag) from None
    quorum = quorum_of(s, ch)
    if quorum is not None:  # cluster mode: a quorum queue's consumer outlives this node's leadership
        quorum.noted(queue, tag, consume_fields(tag, m))
    # Deliveries leave at the next pump: the consume-ok goes out first.
    if not m.nowait:
        s.reply_raw(ch, encode_consume_ok(ch.number, tag))


async def _basic_cancel(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    if s.views.has_consumer(ch.core_id, m.consumer_tag):
        s.bridge.run(lambda core: core.cancel(ch.core_id, m.consumer_tag))
        if ch.quorum is not None:
            ch.quorum.forget(m.consumer_tag)
    elif ch.relayed is not None and ch.relayed.has_consumer(m.consumer_tag):
        await ch.relayed.cancel(m.consumer_tag)
    else:  # direct reply-to's consumer (replyto.py), or none: cancel-ok either way
        reply_cancel(s, ch, m.consumer_tag)
    if not m.nowait:
        s.reply_raw(ch, encode_cancel_ok(ch.number, m.consumer_tag))


async def _basic_get(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    """The core's get of one message on this channel (``Broker.channel_get``): the
    channel's next delivery tag, unacked (or settled at once with ``no_ack``)."""
    queue = _queue_name(ch, m.queue)
    s.access.require("get", queue)
    located = remote_owner(s, ch, queue)
    if located is not None:  # cluster mode: another node's queue, taken there
        if not await relay_get(s, ch, queue, bool(m.no_ack), located):
            s.reply(ch, commands.Basic.GetEmpty())
        return
    got = s.bridge.run(lambda core: core.channel_get(ch.core_id, queue, no_ack=bool(m.no_ack)))
    if got is None:
        s.reply(ch, commands.Basic.GetEmpty())
        return
    ch.max_tag = got.delivery_tag
    msg = got.message
    props = encode_sent_properties(msg.properties, s.conn.frame_max)
    s.conn.send_raw(
        encode_get_ok(
            ch.number, got.delivery_tag, got.redelivered, msg.exchange, msg.routing_key,
            got.message_count, props, msg.body, s.conn.frame_max,
        )
    )


async def _basic_recover(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    if not m.requeue:
        raise AMQPException(NOT_IMPLEMENTED, "NOT_IMPLEMENTED - requeue=false")
    if ch.relayed is not None and ch.max_tag:  # relayed deliveries: requeued on their owners
        await ch.relayed.settle({"op": "nack", "requeue": True}, ch.max_tag, True)
    tag = s.last_tag(ch)
    if tag:
        s.bridge.now(lambda core: core.nack(ch.core_id, tag, True, True))  # redelivered after recover-ok
    if isinstance(m, commands.Basic.Recover):
        s.reply(ch, commands.Basic.RecoverOk())


async def _basic_ack(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    """An ack on a channel with relayed deliveries (``session.handle_nowait`` takes
    the others): those it names are acked on their owners, the rest here."""
    tag = await settle_relayed(s, ch, {"op": "ack"}, m.delivery_tag, bool(m.multiple))
    if tag is not None:
        s.bridge.now(lambda core: core.ack(ch.core_id, tag, bool(m.multiple)))


async def _basic_nack(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    """A nack, as :func:`_basic_ack`."""
    requeue = bool(m.requeue)
    tag = await settle_relayed(s, ch, {"op": "nack", "requeue": requeue}, m.delivery_tag, bool(m.multiple))
    if tag is not None:
        s.bridge.now(lambda core: core.nack(ch.core_id, tag, bool(m.multiple), requeue))


async def _basic_reject(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    """A reject, as :func:`_basic_ack`."""
    requeue = bool(m.requeue)
    tag = await settle_relayed(s, ch, {"op": "reject", "requeue": requeue}, m.delivery_tag, False)
    if tag is not None:
        s.bridge.now(lambda core: core.reject(ch.core_id, tag, requeue))


async def _confirm_select(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    if ch.tx:
        raise AMQPException(PRECONDITION_FAILED, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
    if not ch.confirm:
        ch.confirm = True
        ch.confirm_offset = ch.published
    s.reply(ch, commands.Confirm.SelectOk(), m.nowait)


async def _tx_select(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    if ch.confirm:
        raise AMQPException(PRECONDITION_FAILED, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
    if not ch.tx:
        s.bridge.run(lambda core: core.tx_select(ch.core_id))
        ch.tx = True
    s.reply(ch, commands.Tx.SelectOk())


async def _tx_commit(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    if not ch.tx:
        raise AMQPException(PRECONDITION_FAILED, "PRECONDITION_FAILED - channel is not transactional")
    await s.bridge.gateway.tx_commit(ch.core_id, ch.relayed)  # (in a cluster: other owners' shares too)
    s.reply(ch, commands.Tx.CommitOk())


async def _tx_rollback(s: AMQPSession, ch: AMQPChannel, m: Any) -> None:
    if not ch.tx:
        raise AMQPException(PRECONDITION_FAILED, "PRECONDITION_FAILED - channel is not transactional")
    s.bridge.run(lambda core: core.tx_rollback(ch.core_id))
    if ch.relayed is not None:  # cluster mode: its settles of relayed deliveries too
        ch.relayed.rollback_held()
    s.reply(ch, commands.Tx.RollbackOk())


HANDLERS: dict[type, Callable[[AMQPSession, AMQPChannel, Any], Any]] = {
    commands.Exchange.Declare: _exchange_declare,
    commands.Exchange.Delete: _exchange_delete,
    commands.Exchange.Bind: _exchange_bind,
    commands.Exchange.Unbind: _exchange_unbind,
    commands.Queue.Declare: _queue_declare,
    commands.Queue.Bind: _queue_bind,
    commands.Queue.Unbind: _queue_unbind,
    commands.Queue.Purge: _queue_purge,
    commands.Queue.Delete: _queue_delete,
    commands.Basic.Qos: _basic_qos,
    commands.Basic.Consume: _basic_consume,
    commands.Basic.Cancel: _basic_cancel,
    commands.Basic.Get: _basic_get,
    commands.Basic.Recover: _basic_recover,
    Ack: _basic_ack,
    Nack: _basic_nack,
    Reject: _basic_reject,
    commands.Basic.RecoverAsync: _basic_recover,
    commands.Confirm.Select: _confirm_select,
    commands.Tx.Select: _tx_select,
    commands.Tx.Commit: _tx_commit,
    commands.Tx.Rollback: _tx_rollback,
}

"""``POST /channel``: one full-duplex HTTP/1.1 exchange carrying an AMQP-style channel.

Rules (docs/protocol.md):

* The response (status 200, chunked NDJSON) starts with ``open`` before the request
  body has ended; from then on every error travels in-band as an ``error`` event,
  because a final status sent mid-upload makes clients such as curl stop sending.
* Operations are applied in order. All complete lines of one received chunk are
  applied before the core's effects are pumped, so the confirms of a chunk's
  publishes leave together (coalesced with ``multiple``) after one fsync.
* An op that has a reply (``ok``, ``consume_ok``, ``cancel_ok``, ``close_ok``) first
  pumps the core, so its reply follows every delivery, return and confirm that the ops
  before it made possible (confirms still waiting for an fsync excepted). A client can
  use any such op as a barrier. ``publish`` and the settling ops (``ack``, ``nack``,
  ``reject``, ``touch``) do not pump: their effects leave with the rest of the chunk.
* One reader task (ops in) and one writer task (events out). The writer batches every
  queued event into one chunk. When the connection is idle, events queued during a
  pump leave at its end instead, in the pumping task's own step
  (:meth:`ChannelSession.flush_nowait`): a delivery goes out in the step of the
  publish that caused it, a confirm in the step of the fsync that released it, without
  waiting a pass of trio's run loop for the writer (nor behind the reader's next
  read). While the outbox holds more than ``OUTBOX_MAX_EVENTS`` events, or more than
  ``OUTBOX_MAX_BYTES`` bytes of events other than deliveries
  (returns carry whole message bodies), the reader stops reading, so a client that
  publishes without reading its confirms is slowed by TCP backpressure instead of
  growing broker memory. Likewise while the publishes still waiting for their confirm
  (their records waiting for the disk) exceed ``UNCONFIRMED_MAX_BYTES``: a publisher
  that outruns fsync is slowed down too. Deliveries are bounded separately by the
  core's per-channel byte credit, which the writer returns as it sends.
* However the exchange ends (``close``, end of the request body, disconnect, channel
  error, broker shutdown) the channel is closed in the core exactly once: unacked
  deliveries go back to their queues and consumers are cancelled. Once the channel is
  ending (``close_ok`` or ``error`` queued) its consumers are cancelled at once and the
  session detaches from the runtime, so no event (a delivery, an ack timeout
  expiring) follows those final events.

Why one module of ~830 lines: the session (outbox, credit, confirms, the reader and
writer tasks) and the op handlers work on the same ``ChannelSession`` state, and the
handlers are the protocol's table; apart, each would reach into the other's privates.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import trio

from broker import __version__
from broker.api.codec import body_from_json, dumps_line, event_json, parse_op_line
from broker.api.permissions import ALLOW_ALL, Access, access_for
from broker.api.rest import DEFAULT_EXCHANGE_ALIAS, exchange_name
from broker.core import (
    BrokerError,
    ChannelError,
    Confirm,
    ConsumerCancelled,
    Deliver,
    InvalidArgument,
    LockBusy,
    NotLockHolder,
    Return,
    check_delay,
    check_json_value,
    check_properties,
    delivery_cost,
)
from broker.http import ClientDisconnected
from broker.runtime import BrokerRuntime

__all__ = ["ChannelSession", "handle_channel"]

log = logging.getLogger("ackbus.channel")

OUTBOX_MAX_EVENTS = 8192
# Bytes of queued non-delivery events (mostly returns, which carry the message) past
# which the reader pauses; the same order as the default delivery credit (1 MiB).
OUTBOX_MAX_BYTES = 1 << 20
# What an event other than a delivery or return is charged against OUTBOX_MAX_BYTES.
EVENT_BYTES = 64
# Bytes of publishes (body + DELIVERY_OVERHEAD_BYTES each) still waiting for their
# confirm past which the reader pauses. Group commit confirms everything appended
# before an fsync, so this only bites when the disk cannot keep up with the network.
UNCONFIRMED_MAX_BYTES = 16 << 20
FLUSH_TIMEOUT_S = 10.0
#: The name a server-named queue's declare is checked against.
SERVER_NAMED_QUEUE = "amq.gen-"
NDJSON_HEADERS = [
    ("content-type", "application/x-ndjson"),
    ("cache-control", "no-cache"),
    ("x-content-type-options", "nosniff"),
]


class _ChannelClosed(Exception):
    """The channel ends normally (close op or end of input): stop reading."""


class ChannelSession:
    """The trio side of one open channel: its outbox, writer and op dispatcher."""

    def __init__(
        self, runtime: BrokerRuntime, channel_id: int, response: Any, access: Access = ALLOW_ALL, principal: Any = None
    ) -> None:
        self.runtime = runtime
        #: What the channel's user may do (docs/security.md), and who it is (None: no
        #: users exist), for the per-user caps.
        self.access = access
        self.principal = principal
        self.core = runtime.core
        self.channel_id = channel_id
        self.response = response
        #: Who and since when, for ``GET /channels`` (``broker/api/rest/channels.py``;
        #: set by ``handle_channel``).
        self.kind = "channel"
        self.remote: str | None = None
        self.user_agent: str | None = None
        self.opened_at = time.time()
        self.outbox: list[Any] = []
        #: Estimated bytes of the non-delivery events in ``outbox``.
        self.outbox_bytes = 0
        self._wakeup = trio.Event()
        # Set when the outbox drained or a confirm arrived: the reader may go on.
        self._room = trio.Event()
        #: (publish tag, charged bytes, perf_counter at publish) of publishes not yet
        #: confirmed, in tag order.
        self.unconfirmed: collections.deque[tuple[int, int, float]] = collections.deque()
        self.unconfirmed_bytes = 0
        self._confirms_settled = trio.Event()
        self.finished = False
        self.closing_reason: str | None = None
        #: Why the user's credentials no longer hold (see :meth:`revoke`): the
        #: channel's last event.
        self.revoked: BrokerError | None = None
        self.closing_event = trio.Event()
        self.reader_scope = trio.CancelScope()
        #: The op being applied (its ``id`` is echoed by an ``error`` it causes).
        self.current_op: dict[str, Any] | None = None
        # Asked the runtime for a flush_nowait (see want_flush).
        self._flush_asked = False
        # A flush_nowait left bytes over: the writer sends them, then grants this credit.
        self._flush_needed = False
        self._held_credit = 0

    # ChannelSink ---------------------------------------------------------

    def push(self, effect: Any) -> None:
        self.outbox.append(effect)
        self._wakeup.set()
        if not self._flush_asked:
            self._flush_asked = True
            self.runtime.want_flush(self)
        kind = type(effect)
        if kind is Deliver:
            return  # bounded by the core's credit
        if kind is Return:
            self.outbox_bytes += delivery_cost(effect.message.body)
        else:
            self.outbox_bytes += EVENT_BYTES
        if kind is Confirm:
            # Confirms come in tag order, so everything up to this tag is settled.
            unconfirmed = self.unconfirmed
            metrics = self.runtime.metrics
            now = time.perf_counter()
            while unconfirmed and unconfirmed[0][0] <= effect.delivery_tag:
                _tag, charge, published_at = unconfirmed.popleft()
                self.unconfirmed_bytes -= charge
                if metrics is not None:
                    metrics.observe_confirm(now - published_at)
            self._room.set()
            if not self._pending_confirms():
                self._confirms_settled.set()
                if self.closing_reason is not None:
                    self.end_if_quiet()

    def closing(self, reason: str) -> None:
        """The broker is shutting down: say so. Operations are still taken, so
        in-flight publishes are confirmed and acks still land, until the client closes
        the channel, or has nothing left to settle (see :meth:`end_if_quiet`), or the
        runtime's drain deadline calls :meth:`shutdown`."""
        if self.closing_reason is None:
            self.closing_reason = reason
            self.send_event({"ev": "closing", "reason": reason})
            self.closing_event.set()
            self.end_if_quiet()

    def end_if_quiet(self) -> None:
        """While the broker shuts down: end the channel once every publish it took is
        confirmed and none of its deliveries is unacked, since nothing the client could
        still send would change anything. Does nothing before ``closing``."""
        if self.closing_reason is None:
            return
        ch = self.core.channels.get(self.channel_id)
        if ch is None or (not ch.deliveries and not len(ch.confirms)):
            self.reader_scope.cancel()

    def shutdown(self) -> None:
        """Stop reading operations; the writer flushes what is queued and the channel ends."""
        self.reader_scope.cancel()

    # Revocable (broker.api.auth) ---------------------------------------

    def revoke(self, error: BrokerError) -> None:
        """The user was deleted or its token revoked: cancel the consumers now (nothing
        more is delivered) and end the channel with ``error`` as its last event; the
        publishes it already took still get their confirms."""
        if self.revoked is not None or self.finished:
            return
        self.revoked = error
        self.stop_consumers()
        self.reader_scope.cancel()

    def recheck(self, access: Access) -> None:
        """The user's permissions changed: cancel each consumer of a queue it may no
        longer read, with a ``cancel`` event that says why (as a broker-side
        ``basic.cancel``); the channel goes on. Its other operations ask at their
        own time."""
        ch = self.core.channels.get(self.channel_id)
        if ch is None or self.revoked is not None or self.finished:
            return
        cancelled = False
        for tag, consumer in list(ch.consumers.items()):
            queue = consumer.queue.name
            if not access.allows("read", queue):
                self.core.cancel(self.channel_id, tag)
                reason = f"read permission on queue {queue!r} was revoked for user {access.username!r}"
                self.push(ConsumerCancelled(self.channel_id, tag, reason))
                cancelled = True
        if cancelled:
            self.runtime.pump()

    # outbox ------------------------------------------------------------

    def send_final(self, event: dict[str, Any]) -> None:
        """Queue the channel's last event (``close_ok`` or ``error``) and detach from
        the runtime: nothing the core still produces for this channel (an ack timeout
        expiring before the channel is closed in the core) may follow it."""
        self.send_event(event)
        self.runtime.remove_sink(self.channel_id)

    def send_event(self, event: dict[str, Any]) -> None:
        self.outbox.append(event)
        self.outbox_bytes += EVENT_BYTES
        self._wakeup.set()
        if not self._flush_asked:
            self._flush_asked = True
            self.runtime.want_flush(self)

    def flush_nowait(self) -> bool:
        """Send the outbox now, in the caller's step, if the connection is idle
        (``Response.send_nowait``); else leave it to the writer. Called by the
        runtime's pump. True if deliveries went out and their credit was granted (the
        core may deliver more)."""
        self._flush_asked = False
        if not self.outbox or not self.response.can_send_nowait():
            return False
        data, credit = self._take_outbox()
        self._room.set()
        if self.response.send_nowait(data):
            # The socket did not take it all: the writer sends the rest, then grants.
            self._flush_needed = True
            self._held_credit += credit
            self._wakeup.set()
            return False
        if credit:
            self.core.grant_credit(self.channel_id, credit)
            return True
        return False

    def stop_consumers(self) -> None:
        """Cancel every consumer of this channel in the core: the channel is ending and
        nothing may be delivered after its last event. Unacked deliveries stay with
        the channel until it is closed in the core (then they are requeued)."""
        ch = self.core.channels.get(self.channel_id)
        if ch is None:
            return
        for tag in list(ch.consumers):
            self.core.cancel(self.channel_id, tag)
        self.runtime.pump()

    async def finish_publishes(self) -> None:
        """The channel ends without a ``close`` op (a channel error, broker shutdown):
        cancel its consumers, then let the publishes it already took get their confirms,
        bounded by ``FLUSH_TIMEOUT_S`` so a failing disk cannot hold it open."""
        self.stop_consumers()
        with trio.move_on_after(FLUSH_TIMEOUT_S):
            await self.flush_confirms()

    def _pending_confirms(self) -> int:
        ch = self.core.channels.get(self.channel_id)
        return len(ch.confirms) if ch is not None else 0

    async def serve_writer(self) -> None:
        """Send queued events, many per chunk, until the session finishes."""
        while True:
            if self._flush_needed:
                self._flush_needed = False
                await self.response.flush()
                credit, self._held_credit = self._held_credit, 0
                self._grant(credit)
                continue
            if not self.outbox:
                if self.finished:
                    return
                self._room.set()
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            data, credit = self._take_outbox()
            await self.response.send(data)
            self._grant(credit)

    def _take_outbox(self) -> tuple[bytes, int]:
        """Empty the outbox into one chunk's bytes; also the delivery credit it uses."""
        batch = self.outbox
        self.outbox = []
        self.outbox_bytes = 0
        parts = []
        credit = 0
        for item in batch:
            if type(item) is dict:
                parts.append(dumps_line(item))
            else:
                parts.append(dumps_line(event_json(item)))
                if type(item) is Deliver:
                    credit += delivery_cost(item.message.body)
        return b"".join(parts), credit

    def _grant(self, credit: int) -> None:
        """Give back the delivery credit of deliveries the socket took."""
        if credit:
            self.core.grant_credit(self.channel_id, credit)
            self.runtime.pump()

    async def wait_outbox_room(self) -> None:
        """Wait while the outbox or the unconfirmed publishes are over their bounds."""
        while (
            len(self.outbox) > OUTBOX_MAX_EVENTS
            or self.outbox_bytes > OUTBOX_MAX_BYTES
            or self.unconfirmed_bytes > UNCONFIRMED_MAX_BYTES
        ):
            self._room = trio.Event()
            await self._room.wait()

    async def flush_confirms(self) -> None:
        """Wait until every publish of this channel has been confirmed."""
        self.runtime.pump()
        while self._pending_confirms():
            self._confirms_settled = trio.Event()
            await self._confirms_settled.wait()

    # reader ------------------------------------------------------------

    async def serve_reader(self, request: Any) -> None:
        """Apply operations from the request body until close, end of body or error.

        Raises: ``BrokerError`` (a channel error: the caller reports it in-band),
        ``ClientDisconnected``.
        """
        # Bytes of an unfinished line. Only the newly received chunk is searched for
        # a newline, so a long line arriving in many pieces costs linear time.
        pending = bytearray()
        max_line = self.runtime.options.max_body_bytes * 2 + 65536
        try:
            async for chunk in request.iter_body(max_bytes=None, timeout_s=None):
                end = chunk.rfind(b"\n")
                if end < 0:
                    pending += chunk
                    if len(pending) > max_line:
                        raise InvalidArgument("operation line too long", code="payload_too_large")
                    continue
                if pending:
                    pending += chunk[:end]
                    block = bytes(pending)
                    pending = bytearray(chunk[end + 1 :])
                else:
                    block = chunk[:end]
                    pending = bytearray(chunk[end + 1 :])
                try:
                    for line in block.split(b"\n"):
                        if line and not line.isspace():
                            op = parse_op_line(line)
                            if op.get("op") == "publish":
                                # apply()'s publish branch without a coroutine per message
                                self.current_op = op
                                self._publish(op)
                                self.current_op = None
                            else:
                                await self.apply(op)
                finally:
                    self.runtime.pump()
                if self.closing_reason is not None:
                    self.end_if_quiet()  # the acks sent in answer to closing may be the last
                await self.wait_outbox_room()
            if pending.strip():
                await self.apply(parse_op_line(bytes(pending)))
                self.runtime.pump()
            # End of input: finish the confirms, then end the channel unless it still
            # consumes (curl piping one consume op keeps receiving).
            await self.flush_confirms()
            ch = self.core.channels.get(self.channel_id)
            if ch is not None and ch.consumers and self.closing_reason is None:
                disconnected = False
                async with trio.open_nursery() as nursery:

                    async def until_closing() -> None:
                        await self.closing_event.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(until_closing)
                    await request.wait_disconnected()
                    disconnected = True
                    nursery.cancel_scope.cancel()
                if disconnected:
                    # Raised outside the nursery, so the caller sees it unwrapped.
                    raise ClientDisconnected("client closed the connection")
            self.stop_consumers()
            self.send_final({"ev": "close_ok"})
        except _ChannelClosed:
            pass

    async def apply(self, op: dict[str, Any]) -> None:
        """Apply one operation. Raises ``BrokerError`` (a channel error)."""
        self.current_op = op
        name = op.get("op")
        if name == "publish":
            self._publish(op)
            self.current_op = None
            return
        handler = _OPS.get(name) if isinstance(name, str) else None
        if handler is None:
            raise ChannelError(f"unknown op {str(name)[:64]!r}", code="unknown_op")
        _check_id(op)
        if handler not in _SETTLE_OPS:
            # Events caused by earlier ops go out before this op's reply (a barrier).
            self.runtime.pump()
        await handler(self, op)

    def _publish(self, op: dict[str, Any]) -> None:
        exchange = op.get("exchange", "")
        routing_key = op.get("routing_key", "")
        if not isinstance(exchange, str) or not isinstance(routing_key, str):
            raise InvalidArgument("exchange and routing_key must be strings")
        self.access.require("publish", exchange or DEFAULT_EXCHANGE_ALIAS)
        body = body_from_json(op)
        if len(body) > self.runtime.options.max_body_bytes:
            raise InvalidArgument(
                f"message body over {self.runtime.options.max_body_bytes} bytes",
                code="payload_too_large",
            )
        properties = check_properties(op.get("properties"))
        mandatory = op.get("mandatory", False)
        if not isinstance(mandatory, bool):
            raise InvalidArgument("mandatory must be true or false")
        delay_s = _delay(op)
        tag, _routed = self.core.publish(
            self.channel_id, exchange_name(exchange), routing_key, body, properties, mandatory=mandatory,
            delay_s=delay_s,
        )
        charge = delivery_cost(body)
        self.unconfirmed.append((tag, charge, time.perf_counter()))
        self.unconfirmed_bytes += charge


def _echo_id(op: dict[str, Any]) -> tuple[bool, Any]:
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


def _check_id(op: dict[str, Any]) -> None:
    """Raises InvalidArgument for an ``id`` that cannot be echoed."""
    if "id" in op:
        check_json_value(op["id"], "id")


def _reply(request: dict[str, Any], ev: str, /, **fields: Any) -> dict[str, Any]:
    """The reply event ``ev`` to the op ``request`` (echoing its ``id``). Positional-only
    parameters: replies carry a field named ``op``."""
    event: dict[str, Any] = {"ev": ev}
    echo, op_id = _echo_id(request)
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


async def _op_consume(s: ChannelSession, op: dict[str, Any]) -> None:
    timeout_ms = _get(op, "ack_timeout_ms", (int, float), None)
    queue = _get(op, "queue", str, None) or ""
    s.access.require("consume", queue)
    if s.principal is not None:
        s.principal.check_consumer(s.core)
    tag = s.core.consume(
        s.channel_id,
        queue,
        consumer_tag=_get(op, "consumer_tag", str, ""),
        prefetch=_get(op, "prefetch", int, None),
        no_ack=_get(op, "no_ack", bool, False),
        exclusive=_get(op, "exclusive", bool, False),
        ack_timeout_s=timeout_ms / 1000.0 if timeout_ms is not None else None,
    )
    s.send_event(_reply(op, "consume_ok", consumer_tag=tag, active=s.core.consumer_active(s.channel_id, tag)))


async def _op_cancel(s: ChannelSession, op: dict[str, Any]) -> None:
    tag = _get(op, "consumer_tag", str, None)
    if tag is None:
        raise InvalidArgument("field consumer_tag is required")
    ch = s.core.channels.get(s.channel_id)
    # AMQP 0-9-1 basic.cancel: an unknown tag is not an error ("the server MUST ignore
    # it", as RabbitMQ does): the broker may have cancelled the consumer itself (its
    # queue was deleted) while the client's cancel was on its way.
    if ch is not None and tag in ch.consumers:
        s.core.cancel(s.channel_id, tag)
    s.send_event(_reply(op, "cancel_ok", consumer_tag=tag))


async def _op_qos(s: ChannelSession, op: dict[str, Any]) -> None:
    s.core.qos(s.channel_id, _get(op, "prefetch", int, 0), _get(op, "global", bool, False))
    s.send_event(_reply(op, "ok", op="qos"))


async def _op_ack(s: ChannelSession, op: dict[str, Any]) -> None:
    s.core.ack(s.channel_id, _get(op, "delivery_tag", int, None), _get(op, "multiple", bool, False))


def _delay(op: dict[str, Any]) -> float | None:
    value = op.get("delay_s")
    return None if value is None else check_delay(value)


async def _op_nack(s: ChannelSession, op: dict[str, Any]) -> None:
    s.core.nack(
        s.channel_id,
        _get(op, "delivery_tag", int, None),
        _get(op, "multiple", bool, False),
        _get(op, "requeue", bool, True),
        delay_s=_delay(op),
    )


async def _op_reject(s: ChannelSession, op: dict[str, Any]) -> None:
    s.core.reject(
        s.channel_id, _get(op, "delivery_tag", int, None), _get(op, "requeue", bool, True), delay_s=_delay(op)
    )


async def _op_touch(s: ChannelSession, op: dict[str, Any]) -> None:
    s.core.touch(s.channel_id, _get(op, "delivery_tag", int, None))


async def _op_declare_exchange(s: ChannelSession, op: dict[str, Any]) -> None:
    name = _get(op, "exchange", str, None) or ""
    if not _get(op, "passive", bool, False):
        s.access.require_declare("declare_exchange", name or DEFAULT_EXCHANGE_ALIAS, op.get("arguments"))
    exchange, created = s.core.declare_exchange(
        exchange_name(name),
        _get(op, "type", str, "direct"),
        durable=_get(op, "durable", bool, True),
        auto_delete=_get(op, "auto_delete", bool, False),
        internal=_get(op, "internal", bool, False),
        arguments=_get(op, "arguments", dict, {}),
        passive=_get(op, "passive", bool, False),
    )
    if created and exchange.durable:
        await s.runtime.wait_durable()
    s.send_event(_reply(op, "ok", op="declare_exchange", exchange=exchange.name, created=created))


async def _op_delete_exchange(s: ChannelSession, op: dict[str, Any]) -> None:
    name = _get(op, "exchange", str, None) or ""
    s.access.require("delete_exchange", name or DEFAULT_EXCHANGE_ALIAS)
    s.core.delete_exchange(
        exchange_name(name),
        if_unused=_get(op, "if_unused", bool, False),
    )
    await s.runtime.wait_durable()
    s.send_event(_reply(op, "ok", op="delete_exchange"))


async def _op_declare_queue(s: ChannelSession, op: dict[str, Any]) -> None:
    name = _get(op, "queue", str, "")
    if not _get(op, "passive", bool, False):
        # A server-named queue is checked as "amq.gen-" (RabbitMQ names them amq.gen-*).
        s.access.require_declare("declare_queue", name or SERVER_NAMED_QUEUE, op.get("arguments"))
    queue, created = s.core.declare_queue(
        name,
        durable=_get(op, "durable", bool, True),
        exclusive=_get(op, "exclusive", bool, False),
        auto_delete=_get(op, "auto_delete", bool, False),
        arguments=_get(op, "arguments", dict, {}),
        passive=_get(op, "passive", bool, False),
        channel_id=s.channel_id,
    )
    if created and queue.persistent_log:
        await s.runtime.wait_durable()
    s.send_event(
        _reply(
            op,
            "ok",
            op="declare_queue",
            queue=queue.name,
            created=created,
            messages=queue.ready_count(),
            consumers=len(queue.consumers),
        )
    )


async def _op_delete_queue(s: ChannelSession, op: dict[str, Any]) -> None:
    name = _get(op, "queue", str, None) or ""
    s.access.require("delete_queue", name)
    count = s.core.delete_queue(
        name,
        if_unused=_get(op, "if_unused", bool, False),
        if_empty=_get(op, "if_empty", bool, False),
        channel_id=s.channel_id,
    )
    s.runtime.pump()
    await s.runtime.wait_durable()
    s.send_event(_reply(op, "ok", op="delete_queue", messages=count))


async def _op_purge_queue(s: ChannelSession, op: dict[str, Any]) -> None:
    name = _get(op, "queue", str, None) or ""
    s.access.require("purge", name)
    count = s.core.purge_queue(name, channel_id=s.channel_id)
    s.send_event(_reply(op, "ok", op="purge_queue", messages=count))


async def _op_tx_select(s: ChannelSession, op: dict[str, Any]) -> None:
    s.core.tx_select(s.channel_id)
    s.send_event(_reply(op, "ok", op="tx_select"))


async def _op_tx_commit(s: ChannelSession, op: dict[str, Any]) -> None:
    """Apply the transaction in one step; answer once it is on disk (its publishes'
    confirms come first)."""
    count = s.core.tx_commit(s.channel_id)
    s.runtime.pump()
    await s.runtime.wait_durable()
    s.send_event(_reply(op, "ok", op="tx_commit", operations=count))


async def _op_tx_rollback(s: ChannelSession, op: dict[str, Any]) -> None:
    count = s.core.tx_rollback(s.channel_id)
    s.send_event(_reply(op, "ok", op="tx_rollback", operations=count))


def _binding(op: dict[str, Any]) -> tuple[str, str, str, dict[str, Any], bool]:
    source = exchange_name(_get(op, "exchange", str, None) or "")
    queue = _get(op, "queue", str, None)
    to_exchange = _get(op, "to_exchange", str, None)
    if (queue is None) == (to_exchange is None):
        raise InvalidArgument("give exactly one of queue and to_exchange")
    dest = queue if queue is not None else exchange_name(to_exchange)
    return source, dest, _get(op, "routing_key", str, ""), _get(op, "arguments", dict, {}), to_exchange is not None


def _authorize_binding(s: ChannelSession, operation: str, source: str, dest: str, to_exchange: bool) -> None:
    """Write on the destination, read on the source (exchanges by their path names)."""
    s.access.require(
        operation, (dest or DEFAULT_EXCHANGE_ALIAS) if to_exchange else dest, source=source or DEFAULT_EXCHANGE_ALIAS
    )


async def _op_bind(s: ChannelSession, op: dict[str, Any]) -> None:
    source, dest, key, args, to_x = _binding(op)
    _authorize_binding(s, "bind", source, dest, to_x)
    s.core.bind(source, dest, key, args, to_exchange=to_x, channel_id=s.channel_id)
    await s.runtime.wait_durable()
    s.send_event(_reply(op, "ok", op="bind"))


async def _op_unbind(s: ChannelSession, op: dict[str, Any]) -> None:
    source, dest, key, args, to_x = _binding(op)
    _authorize_binding(s, "unbind", source, dest, to_x)
    s.core.unbind(source, dest, key, args, to_exchange=to_x, channel_id=s.channel_id)
    await s.runtime.wait_durable()
    s.send_event(_reply(op, "ok", op="unbind"))


def _refused(op: dict[str, Any], exc: LockBusy | NotLockHolder) -> dict[str, Any]:
    """A ``refused`` event: the op was declined, the channel goes on."""
    return _reply(op, "refused", op=op.get("op"), error=exc.code, message=exc.message, lock=exc.info)


async def _op_lock_acquire(s: ChannelSession, op: dict[str, Any]) -> None:
    """Acquire a lock: ``ok`` at once, or once it is granted after waiting in line
    (other ops go on meanwhile; the answer echoes the op's ``id``), or ``refused``."""
    echo, op_id = _echo_id(op)
    name = _get(op, "lock", str, None) or ""
    s.access.require("lock", name)
    try:
        info, _waiter = s.core.lock_acquire(
            s.channel_id, name, op.get("owner"), op.get("ttl_s", 30),
            op.get("wait_s", 0), ref={"id": op_id} if echo else {},
        )
    except LockBusy as exc:
        s.send_event(_refused(op, exc))
        return
    if info is not None:
        await s.runtime.wait_durable()
        s.send_event(_reply(op, "ok", op="lock_acquire", lock=info))


async def _op_lock_refresh(s: ChannelSession, op: dict[str, Any]) -> None:
    s.access.require("lock", _get(op, "lock", str, None) or "")
    try:
        info = s.core.lock_refresh(
            _get(op, "lock", str, None) or "", op.get("owner"), op.get("token"), op.get("ttl_s")
        )
    except NotLockHolder as exc:
        s.send_event(_refused(op, exc))
        return
    await s.runtime.wait_durable()
    s.send_event(_reply(op, "ok", op="lock_refresh", lock=info))


async def _op_lock_release(s: ChannelSession, op: dict[str, Any]) -> None:
    s.access.require("lock", _get(op, "lock", str, None) or "")
    try:
        info = s.core.lock_release(_get(op, "lock", str, None) or "", op.get("owner"), op.get("token"))
    except NotLockHolder as exc:
        s.send_event(_refused(op, exc))
        return
    s.runtime.pump()
    await s.runtime.wait_durable()
    s.send_event(_reply(op, "ok", op="lock_release", lock=info))


async def _op_lock_info(s: ChannelSession, op: dict[str, Any]) -> None:
    s.send_event(_reply(op, "ok", op="lock_info", lock=s.core.lock_info(_get(op, "lock", str, None) or "")))


async def _op_close(s: ChannelSession, op: dict[str, Any]) -> None:
    s.runtime.pump()
    await s.flush_confirms()
    s.stop_consumers()
    s.send_final(_reply(op, "close_ok"))
    raise _ChannelClosed()


_OPS = {
    "consume": _op_consume,
    "cancel": _op_cancel,
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
_SETTLE_OPS = {_op_ack, _op_nack, _op_reject, _op_touch}


async def handle_channel(runtime: BrokerRuntime, request: Any, response: Any) -> None:
    """Serve one channel for the lifetime of this HTTP exchange."""
    runtime.check_ready()
    runtime.check_channel_room()
    core = runtime.core
    principal = request.principal
    channel_id = core.open_channel()
    try:
        if principal is not None:
            principal.open_channel(channel_id)  # raises past max_channels_per_user
    except BaseException:
        core.close_channel(channel_id, "refused")
        raise
    session = ChannelSession(runtime, channel_id, response, access_for(request), principal)
    session.remote, session.user_agent = request.remote, request.headers.get("user-agent")
    if principal is not None:
        principal.open_session(session)  # ended at once if its credentials are revoked
    runtime.add_sink(channel_id, session)
    log.info("channel opened", extra={"fields": {"channel": channel_id}})
    reason = "channel closed"
    disconnected = False
    try:
        await response.start(200, headers=NDJSON_HEADERS)
        session.send_event({"ev": "open", "channel": channel_id, "server": f"ackbus/{__version__}"})
        async with trio.open_nursery() as nursery:

            async def write() -> None:
                nonlocal disconnected
                try:
                    await session.serve_writer()
                except ClientDisconnected:
                    disconnected = True
                    nursery.cancel_scope.cancel()

            nursery.start_soon(write)
            try:
                with session.reader_scope:
                    await session.serve_reader(request)
                if session.reader_scope.cancelled_caught and session.revoked is not None:
                    reason = f"channel error: {session.revoked.code}"
                    await session.finish_publishes()
                    session.send_final({**session.revoked.to_json(), "ev": "error"})
                elif session.reader_scope.cancelled_caught:  # broker shutdown or an operator's close
                    reason = session.closing_reason or "broker shut down"
                    await session.finish_publishes()
            except ClientDisconnected:
                disconnected = True
                nursery.cancel_scope.cancel()
            except BrokerError as exc:
                reason = f"channel error: {exc.code}"
                # Publishes before the failing op still get their confirms.
                await session.finish_publishes()
                event = exc.to_json()
                event["ev"] = "error"
                failed = session.current_op
                if failed is not None:
                    echo, op_id = _echo_id(failed)
                    if echo:
                        event["id"] = op_id
                session.send_final(event)
            finally:
                session.finished = True
                session._wakeup.set()
                # A client that stopped reading cannot hold the channel open forever.
                nursery.cancel_scope.deadline = trio.current_time() + FLUSH_TIMEOUT_S
        if disconnected:
            reason = "client disconnected"
        else:
            await response.end()
    except ClientDisconnected:
        reason = "client disconnected"
    finally:
        if principal is not None:
            principal.close_channel(channel_id)
            principal.close_session(session)
        runtime.remove_sink(channel_id)
        core.close_channel(channel_id, reason)
        if core.coord.waiters or core.coord.grants:
            core.lock_forget_channel(channel_id)  # its waiting lock acquires leave the line
        runtime.pump()
        log.info("channel closed", extra={"fields": {"channel": channel_id, "reason": reason}})

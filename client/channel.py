"""A channel that survives its connection: publishing with confirms, declaring,
consuming, and reconnecting.

A :class:`Channel` is the logical channel the caller holds; underneath it runs a
sequence of :class:`~client.session.ChannelSession` s, one at a time. Theory of
operation:

- A supervisor task (:meth:`Channel._serve`) opens a session, *recovers* it, serves it
  until it ends, and starts over after a backoff delay (:mod:`client.backoff`) — until
  the channel is closed, or the reconnect policy gives up and the channel *fails*.
- Recovery, on every new session: replay the recorded declarations
  (:mod:`client.topology`) and wait for their ``ok``; re-establish every active
  consumer with its old consumer tag; then, in one synchronous step, renumber every
  pending publish from tag 1, write them all in their original order, and mark the
  session *ready*. A publish accepted while no session is ready stays in the pending
  buffer and goes out in that step, so the order on the wire is always the publish
  order, and nothing is sent twice on one session.
- Resent publishes carry the ``message_id`` they were first sent with; the broker
  deduplicates by it, so a message whose ack was lost in the drop is not enqueued a
  second time.
- Events are handled synchronously by :meth:`Channel._on_event`, in order, from the
  session's reader task. Confirms settle the pending buffer (:mod:`client.publisher`),
  deliveries go to their consumer (:mod:`client.consumer`), replies wake their caller.
- An ``error`` event means the broker closes that session. If it names a publish (by
  ``id`` = message id), that publish fails with :class:`PublishRefused` and is not
  resent; if it names a request (integer ids), that request raises
  :class:`ChannelClosedByBroker`. Either way the channel reopens. An error without an
  ``id`` is blamed on the oldest unanswered request, if any; after
  ``MAX_UNATTRIBUTED_ERRORS`` such errors in a row with no confirm in between the
  channel fails rather than resend into the same error forever. An error while
  replaying a declaration is fatal for the same reason.
- A failed channel fails every pending publish and every waiter with
  :class:`ConnectionLost`; a closed one with :class:`ClientClosed`.

Why a module of ~750 lines: it is the channel's whole public API (publishing,
declarations, consuming, settling, closing), each a thin method over the session and
the pending-publish tracker; the reconnect supervisor lives in ``client.supervisor``.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel

from .backoff import Backoff
from .codec import (
    Event,
    Ok,
    Properties,
    encode_publish,
)
from .consumer import YIELD_EVERY, Message, MessageStream, check_delay
from .endpoint import Endpoint, StreamOpener
from .errors import (
    ChannelClosedByBroker,
    ClientClosed,
    ClientError,
    ConfirmTimeout,
    ConnectionLost,
    SomePublishesFailed,
)
from .publisher import PendingPublish, PublishTracker
from .session import ChannelSession, SessionEnded
from .settings import Settings
from .supervisor import State, Supervisor
from .topology import Topology

__all__ = ["Channel", "ChannelStatistics", "QueueDeclared"]

Body = bytes | str
PropertiesLike = Properties | Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class ChannelStatistics:
    """A snapshot of a channel's counters (see :meth:`Channel.statistics`)."""

    state: State
    #: A session is up and recovered right now.
    connected: bool
    #: Channel sessions opened (the first one and every reconnect).
    sessions_opened: int
    #: Times the channel was recovered on a new session after losing one.
    reconnects: int
    pending_publishes: int
    pending_bytes: int
    published: int
    confirmed: int
    failed: int
    #: Publishes written again on a new session after a reconnect.
    resent: int
    consumers: int
    #: Deliveries of the current session not yet settled.
    unacked_deliveries: int


@dataclass(frozen=True, slots=True)
class QueueDeclared:
    """The broker's answer to a queue declaration."""

    queue: str
    messages: int
    consumers: int


class Channel(Supervisor):
    """A channel: publish with confirms, declare, consume; reconnects by itself.

    Open one with ``async with conn.channel() as ch``. All methods must be called from
    the event loop (trio or asyncio) the channel lives in. Raises, for every operation once it applies:
    :class:`ClientClosed` after the channel was closed, :class:`ConnectionLost` after
    its reconnect policy gave up.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        opener: StreamOpener,
        settings: Settings,
        *,
        consuming_stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        self._endpoint = endpoint
        self._opener = opener
        self._settings = settings
        self._connection_stopped_consuming = consuming_stopped
        self._tracker = PublishTracker(
            max_pending=settings.max_pending, max_pending_bytes=settings.max_pending_bytes
        )
        self._topology = Topology()
        self._consumers: dict[str, MessageStream] = {}
        self._session: ChannelSession | None = None
        self._generation = 0
        #: the session generation on which the broker made this channel transactional
        #: (``transaction()``), and whether a transaction block is open
        self._tx_generation: int | None = None
        self._tx_open = False
        self._state: State = "opening"
        self._failure: ClientError | None = None
        self._backoff = Backoff(settings.reconnect)
        self._stop_reconnecting = False
        self._stopped_consuming = False
        self._scope = anyio.CancelScope()
        self._changed = anyio.Event()
        self._id_prefix = secrets.token_hex(8)
        self._message_ids = 0
        self._last_properties: Properties | None = None
        self._last_properties_json: dict[str, Any] = {}
        self._request_ids = 0
        self._consumer_tags = 0
        self._seq = 0
        self._published = 0
        self._resent = 0
        self._reconnects = 0
        self._sessions_opened = 0
        self._unattributed_errors = 0

    # --- public: state ----------------------------------------------------------------

    @property
    def state(self) -> State:
        """``opening``, ``open``, ``closing``, ``closed`` or ``failed``."""
        return self._state

    @property
    def connected(self) -> bool:
        """A session is live and ready right now."""
        session = self._session
        return session is not None and session.ready and session.alive

    def statistics(self) -> ChannelStatistics:
        session = self._session
        return ChannelStatistics(
            state=self._state,
            connected=self.connected,
            sessions_opened=self._sessions_opened,
            reconnects=self._reconnects,
            pending_publishes=len(self._tracker),
            pending_bytes=self._tracker.pending_bytes,
            published=self._published,
            confirmed=self._tracker.confirmed,
            failed=self._tracker.failed,
            resent=self._resent,
            consumers=len(self._consumers),
            unacked_deliveries=len(session.deliveries) if session is not None else 0,
        )

    # --- public: publishing -----------------------------------------------------------

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        body: Body,
        *,
        properties: PropertiesLike = None,
        mandatory: bool = False,
        timeout_s: float | None = None,
        delay_s: float | None = None,
    ) -> str:
        """Publish one message and wait for the broker's confirm; return its message id.
        With ``delay_s`` the message enters its queues only that many seconds later
        (durably: the confirm covers the delay too).

        Waits first for room in the pending buffer (backpressure), then for the confirm,
        across reconnects: after a drop the message is resent with the same message id.
        ``timeout_s`` (default: the channel's ``publish_timeout_s``) bounds both waits.
        ``properties`` may be a :class:`Properties` or a mapping of its fields; a
        ``message_id`` is generated when absent. A ``str`` body is sent as UTF-8.

        Raises:
            PublishNacked: the broker nacked it (e.g. no such exchange, queue full).
            PublishReturned: ``mandatory`` and unroutable.
            PublishRefused: the broker closed the channel over it (e.g. a body over its
                size limit, a routing key over 255 bytes).
            ConfirmTimeout: ``timeout_s`` passed (see its ``enqueued``).
            ConnectionLost, ClientClosed: the channel failed or was closed first.
        """
        if self._tx_open:
            raise ClientError("inside a transaction use start_publish: its confirm comes at the commit")
        if timeout_s is None:
            timeout_s = self._settings.publish_timeout_s
        handle = self._prepare(exchange, routing_key, body, properties, mandatory, delay_s)
        if timeout_s is None:
            # No cancel scope without a timeout: entering and leaving one costs about
            # as much as preparing the publish.
            return await self._enqueue_and_wait(handle)
        with anyio.move_on_after(timeout_s):
            return await self._enqueue_and_wait(handle)
        raise ConfirmTimeout(
            f"publish {handle.message_id!r} not confirmed within {timeout_s} s",
            message_id=handle.message_id,
            enqueued=handle.seq != 0,
        )

    async def start_publish(
        self,
        exchange: str,
        routing_key: str,
        body: Body,
        *,
        properties: PropertiesLike = None,
        mandatory: bool = False,
        delay_s: float | None = None,
    ) -> PendingPublish:
        """Publish without waiting for the confirm: wait only for room in the pending
        buffer, then return the :class:`PendingPublish` handle (``await handle`` for the
        confirm). Many publishes stay in flight; see :meth:`wait_for_confirms`.
        ``delay_s`` as for :meth:`publish`.

        Raises:
            ConnectionLost, ClientClosed: the channel failed or was closed first.
        """
        handle = self._prepare(exchange, routing_key, body, properties, mandatory, delay_s)
        waited = not self._tracker.has_room(handle.size)
        await self._tracker.wait_for_room(handle.size)
        self._check_usable()
        self._enqueue(handle, direct=not waited)
        if not self._published % YIELD_EVERY:
            # A schedule point every few publishes, not every one: a trio scheduling
            # round costs as much as preparing a publish, and the writer sends
            # whatever has queued meanwhile in one chunk anyway. wait_for_room()
            # above still blocks (and yields) whenever the window is full.
            await anyio.lowlevel.cancel_shielded_checkpoint()
        return handle

    def publish_nowait(
        self,
        exchange: str,
        routing_key: str,
        body: Body,
        *,
        properties: PropertiesLike = None,
        mandatory: bool = False,
        delay_s: float | None = None,
    ) -> PendingPublish:
        """Like :meth:`start_publish`, but never waits.

        Raises:
            anyio.WouldBlock: the pending buffer is full (nothing was sent).
            ConnectionLost, ClientClosed: the channel failed or was closed.
        """
        handle = self._prepare(exchange, routing_key, body, properties, mandatory, delay_s)
        if not self._tracker.has_room(handle.size):
            raise anyio.WouldBlock
        self._enqueue(handle, direct=True)
        return handle

    async def wait_for_confirms(self, *, timeout_s: float | None = None) -> None:
        """Wait until every publish made so far on this channel is settled.

        Raises:
            SomePublishesFailed: some of them failed and nobody has seen it yet (by
                awaiting their handle); the failures are in ``.failures`` and count as
                seen afterwards.
            ConfirmTimeout: ``timeout_s`` passed first (the publishes stay pending).
            ConnectionLost, ClientClosed: the channel failed or was closed first.
        """
        up_to = self._seq
        with anyio.move_on_after(math.inf if timeout_s is None else timeout_s) as scope:
            await self._tracker.wait_settled(up_to)
        if scope.cancelled_caught:
            raise ConfirmTimeout(f"{len(self._tracker)} publish(es) unconfirmed after {timeout_s} s")
        if self._state == "failed":
            raise self._error()
        failures = self._tracker.take_unobserved_failures(up_to)
        if failures:
            raise SomePublishesFailed(failures)

    # --- public: declarations ---------------------------------------------------------

    async def declare_exchange(
        self,
        exchange: str,
        type: str = "direct",
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
        passive: bool = False,
    ) -> None:
        """Declare an exchange (idempotent if equal); re-declared after reconnects
        unless ``passive``.

        Raises:
            ChannelClosedByBroker: the broker refused (e.g. exists with other arguments).
        """
        await self._declare({
            "op": "declare_exchange", "exchange": exchange, "type": type, "durable": durable,
            "auto_delete": auto_delete, "internal": internal,
            "arguments": dict(arguments or {}), "passive": passive,
        })

    async def declare_queue(
        self,
        queue: str,
        *,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
        passive: bool = False,
        dead_letter_exchange: str | None = None,
        dead_letter_routing_key: str | None = None,
        delivery_limit: int | None = None,
        message_ttl_s: float | None = None,
        expires_s: float | None = None,
        max_priority: int | None = None,
    ) -> QueueDeclared:
        """Declare a queue; re-declared after reconnects unless ``passive``. An empty
        name asks the broker for a generated one, which is then re-declared by name.

        The keyword helpers set the queue arguments of the same name (docs/failures.md):
        ``dead_letter_exchange`` (``x-dead-letter-exchange``; ``""`` is the default
        exchange), ``dead_letter_routing_key``, ``delivery_limit``, ``message_ttl_s``
        and ``expires_s`` (``x-message-ttl`` and ``x-expires``, in seconds here), and
        ``max_priority`` (``x-max-priority``: a priority queue, 1..255).

        Raises:
            ChannelClosedByBroker: the broker refused.
        """
        args = dict(arguments or {})
        for name, value in (
            ("x-dead-letter-exchange", dead_letter_exchange),
            ("x-dead-letter-routing-key", dead_letter_routing_key),
            ("x-delivery-limit", delivery_limit),
            ("x-message-ttl", None if message_ttl_s is None else round(message_ttl_s * 1000)),
            ("x-expires", None if expires_s is None else round(expires_s * 1000)),
            ("x-max-priority", max_priority),
        ):
            if value is not None:
                args[name] = value
        op = {
            "op": "declare_queue", "queue": queue, "durable": durable, "exclusive": exclusive,
            "auto_delete": auto_delete, "arguments": args, "passive": passive,
        }
        reply = await self._request(op)
        fields = reply.fields if isinstance(reply, Ok) else {}
        name = str(fields.get("queue", queue))
        self._topology.record({**op, "queue": name})
        return QueueDeclared(name, int(fields.get("messages", 0)), int(fields.get("consumers", 0)))

    async def bind_queue(
        self, queue: str, exchange: str, routing_key: str = "", *,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Bind ``queue`` to ``exchange``; re-bound after reconnects.

        Raises:
            ChannelClosedByBroker: the broker refused (e.g. no such queue).
        """
        await self._declare({"op": "bind", "exchange": exchange, "queue": queue,
                             "routing_key": routing_key, "arguments": dict(arguments or {})})

    async def unbind_queue(
        self, queue: str, exchange: str, routing_key: str = "", *,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Remove a queue binding. Raises: ChannelClosedByBroker."""
        await self._declare({"op": "unbind", "exchange": exchange, "queue": queue,
                             "routing_key": routing_key, "arguments": dict(arguments or {})})

    async def bind_exchange(
        self, destination: str, source: str, routing_key: str = "", *,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Bind exchange ``destination`` to ``source``; re-bound after reconnects.
        Raises: ChannelClosedByBroker."""
        await self._declare({"op": "bind", "exchange": source, "to_exchange": destination,
                             "routing_key": routing_key, "arguments": dict(arguments or {})})

    async def unbind_exchange(
        self, destination: str, source: str, routing_key: str = "", *,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Remove an exchange-to-exchange binding. Raises: ChannelClosedByBroker."""
        await self._declare({"op": "unbind", "exchange": source, "to_exchange": destination,
                             "routing_key": routing_key, "arguments": dict(arguments or {})})

    async def delete_exchange(self, exchange: str, *, if_unused: bool = False) -> None:
        """Delete an exchange (and stop re-declaring it). Raises: ChannelClosedByBroker."""
        await self._declare({"op": "delete_exchange", "exchange": exchange, "if_unused": if_unused})

    async def delete_queue(
        self, queue: str, *, if_unused: bool = False, if_empty: bool = False
    ) -> int:
        """Delete a queue (and stop re-declaring it); return how many messages it held.
        Raises: ChannelClosedByBroker."""
        op = {"op": "delete_queue", "queue": queue, "if_unused": if_unused, "if_empty": if_empty}
        reply = await self._request(op)
        self._topology.record(op)
        return int(reply.fields.get("messages", 0)) if isinstance(reply, Ok) else 0

    async def purge_queue(self, queue: str) -> int:
        """Remove every ready message of a queue; return how many.
        Raises: ChannelClosedByBroker."""
        reply = await self._request({"op": "purge_queue", "queue": queue})
        return int(reply.fields.get("messages", 0)) if isinstance(reply, Ok) else 0

    async def _declare(self, op: dict[str, Any]) -> None:
        await self._request(op)
        self._topology.record(op)

    # --- public: consuming ------------------------------------------------------------

    @asynccontextmanager
    async def consume(
        self,
        queue: str,
        *,
        prefetch: int = 100,
        consumer_tag: str | None = None,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Mapping[str, Any] | None = None,
        ack_timeout_s: float | None = None,
    ) -> AsyncIterator[MessageStream]:
        """Consume ``queue``: ``async with ch.consume(q) as messages: async for msg in
        messages: ...``. At most ``prefetch`` deliveries are unacked at a time (0: no
        limit). The consumer is re-established after every reconnect. Leaving the block
        cancels the consumer and requeues the messages it received but did not yield.
        ``ack_timeout_s`` overrides the broker's consumer ack timeout: a delivery not
        acked (or :meth:`~client.Message.touch`-ed) within it goes back to the queue.

        Raises:
            ChannelClosedByBroker: the broker refused the consumer (e.g. no such queue).
            ValueError: a negative ``prefetch`` or a non-positive ``ack_timeout_s``.
        """
        if prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        if ack_timeout_s is not None and not ack_timeout_s > 0:
            raise ValueError("ack_timeout_s must be > 0")
        self._check_usable()
        if consumer_tag is None:
            self._consumer_tags += 1
            consumer_tag = f"ctag-{self._id_prefix}-{self._consumer_tags}"
        if consumer_tag in self._consumers:
            raise ValueError(f"consumer tag {consumer_tag!r} already in use on this channel")
        stream = MessageStream(
            queue, consumer_tag, prefetch=prefetch, no_ack=no_ack, exclusive=exclusive,
            arguments=dict(arguments) if arguments else None, ack_timeout_s=ack_timeout_s,
        )
        if self._stopped_consuming or self._connection_stopped_consuming():
            stream.stop()
        else:
            self._consumers[consumer_tag] = stream
            try:
                await self._start_consumer(stream)
            except BaseException:
                self._consumers.pop(consumer_tag, None)
                raise
        try:
            yield stream
        finally:
            await self._close_consumer(stream)

    def stop_consuming(self) -> None:
        """Stop every consumer of this channel (and any started later): each sends
        ``cancel``, requeues what it buffered, and its iteration ends at the next
        message. Messages already yielded stay the caller's to settle."""
        self._stopped_consuming = True
        for stream in list(self._consumers.values()):
            self._stop_consumer(stream)

    async def _start_consumer(self, stream: MessageStream) -> None:
        while True:
            session = await self._wait_ready()
            if stream.consumed_generation == session.generation:
                return  # recovery of this session established it already
            if not stream.active:
                return
            stream.consumed_generation = session.generation
            reply = session.request(stream.consume_op(), self._next_request_id())
            try:
                with anyio.fail_after(self._settings.request_timeout_s):
                    await reply.wait()
                return
            except SessionEnded:
                continue  # the next session's recovery re-consumes it
            except TimeoutError:
                raise ConnectionLost(f"no consume_ok for {stream.queue!r}") from None

    def _stop_consumer(self, stream: MessageStream) -> None:
        if stream.stopped:
            return
        stream.stop()
        session = self._session
        if (
            session is not None
            and session.alive
            and stream.consumed_generation == session.generation
            and self._consumers.get(stream.consumer_tag) is stream
        ):
            stream.cancel_reply = session.request(
                {"op": "cancel", "consumer_tag": stream.consumer_tag}, self._next_request_id()
            )
        for message in stream.take_buffer():
            if not message.settled:
                self._settle(message, "nack", True)

    async def _close_consumer(self, stream: MessageStream) -> None:
        try:
            self._stop_consumer(stream)
            reply = stream.cancel_reply
            if reply is not None and self._state not in ("closed", "failed"):
                with anyio.move_on_after(self._settings.request_timeout_s):
                    try:
                        await reply.wait()
                    except (SessionEnded, ChannelClosedByBroker):
                        pass
        finally:
            if self._consumers.get(stream.consumer_tag) is stream:
                del self._consumers[stream.consumer_tag]

    # --- message settling (called by Message) -----------------------------------------

    def _delivering_session(self, message: Message) -> ChannelSession | None:
        """The live session that delivered ``message`` and still holds it unsettled,
        else None (reconnected since, or the delivery expired)."""
        session = self._session
        if (
            session is None
            or session.generation != message.generation
            or not session.alive
            or message.delivery_tag not in session.deliveries
        ):
            return None
        return session

    def _settle(self, message: Message, op: str, requeue: bool, delay_s: float | None = None) -> bool:
        self._check_not_transactional(op)
        message._mark_settled()
        session = self._delivering_session(message)
        if session is None:
            return False
        del session.deliveries[message.delivery_tag]
        # Settling ops are never written directly (client/session.py): nobody waits on
        # them, and a consumer settles in bursts that the writer coalesces.
        if op == "ack":
            session.send_ack(message.delivery_tag)
        else:
            settle: dict[str, Any] = {"op": op, "delivery_tag": message.delivery_tag, "requeue": requeue}
            if delay_s:
                settle["delay_s"] = delay_s
            session.send_op(settle, direct=False)
        return True

    def _touch(self, message: Message) -> bool:
        session = self._delivering_session(message)
        if session is None:
            return False
        session.send_op({"op": "touch", "delivery_tag": message.delivery_tag}, direct=False)
        return True

    # --- closing ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close gracefully: stop the consumers, wait (up to ``close_timeout_s``) for
        pending confirms — reconnecting meanwhile if needed — then close the session.
        Publishes still unconfirmed then fail with :class:`ClientClosed`."""
        if self._state in ("closed", "failed", "closing"):
            if self._state != "closing":
                self.abort()
            return
        self._state = "closing"
        self._pulse()
        self._tracker.close(lambda: ClientClosed("the channel is closing"))
        try:
            self.stop_consuming()
            with anyio.move_on_after(self._settings.close_timeout_s):
                await self._tracker.wait_settled(self._seq)
            self._stop_reconnecting = True
            session = self._session
            if session is not None and session.alive:
                session.send_op({"op": "close"})
                session.finish_nowait()
                with anyio.move_on_after(min(5.0, self._settings.request_timeout_s)):
                    await session.ended.wait()
        finally:
            self.abort()

    def abort(self) -> None:
        """Close at once: drop the session without waiting; every unconfirmed publish
        fails with :class:`ClientClosed` (the broker may or may not have taken it);
        unacked deliveries go back to their queues on the broker."""
        if self._state in ("closed", "failed"):
            self._scope.cancel()
            return
        self._state = "closed"
        self._shut_down(lambda: ClientClosed("the channel was closed"))

    def _shut_down(self, make_error: Callable[[], ClientError]) -> None:
        self._stop_reconnecting = True
        self._tracker.fail_all(make_error)
        self._tracker.close(make_error)
        for stream in self._consumers.values():
            stream.end(make_error)
        session = self._session
        if session is not None:
            session.abort()
        self._scope.cancel()
        self._pulse()

    def _fail(self, message: str, cause: BaseException | None) -> None:
        if self._state in ("closed", "failed"):
            return
        failure = ConnectionLost(message)
        failure.__cause__ = cause
        self._failure = failure
        self._state = "failed"
        self._shut_down(self._error)

    def _error(self) -> ClientError:
        """A fresh exception saying why the channel cannot be used."""
        if self._state == "failed" and self._failure is not None:
            error = ConnectionLost(str(self._failure))
            error.__cause__ = self._failure.__cause__
            return error
        if self._state in ("closed", "closing"):
            return ClientClosed(f"the channel is {self._state}")
        return ConnectionLost("the channel is not open")

    def _check_usable(self) -> None:
        if self._state not in ("opening", "open"):
            raise self._error()

    # --- internals: publishing --------------------------------------------------------

    def _prepare(
        self,
        exchange: str,
        routing_key: str,
        body: Body,
        properties: PropertiesLike,
        mandatory: bool,
        delay_s: float | None = None,
    ) -> PendingPublish:
        self._check_usable()
        self._check_not_transactional("publish")
        check_delay(True, delay_s)
        if isinstance(body, str):
            body = body.encode("utf-8")
        if properties is not None and properties is self._last_properties:
            props_json = dict(self._last_properties_json)
            props = properties
        else:
            props = Properties.coerce(properties)
            props_json = props.to_json()
            if props.headers is None and isinstance(properties, Properties):
                # The same (immutable) Properties object passed again, as in a
                # publishing loop, need not be validated and converted again.
                self._last_properties, self._last_properties_json = properties, dict(props_json)
        message_id = props.message_id
        if message_id is None:
            self._message_ids += 1
            message_id = props_json["message_id"] = f"{self._id_prefix}-{self._message_ids}"
        line = encode_publish(
            exchange=exchange, routing_key=routing_key, body=body, properties=props_json,
            mandatory=mandatory, op_id=message_id, delay_s=delay_s,
        )
        return PendingPublish(message_id, 0, line)

    async def _enqueue_and_wait(self, handle: PendingPublish) -> str:
        waited = not self._tracker.has_room(handle.size)
        await self._tracker.wait_for_room(handle.size)
        self._check_usable()
        self._enqueue(handle, direct=not waited)
        return await handle.wait()

    def _enqueue(self, handle: PendingPublish, *, direct: bool) -> None:
        """Track and send a publish. ``direct``: it may be written at once (it did not
        wait for room in a full window, see below)."""
        self._seq += 1
        handle.seq = self._seq
        self._tracker.add(handle)
        self._published += 1
        session = self._session
        if session is not None and session.ready and not session.draining:
            # Written at once only when no other publish is unconfirmed (Nagle's rule,
            # client/session.py): a publishing loop's ops are coalesced instead. Nor
            # when it had to wait for room: a loop that filled its window gets it back
            # all at once when one fsync confirms the lot, and the first publish of
            # the refill sent alone would cost the broker an fsync of its own (window
            # 64: 21.8k -> 18.4k msg/s).
            session.send_nowait(handle.line, direct=direct and len(self._tracker) == 1)

    # --- internals: requests ----------------------------------------------------------

    def _next_request_id(self) -> int:
        # Requests use integer ids; publishes use their (string) message id, so an
        # ``error`` event's id says unambiguously which of the two it is about.
        self._request_ids += 1
        return self._request_ids

    async def _wait_ready(self) -> ChannelSession:
        while True:
            self._check_usable()
            session = self._session
            if session is not None and session.ready and session.alive and not session.draining:
                return session
            await self._changed.wait()

    async def _request(self, op: dict[str, Any]) -> Event:
        """Send ``op`` on a ready session and return its reply event; if the session
        ends first, send it again on the next one (declarations are idempotent).

        Raises:
            ChannelClosedByBroker: the broker answered ``error``.
            ConnectionLost: no reply within ``request_timeout_s``.
        """
        try:
            with anyio.fail_after(self._settings.request_timeout_s):
                while True:
                    session = await self._wait_ready()
                    reply = session.request(op, self._next_request_id())
                    try:
                        event: Event = await reply.wait()
                        return event
                    except SessionEnded:
                        continue
        except TimeoutError:
            raise ConnectionLost(
                f"no reply to {op.get('op')!r} within {self._settings.request_timeout_s} s"
            ) from None

    # --- transactions -------------------------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """A transaction (the channel protocol's ``tx_*``): the publishes
        (``start_publish``) and acks, nacks and rejects made in the block take effect
        together when it ends - in one write to the broker's log, all or nothing after
        a crash - or not at all if it raises (rolled back: the publishes fail with
        ``PublishNacked``, the deliveries stay unacked).

        Inside the block use ``start_publish`` (its confirm comes at the commit;
        ``publish`` would wait for it and raises instead). A channel used for a
        transaction stays transactional (as in AMQP): publish and settle on it only
        inside ``transaction()`` blocks. If the connection drops during the block,
        nothing of it was applied: its publishes fail with ``ConnectionLost`` (they are
        not resent) and leaving the block raises ``ConnectionLost``.

        Raises:
            ConnectionLost: the connection dropped during the transaction.
            ChannelClosedByBroker: the broker refused the commit (e.g. a settled
                delivery expired meanwhile); nothing of it was applied.
            ClientError: transactions do not nest.
        """
        if self._tx_open:
            raise ClientError("transactions do not nest")
        await self.wait_for_confirms()  # the broker starts a transaction from a clean slate
        session = await self._wait_ready()
        if self._tx_generation != session.generation:
            await self._tx_request(session, {"op": "tx_select"})
            self._tx_generation = session.generation
        self._tx_open = True
        try:
            yield
        except BaseException:
            self._tx_open = False
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._settings.request_timeout_s):
                if session.alive and self._tx_generation == session.generation:
                    try:
                        await self._tx_request(session, {"op": "tx_rollback"})
                    except ClientError:
                        pass  # (the session is gone: the broker discarded the transaction)
            raise
        self._tx_open = False
        if not session.alive or self._tx_generation != session.generation:
            raise ConnectionLost("the connection dropped during the transaction: none of it was applied")
        await self._tx_request(session, {"op": "tx_commit"})

    async def _tx_request(self, session: ChannelSession, op: dict[str, Any]) -> Event:
        """``op`` on ``session`` only: a transaction does not survive its session."""
        try:
            with anyio.fail_after(self._settings.request_timeout_s):
                event: Event = await session.request(op, self._next_request_id()).wait()
                return event
        except (SessionEnded, TimeoutError):
            raise ConnectionLost(
                f"no reply to {op['op']!r}: the connection dropped during the transaction"
            ) from None

    def _lose_transaction(self) -> None:
        """The session ended: a transaction on it is gone (the broker discarded it), so
        its publishes must fail, not be resent outside of it."""
        if self._tx_generation is not None:
            self._tx_generation = None
            self._tracker.fail_all(
                lambda: ConnectionLost("the connection dropped during the transaction: none of it was applied")
            )

    def _check_not_transactional(self, what: str) -> None:
        session = self._session
        if (
            not self._tx_open
            and self._tx_generation is not None
            and session is not None
            and session.generation == self._tx_generation
        ):
            raise ClientError(f"this channel is transactional: {what} inside `async with ch.transaction()`")

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

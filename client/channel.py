"""A channel that survives its connection: publishing with confirms, declaring,
consuming, and reconnecting.

A :class:`Channel` is the logical channel the caller holds, and the one public face of
a few parts that each own their state (each is handed its collaborators when the
channel builds it):

- :class:`~client.status.ChannelStatus`: the state (``opening`` ... ``failed``), why it
  failed, the current session (a :class:`~client.session.SessionLink`, one
  ``POST /channel`` exchange on its own connection).
- :class:`~client.supervisor.Supervisor`: opens a session, *recovers* it, serves it
  until it ends, and starts over after a backoff delay (:mod:`client.backoff`) —
  until the channel is closed, or the reconnect policy gives up and the channel
  *fails*. Recovery, on every new session: replay the recorded declarations
  (:class:`~client.topology.Topology`) and wait for their ``ok``; re-establish every
  active consumer with its old consumer tag; then, in one synchronous step, renumber
  every pending publish from tag 1, write them all in their original order, and mark
  the session *ready*. A publish accepted while no session is ready stays in the
  pending window and goes out in that step, so the order on the wire is always the
  publish order, and nothing is sent twice on one session.
- :class:`~client.publishing.Publisher` over the pending window
  (:class:`~client.publisher.PublishTracker`): encodes a publish, admits it, writes it.
  Resent publishes carry the ``message_id`` they were first sent with; the broker
  deduplicates by it, so a message whose ack was lost in the drop is not enqueued a
  second time.
- :class:`~client.events.EventDispatcher`: applies the session's events synchronously,
  in order, from its reader task: confirms settle the pending window, deliveries go to
  their consumer, replies wake their caller. An ``error`` event closes the session and
  fails the publish or request it names (see :mod:`client.events`); the channel
  reopens.
- :class:`~client.consumer_registry.ConsumerRegistry` (the consumers and their
  deliveries), :class:`~client.settling.DeliverySettler` (a message's ack, nack,
  reject, touch), :class:`~client.requester.Requester` (requests and their replies),
  :class:`~client.transactions.Transactions`.

A failed channel fails every pending publish and every waiter with
:class:`ConnectionLost`; a closed one with :class:`ClientClosed`. Closing is the
channel's own job, since it involves every part.

Why a module of ~540 lines: it is the channel's whole public API with its docstrings
(the reference docs/client.md points to); each method is a few lines over the parts.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from .codec import Ok
from .consumer import MessageStream
from .consumer_registry import ConsumerRegistry
from .endpoint import Endpoint, StreamOpener
from .errors import ClientClosed, ClientError, ConfirmTimeout
from .events import EventDispatcher
from .failover import NodeSteering
from .publisher import PendingPublish, PublishTracker
from .publishing import Body, PropertiesLike, Publisher
from .requester import Requester
from .settings import Settings
from .settling import DeliverySettler
from .status import ChannelStatus, State
from .supervisor import Supervisor
from .topology import Topology
from .transactions import Transactions

__all__ = ["Channel", "ChannelStatistics", "QueueDeclared"]


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



class Channel:
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
        self._settings = settings
        id_prefix = secrets.token_hex(8)
        timeout_s = settings.request_timeout_s
        self._status = status = ChannelStatus()
        self._tracker = tracker = PublishTracker(
            max_pending=settings.max_pending, max_pending_bytes=settings.max_pending_bytes
        )
        self._topology = Topology()
        self._requests = requests = Requester(status, timeout_s=timeout_s)
        self._transactions = transactions = Transactions(status, requests, tracker, timeout_s=timeout_s)
        self._consumers = consumers = ConsumerRegistry(
            status, requests, DeliverySettler(status, transactions),
            tag_prefix=f"ctag-{id_prefix}", timeout_s=timeout_s, connection_stopped=consuming_stopped,
        )
        self._publisher = publisher = Publisher(status, tracker, transactions, id_prefix=id_prefix)
        self._supervisor = Supervisor(
            endpoint, opener, settings,
            status=status, requests=requests, topology=self._topology, consumers=consumers,
            publisher=publisher, transactions=transactions,
            events=EventDispatcher(tracker, consumers, NodeSteering(opener)), give_up=self._fail,
        )
        # bound once: the per-publish path (see client.publishing)
        self._prepare = publisher.prepare
        self._start = publisher.start
        self._start_and_wait = publisher.start_and_wait
        self._start_nowait = publisher.start_nowait
        self._request = requests.request
        #: Run by the connection: the supervisor, in the connection's nursery.
        self._serve = self._supervisor.serve
        #: Awaited by the connection before it hands the channel out.
        self._wait_opened = status.wait_opened

    # --- public: state ----------------------------------------------------------------

    @property
    def state(self) -> State:
        """``opening``, ``open``, ``closing``, ``closed`` or ``failed``."""
        return self._status.state

    @property
    def connected(self) -> bool:
        """A session is live and ready right now."""
        return self._status.connected

    def statistics(self) -> ChannelStatistics:
        session = self._status.session
        supervisor = self._supervisor
        tracker = self._tracker
        return ChannelStatistics(
            state=self._status.state,
            connected=self._status.connected,
            sessions_opened=supervisor.sessions_opened,
            reconnects=supervisor.reconnects,
            pending_publishes=len(tracker),
            pending_bytes=tracker.pending_bytes,
            published=self._publisher.published,
            confirmed=tracker.confirmed,
            failed=tracker.failed,
            resent=supervisor.resent,
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
        if self._transactions.open:
            raise ClientError("inside a transaction use start_publish: its confirm comes at the commit")
        if timeout_s is None:
            timeout_s = self._settings.publish_timeout_s
        handle = self._prepare(exchange, routing_key, body, properties, mandatory, delay_s)
        if timeout_s is None:
            # No cancel scope without a timeout: entering and leaving one costs about
            # as much as preparing the publish.
            return await self._start_and_wait(handle)
        with anyio.move_on_after(timeout_s):
            return await self._start_and_wait(handle)
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
        await self._start(handle)
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
        self._start_nowait(handle)
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
        await self._publisher.wait_for_confirms(timeout_s)

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
        ``max_priority`` (``x-max-priority``: a priority queue, 0..255; 0 is one level, first in first out).

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
        stream = await self._consumers.start(
            queue, prefetch=prefetch, consumer_tag=consumer_tag, no_ack=no_ack, exclusive=exclusive,
            arguments=dict(arguments) if arguments else None, ack_timeout_s=ack_timeout_s,
        )
        try:
            yield stream
        finally:
            await self._consumers.close(stream)

    def stop_consuming(self) -> None:
        """Stop every consumer of this channel (and any started later): each sends
        ``cancel``, requeues what it buffered, and its iteration ends at the next
        message. Messages already yielded stay the caller's to settle."""
        self._consumers.stop_all()

    # --- closing ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close gracefully: stop the consumers, wait (up to ``close_timeout_s``) for
        pending confirms — reconnecting meanwhile if needed — then close the session.
        Publishes still unconfirmed then fail with :class:`ClientClosed`."""
        status = self._status
        if status.state in ("closed", "failed", "closing"):
            if status.state != "closing":
                self.abort()
            return
        status.state = "closing"
        status.pulse()
        self._tracker.close(lambda: ClientClosed("the channel is closing"))
        try:
            self.stop_consuming()
            with anyio.move_on_after(self._settings.close_timeout_s):
                await self._publisher.wait_settled()
            self._supervisor.stop()
            session = status.session
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
        status = self._status
        if status.state in ("closed", "failed"):
            self._supervisor.cancel()
            return
        status.state = "closed"
        self._shut_down(lambda: ClientClosed("the channel was closed"))

    def _fail(self, message: str, cause: BaseException | None) -> None:
        """Give up (the supervisor's verdict): fail with ConnectionLost(``message``)."""
        if self._status.fail(message, cause):
            self._shut_down(self._status.error)

    def _shut_down(self, make_error: Callable[[], ClientError]) -> None:
        """Fail everything still waiting with ``make_error()`` and stop serving."""
        self._supervisor.cancel()
        self._tracker.fail_all(make_error)
        self._tracker.close(make_error)
        self._consumers.end_all(make_error)
        session = self._status.session
        if session is not None:
            session.abort()
        self._status.pulse()

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
        self._transactions.check_not_nested()
        await self.wait_for_confirms()  # the broker starts a transaction from a clean slate
        async with self._transactions.block():
            yield

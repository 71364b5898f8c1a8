"""One channel's state and its event writer (``POST /channel``; the rules are in
``broker.api.channel``).

:class:`ServedChannel` is the runtime's sink for the channel: the core's events
(deliveries, confirms, returns, cancels) arrive through :meth:`ServedChannel.push`,
replies and final events through :meth:`ServedChannel.send_event`; the outbox leaves
either in the pumping task's own step (:meth:`ServedChannel.flush_nowait`) or through
the writer task (:meth:`ServedChannel.serve_writer`), many events per chunk. It also
holds the bounds that slow down a client which does not read its events or outruns
the disk (``OUTBOX_MAX_*``, ``UNCONFIRMED_MAX_BYTES``).
"""

from __future__ import annotations

import time
from typing import Any

import trio

from broker.api.channel.outbox import encode_outbox
from broker.api.channel.relayed import RelayedConsumers
from broker.api.permissions import ALLOW_ALL, Access
from broker.core import (
    Broker,
    Confirm,
    ConsumerCancelled,
    Deliver,
    ErrorReply,
    Return,
    delivery_cost,
)
from broker.http import Response
from broker.runtime import BrokerRuntime, CommandGateway, FlowControl

__all__ = [
    "EVENT_BYTES",
    "FEATURES",
    "FLUSH_TIMEOUT_S",
    "OUTBOX_MAX_BYTES",
    "OUTBOX_MAX_EVENTS",
    "UNCONFIRMED_MAX_BYTES",
    "ServedChannel",
]

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
#: The channel features a client may ask for in its request head
#: (``Ackbus-Features: batches``: ``deliveries`` events and ``ack`` ops with
#: ``delivery_tags``), announced back in ``open``.
FEATURES = frozenset({"batches"})


class ServedChannel:
    """The trio side of one open channel: its state, outbox and event writer (the
    ops it applies are ``broker.api.channel.ops``, read by ``reader.serve_reader``)."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        channel_id: int,
        response: Response,
        access: Access = ALLOW_ALL,
        principal: Any = None,
        gateway: CommandGateway | None = None,
    ) -> None:
        self.runtime = runtime
        #: The one door to the core: ops run their commands through ``batch`` (whose
        #: effects the reader carries out once per received chunk), the session's own
        #: bookkeeping through ``gateway``; ``views`` answers its questions.
        self.gateway = gateway if gateway is not None else CommandGateway(runtime)
        self.batch = self.gateway.batch()
        #: The channel's publish and acks for the compiled per-chunk path (``chunk.py``).
        self.channel_ops = self.gateway.channel_ops(channel_id)
        self.views = self.gateway.views
        #: What the channel's user may do (docs/security.md), and who it is (None: no
        #: users exist), for the per-user caps.
        self.access = access
        self.principal = principal
        self.channel_id = channel_id
        self.response = response
        #: Who and since when, for ``GET /channels`` (``broker/api/rest/channels.py``;
        #: set by ``handle_channel``).
        self.kind = "channel"
        self.remote: str | None = None
        self.user_agent: str | None = None
        #: Another node's channel (a relay): its consumers of a quorum queue are
        #: cancelled when this node stops leading it, for that node to resume.
        self.forwarded = False
        #: A node's forwarding channel (the cluster secret): its publishes were checked
        #: at their entry node, or are stored messages (dead letters): their
        #: ``user_id`` is not the channel's user's (``broker/api/userid.py``), and
        #: headers stored before AMQP's limits were checked still pass.
        self.entry_checked = False
        self.opened_at = time.time()
        self.outbox: list[Any] = []
        #: Estimated bytes of the non-delivery events in ``outbox``.
        self.outbox_bytes = 0
        self._wakeup = trio.Event()
        # Set when the outbox drained or a confirm arrived: the reader may go on.
        self._room = trio.Event()
        self._confirms_settled = trio.Event()
        self.finished = False
        self.closing_reason: str | None = None
        #: Why the user's credentials no longer hold (see :meth:`revoke`): the
        #: channel's last event.
        self.revoked: ErrorReply | None = None
        self.closing_event = trio.Event()
        self.reader_scope = trio.CancelScope()
        #: The op being applied (its ``id`` is echoed by an ``error`` it causes).
        self.current_op: dict[str, Any] | None = None
        #: When this channel's publishes began waiting for blocked publishing to
        #: resume (trio time; reset when it resumes): see ``reader.publish_when_allowed``.
        self.blocked_since: float | None = None
        # Asked the runtime for a flush_nowait (see want_flush).
        self._flush_asked = False
        # A flush_nowait left bytes over: the writer sends them, then grants this credit.
        self._flush_needed = False
        self._held_credit = 0
        #: The client understands ``deliveries`` events (many deliveries in one line).
        self.batch_deliveries = False
        #: The nursery the channel's own tasks run in (set by ``handle_channel``).
        self.tasks: trio.Nursery | None = None
        #: Cluster mode: its consumers of queues other nodes own (``relayed.py``),
        #: and of quorum queues whose leader is lost (its ``local``: those here).
        self.relayed: RelayedConsumers | None = None

    def relayed_consumers(self) -> RelayedConsumers | None:
        """The channel's relayed consumers (made on first use); None on a single node."""
        cluster = self.runtime.cluster
        if self.relayed is None and cluster is not None and self.tasks is not None:
            self.relayed = RelayedConsumers(
                self.channel_id, self.gateway, self.send_event, lambda: self.finished, self.tasks, cluster,
                self.principal,
            )
        return self.relayed

    # ChannelSink ---------------------------------------------------------

    def push(self, effect: Any) -> None:
        kind = type(effect)
        if kind is ConsumerCancelled and self.relayed is not None and self.relayed.local.cancelled(
            effect.consumer_tag, effect.reason
        ):
            return  # its quorum queue's leader stepped down: it goes on from the next one
        self.outbox.append(effect)
        self._wakeup.set()
        if not self._flush_asked:
            self._flush_asked = True
            self.runtime.want_flush(self)
        if kind is Deliver:
            return  # bounded by the core's credit
        if kind is Return:
            self.outbox_bytes += delivery_cost(effect.message.body)
        else:
            self.outbox_bytes += EVENT_BYTES
        if kind is Confirm:
            # The runtime's book of pending publishes has settled it (and everything
            # before it): the reader may have room again.
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
        if self.views.channel_settled(self.channel_id):
            self.reader_scope.cancel()

    def finish(self) -> None:
        """No more events will be queued: the writer sends what is left and ends."""
        self.finished = True
        self._wakeup.set()

    def shutdown(self) -> None:
        """Stop reading operations; the writer flushes what is queued and the channel ends."""
        self.reader_scope.cancel()

    def flow_changed(self, flow: FlowControl) -> None:
        """Publishing was blocked or resumed (``runtime.flow``): tell the client with a
        ``flow`` event (``active`` false: publishes wait, then are refused)."""
        if not flow.blocked:
            self.blocked_since = None
        if self.finished or self.revoked is not None:
            return
        event: dict[str, Any] = {"ev": "flow", "active": not flow.blocked}
        if flow.blocked:
            event["reason"] = flow.reason
        self.send_event(event)

    # Revocable (broker.api.auth) ---------------------------------------

    def revoke(self, error: ErrorReply) -> None:
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
        if self.revoked is not None or self.finished:
            return
        channel_id = self.channel_id
        refused = [
            (tag, queue) for tag, queue in self.views.consumer_queues(channel_id) if not access.allows("read", queue)
        ]
        if not refused:
            return

        def cancel(core: Broker) -> None:
            for tag, _queue in refused:
                core.cancel(channel_id, tag)

        self.batch.run(cancel)
        for tag, queue in refused:
            reason = f"read permission on queue {queue!r} was revoked for user {access.username!r}"
            self.push(ConsumerCancelled(channel_id, tag, reason))
        self.batch.flush()

    # outbox ------------------------------------------------------------

    def send_final(self, event: dict[str, Any]) -> None:
        """Queue the channel's last event (``close_ok`` or ``error``) and detach from
        the runtime: nothing the core still produces for this channel (an ack timeout
        expiring before the channel is closed in the core) may follow it."""
        self.send_event(event)
        self.gateway.detach(self.channel_id)

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
            # Called by the pump: the credit's effects are the pump's to carry out.
            channel_id = self.channel_id
            self.batch.run(lambda core: core.grant_credit(channel_id, credit))
            return True
        return False

    def stop_consumers(self) -> None:
        """Cancel every consumer of this channel in the core: the channel is ending and
        nothing may be delivered after its last event. Unacked deliveries stay with
        the channel until it is closed in the core (then they are requeued)."""
        channel_id = self.channel_id
        tags = self.views.consumer_tags(channel_id)
        if self.relayed is not None:
            self.relayed.close_all()

        def cancel_all(core: Broker) -> None:
            for tag in tags:
                core.cancel(channel_id, tag)
            core.reply_cancel(channel_id, None)  # (direct reply-to's: no reply follows either)

        self.gateway.run(cancel_all)

    async def finish_publishes(self) -> None:
        """The channel ends without a ``close`` op (a channel error, broker shutdown):
        cancel its consumers, then let the publishes it already took get their confirms,
        bounded by ``FLUSH_TIMEOUT_S`` so a failing disk cannot hold it open."""
        self.stop_consumers()
        with trio.move_on_after(FLUSH_TIMEOUT_S):
            await self.flush_confirms()

    def _pending_confirms(self) -> int:
        return self.views.pending_confirms(self.channel_id)

    @property
    def unconfirmed_bytes(self) -> int:
        """Bytes of this channel's publishes still waiting for their confirm (each
        charged ``delivery_cost`` of its body; the runtime's one book keeps them)."""
        return self.runtime.confirms.unconfirmed_bytes(self.channel_id)

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
        """Empty the outbox into one chunk's bytes; also the delivery credit it uses
        (``outbox.encode_outbox``, compiled in the compiled build)."""
        batch = self.outbox
        self.outbox = []
        self.outbox_bytes = 0
        return encode_outbox(batch, self.batch_deliveries)

    def _grant(self, credit: int) -> None:
        """Give back the delivery credit of deliveries the socket took."""
        if credit:
            channel_id = self.channel_id
            self.gateway.run(lambda core: core.grant_credit(channel_id, credit))

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
        self.gateway.flush()
        while self._pending_confirms():
            self._confirms_settled = trio.Event()
            await self._confirms_settled.wait()

"""Cluster mode: a channel's consumer of a queue another node owns.

``consume`` on such a queue opens a channel of its own to the owner (``PeerStream``,
authenticated with the cluster secret; the permission was checked here) and consumes
there; the owner's deliveries are passed on to this channel with delivery tags of
this channel (the core numbers them with its own: ``reserve_delivery_tag``), and the
client's ``ack``, ``nack``, ``reject`` and ``touch`` of those tags go back to the owner
with the owner's tags. ``cancel`` and the end of the channel close that channel to
the owner, which requeues what it delivered and was not acked, as for any channel.

When the owner is down, ``consume`` fails with the channel error
``queue_unavailable``; when it dies while consumed from, the consumer gets a
``cancel`` event whose reason starts with ``queue_unavailable`` (the channel stays
open; consume again once the node is back). A consumer of a quorum queue goes on
from the queue's next leader instead (``relay_resume.py``), as does the channel's
own one when this node stops leading the queue (:meth:`RelayedConsumers.resume`). A
``multiple`` settle whose tag is a
relayed delivery settles the relayed deliveries up to it (on their owners), not this
node's own; one whose tag is this node's settles both.

A relayed consumer is not in this node's core as a consumer, but its tag is: it
holds it in the core's book of the channel's consumer tags (``hold_consumer_tag``,
broker/core/consumertags.py) from its consume until it ends, a wait for its quorum
queue's next leader included, so that a consume of any kind on the channel, on
either front end, finds the tag taken by asking the core alone.

The channel's ``qos`` applies as to a local consumer: the per-consumer default (taken
at ``consume``) is the relayed consumer's prefetch on the owner; the channel-wide
limit is the limit of the owner's channel of that consumer, set at ``consume`` and
changed by every later global ``qos`` (:meth:`RelayedConsumers.qos`).

A change of the user's permissions cancels the relayed consumers of the queues it may
no longer read, as it cancels local ones (:meth:`RelayedConsumers.recheck`: the relays
are registered with the user's principal like a channel); a deleted user's or revoked
token's channel ends, and its relays with it.

``get`` of such a queue (AMQP's ``basic.get``, the channel's ``get`` op) goes over one
more channel to the owner, kept for this channel's gets of that node's queues: the
message taken stays unacked there under the owner's tag until settled through this
channel's tag, like a relayed consumer's delivery.

In a transaction (the channel's ``tx_select``, AMQP's ``tx.select``) the acks, nacks and
rejects of relayed deliveries are held, as the core holds those of local ones, until
``tx_commit`` sends them to their owners or ``tx_rollback`` forgets them
(:meth:`RelayedConsumers.settle` checks and holds them; ``relayed_tx.py`` the rest).

Why one module of ~500 lines: consumes, gets, settles, qos, permission changes and
resumptions all read and write the same maps of relays and delivery tags.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Final

import trio

from broker.api.auth import Principal
from broker.api.channel.relay_resume import LocalQuorumConsumers as Local
from broker.api.channel.relay_resume import Resumption, consume_op_of
from broker.api.channel.relayed_tx import HeldRelayedSettles
from broker.api.permissions import Access
from broker.cluster import PeerStream, PeerUnreachable
from broker.core import ChannelError, ConsumerTagInUse, ErrorReply, Unavailable
from broker.runtime import ClusterPort, CommandGateway

__all__ = ["RelayedConsumers"]

#: How long a consume waits for the owner's answer.
CONSUME_TIMEOUT_S: Final = 10.0
_names = itertools.count(1)
#: The owner's answers to a relayed consume or get.
_ANSWERS: Final = frozenset({"consume_ok", "get_ok", "get_empty", "error"})
#: The settles a transaction holds (``touch`` is never held, as on a local delivery).
_HELD_OPS: Final = frozenset({"ack", "nack", "reject"})


class _Relay:
    """One consumer, relayed from the owner ``owner`` over ``stream``."""

    def __init__(self, owner: str, queue: str, consumer_tag: str, stream: PeerStream) -> None:
        self.owner = owner
        self.queue = queue
        self.consumer_tag = consumer_tag
        self.stream = stream
        self.scope = trio.CancelScope()
        self.answered = trio.Event()
        self.answer: dict[str, Any] | None = None
        #: this channel's delivery tag -> the owner's, in delivery order
        self.tags: dict[int, int] = {}
        self.ended = False
        #: deliveries need no settling: their tags are not remembered
        self.no_ack = False
        #: deliveries that came before the client saw ``consume_ok`` (None: it has)
        self.held: list[dict[str, Any]] | None = []
        #: the owner's channel is transactional (made so by this channel's first
        #: commit with settles for it)
        self.tx_selected = False
        #: set when the owner answers a commit sent to it, or the relay ends
        self.committed: trio.Event | None = None
        #: the owner's answer to that commit (None: the relay ended first)
        self.commit_answer: dict[str, Any] | None = None
        #: why the relay ended
        self.end_reason = ""
        #: what the consume asked of the owner besides the queue and the tag
        self.consume_op: dict[str, Any] = {}


class RelayedConsumers:
    """The relayed consumers of one channel (see the module docstring): its id, its
    gateway, where its events go (``send_event``), whether it has ended
    (``finished()``), the nursery its relays' tasks run in, and its own consumers of
    quorum queues (``local``: those a resumption may consume here again)."""

    def __init__(
        self,
        channel_id: int,
        gateway: CommandGateway,
        send_event: Callable[[dict[str, Any]], None],
        finished: Callable[[], bool],
        nursery: trio.Nursery,
        cluster: ClusterPort,
        principal: Principal | None = None,
        local: Local | None = None,
    ) -> None:
        self.channel_id = channel_id
        self.gateway = gateway
        self.send_event = send_event
        self.finished = finished
        self.nursery = nursery
        self.cluster = cluster
        #: the core's book of the channel's consumer tags, where each of these
        #: consumers holds its tag while it lives (``_by_consumer`` or ``_resuming``):
        #: holding and releasing have no effects to carry out, so this batch is never
        #: flushed (a resumption may begin inside the runtime's pump)
        self._tags = gateway.batch()
        self._by_consumer: dict[str, _Relay] = {}
        #: consumer tag -> a quorum queue's consumer waiting for its next leader
        self._resuming: dict[str, Resumption] = {}
        self._by_tag: dict[int, _Relay] = {}
        #: tags of relays that ended (-> the owner, which requeued them): settling one
        #: is a no-op, except in a transaction, whose commit it refuses (:meth:`_hold`)
        self._gone: dict[int, str] = {}
        #: owner -> the channel this channel's gets of that node's queues go over
        self._getters: dict[str, _Relay] = {}
        #: the channel's user (``broker.api.auth.Principal``; None: no users), whose
        #: permission changes reach these consumers as a local consumer's
        #: (:meth:`recheck`), until the channel ends (:meth:`close_all`)
        self.principal = principal
        if principal is not None:
            principal.open_session(self)
        #: the channel is transactional (it stays so until it ends)
        self._transactional = False
        #: the open transaction's settles of relayed deliveries
        self.held = HeldRelayedSettles(lambda tag: self._by_tag.pop(tag, None), self._end)
        #: the channel's own consumers of quorum queues this node leads (made here
        #: unless the channel keeps them before it has relays: AMQP's)
        self.local = local if local is not None else Local(channel_id, gateway, cluster, self.resume)

    def remote_owner(self, queue: str) -> tuple[str, str | None] | None:
        """(owner, URL or None while down) when ``queue`` is another node's."""
        located = self.cluster.owner_of(queue)
        if located is None or located[0] == self.cluster.node_name:
            return None
        return located

    # ------------------------------------------------------------- consume

    async def consume(self, queue: str, owner: str, url: str | None, op: dict[str, Any]) -> tuple[str, bool]:
        """Consume ``queue`` on its owner: (consumer tag, active). Raises ``Unavailable``
        (``queue_unavailable``) when the owner cannot be reached, and the owner's
        refusal as a ``ChannelError`` with its code."""
        if url is None:
            raise Unavailable(f"queue {queue!r} is on node {owner!r}, which is down; retry later", code="queue_unavailable")
        consumer_tag = op.get("consumer_tag") or self._generated_tag()
        views = self.gateway.views
        self._hold_tag(consumer_tag)
        try:
            # the channel's qos, as a local consume takes it: the per-consumer default
            # as the consumer's prefetch, the channel-wide limit as the owner's
            # channel's (a channel-wide limit bounds each relayed consumer on its own:
            # the owners do not share one), changed there by a later global qos
            info = views.channel_info(self.channel_id) or {}
            remote_op = consume_op_of(op, info.get("default_prefetch"))
            return await self._consume_at(queue, owner, url, consumer_tag, remote_op)
        except BaseException:
            self._release_tag(consumer_tag)  # (unless the relay was made: it ends by itself)
            raise

    def _generated_tag(self) -> str:
        """A consumer tag for a consume that named none: the next free one (a client
        may have chosen one of this form)."""
        while True:
            tag = f"amq.ctag-relayed-{next(_names)}"
            if not self.gateway.views.consumer_tag_taken(self.channel_id, tag):
                return tag

    def _hold_tag(self, consumer_tag: str) -> None:
        """Take ``consumer_tag`` in the core's book of the channel's tags, for a consumer
        the core does not keep. Raises ConsumerTagInUse (a consumer of any kind has
        it), ChannelError (the channel is not open in the core)."""
        channel_id = self.channel_id
        try:
            self._tags.run(lambda core: core.hold_consumer_tag(channel_id, consumer_tag))
        except ConsumerTagInUse:
            raise ConsumerTagInUse(consumer_tag, f"consumer tag {consumer_tag!r} is in use on this channel") from None

    def _release_tag(self, consumer_tag: str) -> None:
        """Give ``consumer_tag`` back unless one of these consumers still has it (a live
        relay, or one waiting for its quorum queue's next leader)."""
        if consumer_tag and consumer_tag not in self._by_consumer and consumer_tag not in self._resuming:
            channel_id = self.channel_id
            self._tags.run(lambda core: core.release_consumer_tag(channel_id, consumer_tag))

    async def _consume_at(
        self, queue: str, owner: str, url: str, consumer_tag: str, remote_op: dict[str, Any],
        made: list[_Relay] | None = None,
    ) -> tuple[str, bool]:
        """Consume ``queue`` as ``consumer_tag`` with ``remote_op`` on ``owner`` (at
        ``url``): a new relay. Raises as :meth:`consume` does."""
        stream = PeerStream(url, origin=self.cluster.node_name, secret=self.cluster.secret, ssl_context=self.cluster.peer_ssl)
        try:
            await stream.connect()
        except PeerUnreachable as exc:
            raise Unavailable(f"queue {queue!r}: its node {owner!r} cannot be reached: {exc}", code="queue_unavailable") from None
        relay = _Relay(owner, queue, consumer_tag, stream)
        relay.no_ack = bool(remote_op.get("no_ack"))
        relay.consume_op = remote_op
        if made is not None:
            made.append(relay)
        info = self.gateway.views.channel_info(self.channel_id) or {}
        self._by_consumer[consumer_tag] = relay
        self.nursery.start_soon(self._serve, relay)
        if info.get("prefetch"):
            try:
                await relay.stream.send({"op": "qos", "prefetch": info["prefetch"], "global": True})
            except PeerUnreachable:
                pass  # the consume below finds it out
        op = {"op": "consume", "queue": queue, "consumer_tag": consumer_tag, "id": "relay", **remote_op}
        answer = await self._ask(relay, op, ("consume_ok",), "consume")
        return consumer_tag, bool(answer.get("active", True))

    async def _ask(self, relay: _Relay, op: dict[str, Any], wanted: tuple[str, ...], what: str) -> dict[str, Any]:
        """Send ``op`` on the relay and wait for its answer, one of ``wanted`` events;
        the relay ends on any other answer (the owner's error is raised as its own)."""
        queue, owner = op["queue"], relay.owner
        try:
            await relay.stream.send(op)
        except PeerUnreachable as exc:
            self._end(relay)
            raise Unavailable(f"queue {queue!r}: its node {owner!r} cannot be reached: {exc}", code="queue_unavailable") from None
        with trio.move_on_after(CONSUME_TIMEOUT_S):
            await relay.answered.wait()
        answer = relay.answer
        if answer is None or answer.get("ev") not in wanted:
            self._end(relay)
            if answer is not None and answer.get("ev") == "error":
                raise ChannelError(str(answer.get("message")), code=str(answer.get("error")))
            raise Unavailable(f"queue {queue!r}: its node {owner!r} did not answer the {what}", code="queue_unavailable")
        return answer

    async def _serve(self, relay: _Relay) -> None:
        """Pass the owner's events on until the relay ends (its stream is closed on
        every way out, the channel's own end included)."""
        try:
            reason = relay.end_reason = await self._pass_events(relay)
            relay.answered.set()
            if not relay.ended:
                self._end(relay)
                if relay.answer is not None and relay.answer.get("ev") == "consume_ok" and not self.finished():
                    if not (relay.consumer_tag and self.cluster.is_replicated(relay.queue)
                            and self.resume(relay.queue, relay.consumer_tag, relay.consume_op, reason)):
                        self.send_event({"ev": "cancel", "consumer_tag": relay.consumer_tag, "reason": reason})
        finally:
            relay.answered.set()
            await relay.stream.aclose()

    def resume(self, queue: str, consumer_tag: str, consume_op: dict[str, Any], reason: str) -> bool:
        """Consumer ``consumer_tag`` of quorum queue ``queue`` lost the queue's leader
        (its relay's owner, or this node) for ``reason``: consume again with
        ``consume_op`` from the next one. False when the channel has ended, or
        another consumer took the tag meanwhile (the client is then told of the
        cancel)."""
        if self.finished():
            return False
        if consumer_tag not in self._by_consumer and consumer_tag not in self._resuming:
            try:
                self._hold_tag(consumer_tag)  # (its relay, or the core's consumer, gave it back)
            except ChannelError:  # taken meanwhile, or the channel is ending
                return False
        resumption = Resumption(queue, consumer_tag, consume_op, reason)
        self._resuming[consumer_tag] = resumption
        self.nursery.start_soon(self._resume, resumption)
        return True

    async def _resume(self, resumption: Resumption) -> None:
        """Consume again from the quorum queue's next leader (``relay_resume.py``), or
        cancel the consumer with a ``cancel`` event when that fails."""
        resumed = await resumption.run(self.cluster.owner_of, self._consume_at, self.finished, self.local)
        tag = resumption.consumer_tag
        if self._resuming.get(tag) is resumption:
            del self._resuming[tag]
            self._release_tag(tag)  # (a relay resumed, or the core's consumer, has it now)
        if resumption.withdrawn:  # cancelled meanwhile, maybe with a consume under way
            for relay in resumption.relays:
                if not relay.ended:
                    self._end(relay)
        elif resumed:
            self.started(tag)
        elif not self.finished():
            self.send_event({"ev": "cancel", "consumer_tag": tag, "reason": resumption.reason})

    async def _pass_events(self, relay: _Relay) -> str:
        """The owner's events, passed on; returns why they ended."""
        reason = f"queue_unavailable: the connection to node {relay.owner!r} was lost"
        with relay.scope:
            try:
                async for ev in relay.stream.events():
                    kind = ev.get("ev")
                    if kind == "deliver":
                        self._deliver(relay, ev)
                    elif kind == "expired":
                        tag = self._local_tag(relay, ev.get("delivery_tag"))
                        if tag is not None:
                            self.send_event({**ev, "delivery_tag": tag})
                    elif kind in _ANSWERS and not relay.answered.is_set():
                        relay.answer = ev
                        relay.answered.set()
                    elif kind == "cancel":
                        return str(ev.get("reason") or "cancelled by the queue's owner")
                    elif kind == "active":
                        self.send_event(ev)
                    elif kind == "ok" and ev.get("op") == "tx_commit" and relay.committed is not None:
                        relay.commit_answer = ev
                        relay.committed.set()
                    elif kind == "error":
                        return f"queue_unavailable: node {relay.owner!r}: {ev.get('message')}"
            except PeerUnreachable:
                pass
        return reason

    # ----------------------------------------------------------------- get

    async def get(self, queue: str, owner: str, url: str | None, no_ack: bool) -> dict[str, Any] | None:
        """Take one message of ``queue`` on its owner: the owner's ``get_ok`` event
        with this channel's delivery tag, or None when the queue is empty. Raises as
        :meth:`consume` does."""
        if url is None:
            raise Unavailable(f"queue {queue!r} is on node {owner!r}, which is down; retry later", code="queue_unavailable")
        relay = self._getters.get(owner)
        if relay is None or relay.ended:
            stream = PeerStream(url, origin=self.cluster.node_name, secret=self.cluster.secret, ssl_context=self.cluster.peer_ssl)
            try:
                await stream.connect()
            except PeerUnreachable as exc:
                raise Unavailable(f"queue {queue!r}: its node {owner!r} cannot be reached: {exc}", code="queue_unavailable") from None
            relay = self._getters[owner] = _Relay(owner, "", "", stream)
            relay.held = None
            self.nursery.start_soon(self._serve, relay)
        relay.answered, relay.answer = trio.Event(), None
        op = {"op": "get", "queue": queue, "no_ack": no_ack, "id": "relay"}
        answer = await self._ask(relay, op, ("get_ok", "get_empty"), "get")
        if answer["ev"] == "get_empty":
            return None
        channel_id = self.channel_id
        tag = self.gateway.run(lambda core: core.reserve_delivery_tag(channel_id))
        if not no_ack:
            relay.tags[tag] = int(answer["delivery_tag"])
            self._by_tag[tag] = relay
        return {k: v for k, v in answer.items() if k not in ("ev", "id")} | {"delivery_tag": tag}

    def started(self, consumer_tag: str) -> None:
        """The client has been sent ``consume_ok``: pass on what came before it."""
        relay = self._by_consumer.get(consumer_tag)
        if relay is not None and relay.held is not None:
            held, relay.held = relay.held, None
            for ev in held:
                self._deliver(relay, ev)

    def _deliver(self, relay: _Relay, ev: dict[str, Any]) -> None:
        if relay.held is not None:
            relay.held.append(ev)
            return
        channel_id = self.channel_id
        tag = self.gateway.run(lambda core: core.reserve_delivery_tag(channel_id))
        if not relay.no_ack:
            relay.tags[tag] = int(ev["delivery_tag"])
            self._by_tag[tag] = relay
        self.send_event({**ev, "delivery_tag": tag})

    @staticmethod
    def _local_tag(relay: _Relay, remote: Any) -> int | None:
        for local, theirs in relay.tags.items():
            if theirs == remote:
                return local
        return None

    def _end(self, relay: _Relay) -> None:
        relay.ended = True
        relay.scope.cancel()
        if relay.committed is not None:
            relay.committed.set()  # (a commit waiting for it fails)
        if relay.consumer_tag:
            if self._by_consumer.get(relay.consumer_tag) is relay:  # (not its resumed successor)
                del self._by_consumer[relay.consumer_tag]
                self._release_tag(relay.consumer_tag)
        elif self._getters.get(relay.owner) is relay:
            del self._getters[relay.owner]
        for tag in relay.tags:
            self._by_tag.pop(tag, None)
            self._gone[tag] = relay.owner

    # --------------------------------------------------------------- settle

    def owns(self, delivery_tag: Any) -> bool:
        """Whether ``delivery_tag`` is a relayed delivery (or was one)."""
        return delivery_tag in self._by_tag or delivery_tag in self._gone

    async def settle(self, op: dict[str, Any], delivery_tag: int, multiple: bool) -> None:
        """Send ``op`` (an ack, nack, reject or touch) for the relayed deliveries it
        names to their owners, with their tags; in a transaction an ack, nack or
        reject is held for the commit instead (:meth:`_hold`)."""
        if op["op"] in _HELD_OPS and self._in_transaction():
            self._hold(op, delivery_tag, multiple)
            return
        targets: list[tuple[_Relay, int]] = []
        if multiple:
            for relay in [*self._by_consumer.values(), *self._getters.values()]:
                mine = [tag for tag in relay.tags if tag <= delivery_tag]
                if mine:
                    targets.append((relay, relay.tags[mine[-1]]))
                    for tag in mine:
                        del relay.tags[tag]
                        self._by_tag.pop(tag, None)
        else:
            relay_or_none = self._by_tag.get(delivery_tag)
            if relay_or_none is None:
                self._gone.pop(delivery_tag, None)
                return  # its relay ended: the owner requeued it
            targets.append((relay_or_none, relay_or_none.tags[delivery_tag]))
            if op["op"] != "touch":
                del relay_or_none.tags[delivery_tag]
                del self._by_tag[delivery_tag]
        for relay, remote_tag in targets:
            try:
                await relay.stream.send({**op, "delivery_tag": remote_tag, **({"multiple": True} if multiple else {})})
            except PeerUnreachable:
                pass  # the relay ends by itself; the owner requeues

    # ---------------------------------------------------------- transactions

    def _in_transaction(self) -> bool:
        if not self._transactional:  # (once transactional, a channel stays so)
            info = self.gateway.views.channel_info(self.channel_id)
            self._transactional = bool(info and info.get("transactional"))
        return self._transactional

    def _hold(self, op: dict[str, Any], delivery_tag: int, multiple: bool) -> None:
        """Hold a transaction's settle of relayed deliveries until the commit. A tag
        already settled in this transaction is an error at once (``unknown_delivery_tag``,
        RabbitMQ's check); one whose relay ended (its owner requeued it) is noted, and
        refuses the commit (a ``multiple`` one reaches the live relays only, as outside
        a transaction)."""
        if multiple:
            for relay in [*self._by_consumer.values(), *self._getters.values()]:
                mine = [tag for tag in relay.tags if tag <= delivery_tag and tag not in self.held.tags]
                if mine:
                    self.held.add(relay, {**op, "delivery_tag": relay.tags[mine[-1]], "multiple": True}, mine)
            return
        if delivery_tag in self.held.tags:
            raise ChannelError(f"unknown delivery tag {delivery_tag}: settled earlier in this transaction",
                               code="unknown_delivery_tag")
        owner_of_tag = self._by_tag.get(delivery_tag)
        if owner_of_tag is None:  # its relay ended: the owner requeued it
            self.held.add_lost(delivery_tag, self._gone.get(delivery_tag, "?"))
            return
        self.held.add(owner_of_tag, {**op, "delivery_tag": owner_of_tag.tags[delivery_tag]}, [delivery_tag])

    def held_count(self) -> int:
        """How many settles of relayed deliveries the open transaction holds."""
        return len(self.held)

    def check_held(self) -> None:
        """Before a commit applies anything (:meth:`HeldRelayedSettles.check`)."""
        self.held.check()

    def rollback_held(self) -> int:
        """The transaction is rolled back: its held settles are forgotten (the
        deliveries stay unacked on their owners); how many there were."""
        return self.held.rollback()

    async def commit_held(self) -> list[str]:
        """The transaction is committed: its held settles go to their owners
        (:meth:`HeldRelayedSettles.commit`); what failed."""
        return await self.held.commit()

    async def qos(self, prefetch: int, global_: bool) -> None:
        """The channel's ``qos`` changed (already applied to its own consumers): a
        channel-wide limit (``global_``) applies at once to each relayed consumer too,
        on its owner's channel; a per-consumer one only to consumers made after it
        (RabbitMQ's rule: :meth:`consume` reads it then), so nothing is sent."""
        if not global_:
            return
        for relay in list(self._by_consumer.values()):
            try:
                await relay.stream.send({"op": "qos", "prefetch": prefetch, "global": True})
            except PeerUnreachable:
                pass  # the relay ends by itself

    def has_consumer(self, consumer_tag: str) -> bool:
        """Whether ``consumer_tag`` names one of these relayed consumers (one waiting
        for its quorum queue's next leader included)."""
        return consumer_tag in self._by_consumer or consumer_tag in self._resuming

    async def cancel(self, consumer_tag: str) -> bool:
        """Cancel a relayed consumer; False when ``consumer_tag`` is not one."""
        resumption = self._resuming.pop(consumer_tag, None)
        if resumption is not None:
            resumption.withdraw()
            self._release_tag(consumer_tag)
            return True
        relay = self._by_consumer.get(consumer_tag)
        if relay is None:
            return False
        self._end(relay)
        return True

    def close_all(self) -> None:
        """The channel ends: every relay ends (the owners requeue what is unacked)."""
        resuming, self._resuming = self._resuming, {}
        for consumer_tag, resumption in resuming.items():
            resumption.withdraw()
            self._release_tag(consumer_tag)
        for relay in [*self._by_consumer.values(), *self._getters.values()]:
            self._end(relay)
        self.rollback_held()  # (an open transaction ends with its channel)
        if self.principal is not None:
            self.principal.close_session(self)
            self.principal = None

    # ------------------------------------------- Revocable (broker.api.auth)

    def revoke(self, error: ErrorReply) -> None:
        """The user's credentials are gone: the channel itself ends (its own
        ``revoke``); the relays end with it, without a ``cancel`` each."""
        self.close_all()

    def recheck(self, access: Access) -> None:
        """The user's permissions changed (on any node: the change reaches every node
        through etcd): cancel each relayed consumer of a queue it may no longer read,
        with a ``cancel`` event that says why, as a local consumer is cancelled (an
        AMQP client that asked for it gets ``basic.cancel``); the owner requeues what
        it delivered unacked. The channel goes on."""
        for consumer_tag, resumption in list(self._resuming.items()):
            if not access.allows("read", resumption.queue):
                del self._resuming[consumer_tag]
                resumption.withdraw()
                self._release_tag(consumer_tag)
                if not self.finished():
                    reason = f"read permission on queue {resumption.queue!r} was revoked for user {access.username!r}"
                    self.send_event({"ev": "cancel", "consumer_tag": consumer_tag, "reason": reason})
        for relay in list(self._by_consumer.values()):
            if relay.ended or access.allows("read", relay.queue):
                continue
            self._end(relay)
            if relay.answer is not None and relay.answer.get("ev") == "consume_ok" and not self.finished():
                reason = f"read permission on queue {relay.queue!r} was revoked for user {access.username!r}"
                self.send_event({"ev": "cancel", "consumer_tag": relay.consumer_tag, "reason": reason})

"""Dead letters across nodes, at least once: :class:`DeadLetterForwarding`.

A queue's dead letters are routed by its owner's core. One that reaches queues other
nodes own (whether or not it also reaches queues of this node) is not let go: the
core holds it (``Broker.hold_dead_letters``, asking :meth:`Forwarder.reaches_other_nodes`
when it also reaches queues here, which get their copy at once): the message stays in
its source queue, unsettled, as a delivery of a core channel of this node's own, and
the runtime hands it here (``DeadLetterHeld``). It is forwarded to each other owner of
a queue it reaches; only once every one of them has confirmed it is it settled in its
source queue (``Broker.settle_held_dead_letter``). An owner that is down or refuses it is asked
again, backing off up to :data:`RETRY_MAX_S`, for as long as this node runs, so a
dead letter waits for its target's node to come back.

What it guarantees: at least once, like a single node. A held dead letter survives
this node's crash (nothing settled it: it is back in its source queue after the
restart, ready, and is dead-lettered again when it fails again: this node's own
dead-letter queues, which had their copy, are not given another within the
deduplication window, ``DeadLetters._copy_here_once``); an owner
that took it but whose confirm was lost gets it again (deduplicated there by its
``message_id``, when it has one). Until settled it counts as unacked in its source queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from broker.cluster.forward import Forwarder
from broker.core import DeadLetterHeld

__all__ = ["DeadLetterForwarding", "RETRY_MIN_S", "RETRY_MAX_S"]

log = logging.getLogger("ackbus.cluster")

#: How soon a dead letter not yet taken is sent again (doubling up to the maximum).
RETRY_MIN_S, RETRY_MAX_S = 0.2, 5.0


class DeadLetterForwarding:
    """Held dead letters of this node, forwarded until taken (see the module
    docstring). ``settle(channel_id, tag)`` settles one in its source queue; ``serve``
    runs the deliveries (each held dead letter is a task of its own)."""

    def __init__(self, forwarder: Forwarder, settle: Callable[[int, int], None]) -> None:
        self.forwarder = forwarder
        self.settle = settle
        self._nursery: trio.Nursery | None = None
        #: held before ``serve`` started (at recovery): delivered once it has
        self._early: list[DeadLetterHeld] = []
        #: dead letters held now, waiting for an owner's confirm
        self.waiting = 0
        #: dead letters taken by another node and settled here
        self.delivered = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            early, self._early = self._early, []
            for held in early:
                nursery.start_soon(self._deliver, held)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def take(self, held: DeadLetterHeld) -> None:
        """The runtime's handler of ``DeadLetterHeld`` (called in its pump: starts the
        delivery and returns). One held before ``serve`` runs waits for it; after it
        ended (shutting down) the dead letter stays held, unsettled: it is back in its
        queue at the next start."""
        self.waiting += 1
        if self._nursery is not None:
            self._nursery.start_soon(self._deliver, held)
        else:
            self._early.append(held)

    async def _deliver(self, held: DeadLetterHeld) -> None:
        """Forward ``held`` to every owner of a queue it reaches, again and again for
        those that did not confirm, until all did; then settle it."""
        taken: set[str] = set()
        delay = RETRY_MIN_S
        warned = False
        forwarder = self.forwarder
        try:
            while True:
                if forwarder.ready:
                    owners, leaderless = forwarder.dead_letter_owners(held.exchange, held.routing_key, held.properties)
                    todo = [o for o in owners if o not in taken]
                    refusals = await self._send(held, todo) if todo else {}
                    taken.update(o for o in todo if o not in refusals)
                    if not refusals and not leaderless:
                        if not owners and not taken and not held.local:
                            log.warning(
                                "dead letter routes to no queue in the cluster: dropped",
                                extra={"fields": {"queue": held.queue, "exchange": held.exchange}},
                            )
                        break
                    if not warned:
                        warned = True
                        why = "; ".join(f"node {o!r}: {r}" for o, r in refusals.items()) or (
                            "no leader for " + ", ".join(repr(q) for q in leaderless)
                        )
                        log.warning(
                            "dead letter not taken yet by the node owning its queue: kept in its source queue, retrying",
                            extra={"fields": {"queue": held.queue, "exchange": held.exchange, "why": why}},
                        )
                await trio.sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)
            self.settle(held.channel_id, held.delivery_tag)
            self.delivered += 1
        finally:
            self.waiting -= 1

    async def _send(self, held: DeadLetterHeld, owners: list[str]) -> dict[str, str]:
        """Forward ``held`` once to each of ``owners``; the refusals, by owner."""
        refusals: dict[str, str] = {}
        answered = trio.Event()
        pending = len(owners)

        def answer(owner: str) -> Callable[[bool, str | None], None]:
            def settle(ack: bool, reason: str | None) -> None:
                nonlocal pending
                if not ack:
                    refusals[owner] = reason or "nacked"
                pending -= 1
                if pending == 0:
                    answered.set()

            return settle

        for owner in owners:
            self.forwarder.send(owner, held.exchange, held.routing_key, held.body, held.properties, None, answer(owner))
        await answered.wait()
        return refusals

    def info(self) -> dict[str, int]:
        return {"waiting": self.waiting, "delivered": self.delivered}

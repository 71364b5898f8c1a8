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

A dead letter that reaches a **quorum queue this node leads** is held the same way
(the core asks :meth:`Forwarder.needs_majority`): its copy there is not made in the
step that could settle the source, but here (``Broker.copy_held_dead_letter``: an
ENQUEUE record the queue's replication holds, as it holds a publish's confirm), and
the source is settled only once the queue's majority has that copy
(``Replication.watch_commit``). Should this node stop leading the queue first, the copy
may be lost with it: it is made again, by this node if it leads the queue again, else
forwarded to the queue's new leader like any other node's share. So a leader killed
before its followers had the copy leaves the message in its source queue, and the
new leader either has the copy or gets it. The other way round too: a dead letter held
for another node's quorum queue whose leadership comes to this node before that node
took it gets its copy here (:meth:`Forwarder.led_here`), the same way; it may be
made twice then, should the other node have taken it before it stopped leading.

A publish refused by a full ``x-overflow: reject-publish-dlx`` queue was never in that
queue, so nothing holds its dead letter there: the core holds the publish's confirm
(a nack) instead (``DeadLetterHeld.refused``), and it is given only once the dead
letter is taken as above, or after one bounded try (:attr:`DeadLetterForwarding.refused_wait_s`:
its publisher must not wait on a node that is down), then with the dead letter given
up (logged). Should this node stop first, the publisher has no confirm and sends the
message again (refused and dead-lettered again while the queue is full).

What it guarantees: at least once, like a single node. A held dead letter survives
this node's crash (nothing settled it: it is back in its source queue after the
restart, ready, and is dead-lettered again when it fails again: this node's own
dead-letter queues, which had their copy, are not given another within the
deduplication window, ``DeadLetters._copy_here_once``); an owner
that took it but whose confirm was lost gets it again (deduplicated there by its
``message_id``, when it has one), and so may a quorum queue whose copy the majority had
but whose leader was lost before the source was settled. Until settled it counts as
unacked in its source queue.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from broker.cluster.forward import Forwarder
from broker.cluster.replica_leader import CommitWatch
from broker.core import DeadLetterHeld

__all__ = ["DeadLetterForwarding", "RETRY_MIN_S", "RETRY_MAX_S"]

log = logging.getLogger("ackbus.cluster")

#: How soon a dead letter not yet taken is sent again (doubling up to the maximum).
RETRY_MIN_S, RETRY_MAX_S = 0.2, 5.0

#: copy(held, queues): a held dead letter's copy made in quorum queues this node
#: leads (``Broker.copy_held_dead_letter``); (queue, LSN) of each copy made
CopyHere = Callable[[DeadLetterHeld, list[str]], list[tuple[str, int]]]
#: watch(queue, LSN): whether that copy reaches the queue's majority
#: (``Replication.watch_commit``; None: this node does not lead the queue)
WatchCommit = Callable[[str, int], CommitWatch | None]


class DeadLetterForwarding:
    """Held dead letters of this node, forwarded until taken (see the module
    docstring). ``settle(held)`` settles one in its source queue (or releases the
    confirm of the refused publish that holds it);
    ``copy_here`` and ``watch_commit`` make the copy for a quorum queue this node leads
    and tell when its majority has it; ``serve`` runs the deliveries (each held dead
    letter is a task of its own)."""

    def __init__(
        self,
        forwarder: Forwarder,
        settle: Callable[[DeadLetterHeld], None],
        copy_here: CopyHere | None = None,
        watch_commit: WatchCommit | None = None,
    ) -> None:
        self.forwarder = forwarder
        self.settle = settle
        #: how long a refused publish's confirm waits for its dead letter to be taken
        #: (within the forwarding channel's answer timeout, which the publish's node,
        #: when it was forwarded here, waits for this node's confirm)
        self.refused_wait_s = forwarder.answer_timeout_s / 2
        self.copy_here: CopyHere = copy_here or (lambda held, queues: [])
        self.watch_commit: WatchCommit = watch_commit or (lambda queue, lsn: None)
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
        """Deliver ``held`` (:meth:`_rounds`), then settle it: for good in its source
        queue, or, a refused publish's, release its confirm, after one bounded try."""
        taken = False
        try:
            # (a refused publish's dead letter: one bounded try, see the module docstring)
            with trio.move_on_after(self.refused_wait_s if held.refused else math.inf):
                await self._rounds(held)
                taken = True
            if not taken:
                log.warning(
                    "dead letter of a publish refused by a full queue not taken in time: given up, the publish is nacked",
                    extra={"fields": {"queue": held.queue, "exchange": held.exchange, "wait_s": self.refused_wait_s}},
                )
            self.settle(held)
            if taken:
                self.delivered += 1
        finally:
            self.waiting -= 1

    async def _rounds(self, held: DeadLetterHeld) -> None:
        """Forward ``held`` to every owner of a queue it reaches, again and again for
        those that did not confirm, until all did, and copy it into the quorum queues
        here it awaits until their majority has it."""
        taken: set[str] = set()
        #: quorum queues still without a copy the majority has (see the module docstring)
        awaiting = list(held.awaiting)
        #: every quorum queue whose copy this node has been to make
        adopted = set(awaiting)
        delay = RETRY_MIN_S
        warned = False
        forwarder = self.forwarder
        while True:
            if forwarder.ready:
                for name in forwarder.led_here(held.exchange, held.routing_key, held.properties):
                    if name not in adopted:  # (led here since: another node's queue when held)
                        adopted.add(name)
                        awaiting.append(name)
                owners, leaderless = forwarder.dead_letter_owners(held.exchange, held.routing_key, held.properties)
                todo = [o for o in owners if o not in taken]
                here: list[str] = []
                moved: dict[str, str] = {}  # queue -> the other node leading it now
                gone = {name for name in awaiting if forwarder.view.get("queues", name) is None}
                for name in awaiting:
                    if name in gone:
                        continue  # (deleted meanwhile: nothing to copy into)
                    node = forwarder.node_serving(name)
                    if node == forwarder.node_name:
                        here.append(name)
                    elif node is not None:
                        moved[name] = node
                        if node not in todo:  # (again, if it took its other queues' share)
                            todo.append(node)
                refusals = await self._send(held, todo) if todo else {}
                taken.update(o for o in todo if o not in refusals)
                kept = gone | {name for name, node in moved.items() if node not in refusals}
                if here:
                    kept |= await self._copy_here(held, here)
                awaiting = [name for name in awaiting if name not in kept]
                if not refusals and not leaderless and not awaiting:
                    if not owners and not taken and not held.local and not adopted:
                        log.warning(
                            "dead letter routes to no queue in the cluster: dropped",
                            extra={"fields": {"queue": held.queue, "exchange": held.exchange}},
                        )
                    return
                if not warned:
                    warned = True
                    why = "; ".join(f"node {o!r}: {r}" for o, r in refusals.items()) or (
                        "no leader for " + ", ".join(repr(q) for q in leaderless)
                        if leaderless
                        else "no majority has its copy in " + ", ".join(repr(q) for q in awaiting)
                    )
                    log.warning(
                        "dead letter not taken yet by the node owning its queue: kept in its source queue, retrying",
                        extra={"fields": {"queue": held.queue, "exchange": held.exchange, "why": why}},
                    )
            await trio.sleep(delay)
            delay = min(RETRY_MAX_S, delay * 2)

    async def _copy_here(self, held: DeadLetterHeld, queues: list[str]) -> set[str]:
        """Copy ``held`` into ``queues`` (quorum queues this node leads); the queues
        whose majority has the copy. One whose leader stopped first is not among them
        (its copy is made again, here or by its next leader)."""
        made = self.copy_here(held, queues)
        # (each watched at once: the majority is reached in another task, later)
        watches = [(name, self.watch_commit(name, lsn)) for name, lsn in made]
        kept: set[str] = set()
        for name, watch in watches:
            if watch is None:
                continue
            await watch.done.wait()
            if watch.committed:
                kept.add(name)
        return kept

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

"""Replicated (quorum) queues on one node: which it leads, which it follows, and the
moves between the two.

Design
------

*Agreement in etcd, data by log shipping.* Who leads a quorum queue, in which epoch,
and its in-sync set live in etcd (``leader.py``); the queue's records live in a
replicated log each replica keeps on its own disk (``replica_log.py``), shipped
leader -> followers (``replica_follower.py`` pulls, ``replica_leader.py`` answers).

*The core does not know it is clustered.* The leader's core holds the queue as it
holds any durable queue: publishes, consumers, acks, dead letters, TTLs, its WAL. Two
seams, neither of them clustered, connect it to replication:

- the runtime's record tap (``broker.runtime.tap_records``) hands every batch of core
  records to :class:`~broker.cluster.replica_ops.RecordTranslator`, which turns those
  of led queues into ops of their replicated logs and asks the core to hold the
  confirm of each publish (``Broker.hold_confirms``) until the majority has its op;
- ``Broker.release_held_confirms`` / ``nack_held_confirms`` /
  ``refuse_queue`` / ``restore_message``: the replication layer releases confirms,
  refuses publishes below a majority (``no quorum``) and, on becoming leader, builds
  the queue in its core from its copy of the log.

A follower's core does not hold the queue; the follower's copy is its replica log.
There is no per-message cost for a classic queue: the tap is set only once this node
leads a quorum queue, and a held confirm costs a set lookup only while some are held.

*Moves.* :meth:`Replication.reconcile` runs after every change of the node's etcd
view and every quarter second: for each quorum queue this node is a replica of, it
campaigns when there is no leader and it is in the in-sync set; becomes the leader of
the epoch it won (fold its log into the core, append a ``lead`` entry); follows the
leader etcd names; and steps down (the queue leaves its core, held confirms are
nacked) when the leader key is gone or names another epoch, or its own lease is
counted lost (``Membership.alive_until``: last acknowledged keepalive + TTL -
margin, by this node's monotonic clock). The leader also keeps the in-sync set: a
follower silent for ``lag_s`` (or whose membership key is gone: dead) leaves it
(never below a majority), a follower caught up rejoins it; and while fewer than a
majority of replicas answer, the queue refuses publishes and nacks the confirms that
waited longer than ``lag_s`` with ``no quorum``. When the replica set changes
(``replica_set.py``: the definition's ``replicas``), the leader waits for an added
member to catch up before it joins the in-sync set; a node taken out of the set
forgets its copy of the log (and a removed leader steps down: its key is gone).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import trio

from broker.cluster.etcd import EtcdClient
from broker.cluster.etcdproto import EtcdError
from broker.cluster.leader import (
    LeaderInfo,
    campaign,
    change_isr,
    ever_led,
    holds_majority,
    in_sync_set,
    leader_of,
    majority,
)
from broker.cluster.membership import Membership
from broker.cluster.mirror import CoreMirror
from broker.cluster.reasons import NO_QUORUM, moved_reason
from broker.cluster.replica_follower import PeerSettings, follow
from broker.cluster.replica_leader import CommitWatch, LeaderSide, StaleEpoch
from broker.cluster.replica_log import ReplicaLog, replica_log_path
from broker.cluster.replica_ops import LedQueue, RecordTranslator, fold, published_ids
from broker.cluster.replica_state import QueueReplica, replica_status
from broker.cluster.view import ClusterKeys, ClusterView, is_replicated
from broker.core import QUEUE_DELETED, ErrorReply
from broker.runtime import BrokerRuntime, tap_records

__all__ = ["NO_QUORUM", "Replication"]

log = logging.getLogger("ackbus.cluster")

TICK_S = 0.25


class _Config(PeerSettings, Protocol):
    advertise_url: str
    lease_ttl_s: int
    replica_compact_entries: int


class NodeParts(Protocol):
    """What replication uses of its node (``ClusterNode``)."""

    name: str
    runtime: BrokerRuntime
    view: ClusterView
    membership: Membership
    mirror: CoreMirror
    client: EtcdClient
    keys: ClusterKeys
    synced: bool

    @property
    def config(self) -> _Config: ...

    def note_etcd(self, error: str | None) -> None: ...


class Replication:
    """Every quorum queue of one node (see the module docstring)."""

    def __init__(self, node: NodeParts, data_dir: Path) -> None:
        self.node = node
        self.runtime = node.runtime
        self.core = node.runtime.core
        self.data_dir = data_dir
        self.me = node.name
        self.translator = RecordTranslator(self._append, self._appended_batch)
        #: LSNs held, and leader sides appended to, by the current batch of records
        self._to_hold: list[int] = []
        self._to_wake: dict[str, LeaderSide] = {}
        self.queues: dict[str, QueueReplica] = {}
        self._tapped = False
        self._swept = False
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        #: a follower silent this long leaves the in-sync set; below a majority of
        #: answering replicas, publishes are refused
        self.lag_s = max(1.0, node.config.lease_ttl_s / 2)

    # ---------------------------------------------------------------- running

    def changed(self) -> None:
        """The view changed: reconcile soon."""
        self._changed.set()

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                with trio.move_on_after(TICK_S):
                    await self._changed.wait()
                self._changed = trio.Event()
                try:
                    await self.reconcile()
                except EtcdError as exc:
                    self.node.note_etcd(exc.message)

    def holds(self, queue: str) -> bool:
        """Whether this node's core holds quorum queue ``queue`` (it leads it)."""
        replica = self.queues.get(queue)
        return replica is not None and replica.leading is not None

    def watch_commit(self, queue: str, lsn: int) -> CommitWatch | None:
        """Whether core record ``lsn``, which brought a message into quorum queue
        ``queue`` this node leads, reaches the queue's majority (a held dead letter's
        copy, ``dead_letters.py``); None when this node does not lead the queue."""
        replica = self.queues.get(queue)
        side = replica.leading if replica is not None else None
        return side.watch(lsn) if side is not None else None

    async def reconcile(self) -> None:
        view = self.node.view
        if not self.node.synced:
            return
        wanted = {
            name: d
            for name, (d, _rev) in view.entries["queues"].items()
            if is_replicated(d) and self.me in d.get("replicas", [])
        }
        for name in [n for n in self.queues if n not in wanted or self._declared_again(n)]:
            # (declared again: the deleted queue's log goes, and the new queue opens
            # an empty one below, as if the two rounds had seen the gap)
            await self._forget(name)
        if not self._swept:  # once: the logs of queues deleted, or replicas removed, while this node was down
            self._swept = True
            logs = [replica_log_path(self.data_dir, n) for n in (*wanted, *self.queues)]
            keep = {*logs, *(p.with_suffix(".incarnation") for p in logs)}
            folder = self.data_dir / "replicas"
            # (and every .tmp: no log is open yet, so none is a rewrite under way)
            for path in [*folder.glob("*.log"), *folder.glob("*.tmp"), *folder.glob("*.incarnation")]:
                try:
                    if path not in keep:
                        path.unlink(missing_ok=True)
                except OSError as exc:
                    log.error("stale replica log not deleted", extra={"fields": {"path": str(path), "error": str(exc)}})
        for name, d in wanted.items():
            try:
                replica = self.queues.get(name)
                if replica is None:
                    replica = self._open(name)
                await self._reconcile_one(replica, d)
            except (OSError, ErrorReply, ValueError) as exc:
                # one queue's trouble (its log unreadable, its core refusing) must not
                # stop the others: it is retried at the next round
                log.error("quorum queue not reconciled", extra={"fields": {"queue": name, "error": str(exc)}})

    def _declared_again(self, name: str) -> bool:
        """Whether quorum queue ``name`` was deleted and declared again (same name)
        since this node opened its replica: its definition's key was created anew
        (etcd's ``create_revision``), even if both happened between two rounds and
        the definition is the same. The new queue must not take the old one's log."""
        return self._incarnation_changed(self.queues[name])

    def _incarnation_changed(self, replica: QueueReplica) -> bool:
        """Whether the definition of ``replica``'s queue is another incarnation's."""
        created = self.node.view.created_revision("queues", replica.name)
        return bool(replica.incarnation and created and created != replica.incarnation)

    def _open(self, name: str) -> QueueReplica:
        """Open this node's replica of quorum queue ``name``: its log as the disk has
        it, unless the disk's is a deleted queue's of the same name (another
        incarnation: deleted and declared again while this node was down)."""
        log_ = ReplicaLog(replica_log_path(self.data_dir, name))
        incarnation = self.node.view.created_revision("queues", name)
        kept = log_.read_incarnation()
        if incarnation and kept and kept != incarnation:
            log_.discard_files()
            log.info("replica log of a deleted queue of the same name removed", extra={"fields": {"queue": name}})
        log_.open()
        if incarnation and kept != incarnation:
            log_.write_incarnation(incarnation)  # (before any entry: a log unmarked is from before incarnations)
        replica = self.queues[name] = QueueReplica(name, log_)
        replica.incarnation = incarnation
        # a queue this node's WAL still holds from an earlier leadership: the log,
        # not the WAL, is the truth; the queue comes back only if this node leads
        if name in self.core.queues:
            self.node.mirror.drop_queue(name)
            self.runtime.pump()
        return replica

    async def _forget(self, name: str) -> None:
        """The queue was deleted, or this node left its replica set: stop serving it and
        remove its log. The removal waits for a rewrite of the log under way (its
        cancelled follower's, its leader's compaction) to end: a later queue of the
        same name opens its log only once this one is gone for good."""
        replica = self.queues.pop(name)
        if replica.leading is not None:
            # taken out of the replica set, the queue lives on: its consumers here go
            # on from its next leader; deleted (or declared anew), they are cancelled
            lives_on = self.node.view.get("queues", name) is not None and not self._incarnation_changed(replica)
            self._step_down(replica, "removed from the replica set" if lives_on else QUEUE_DELETED, deleted=not lives_on)
        self._stop_following(replica)
        try:
            await replica.log.remove()
        except OSError as exc:
            log.error("replica log not deleted", extra={"fields": {"queue": name, "path": str(replica.log.path), "error": str(exc)}})

    async def _reconcile_one(self, replica: QueueReplica, d: dict[str, Any]) -> None:
        view = self.node.view
        leader = leader_of(view, replica.name)
        membership = self.node.membership
        if replica.leading is not None:
            epoch = replica.leading.epoch
            gone = leader is None and view.revision >= epoch
            other = leader is not None and leader.epoch != epoch
            if gone or other or not replica.leading.alive():
                self._step_down(replica, "lease lost" if not membership.registered else "leadership lost")
            else:
                self._tend(replica, d)
                return
        if leader is None:
            self._stop_following(replica)
            isr, isr_rev = in_sync_set(view, replica.name)
            if self.me not in isr or not membership.registered:
                return
            if replica.log.end_offset == 0 and ever_led(view, replica.name):
                return  # a wiped replica: it lost what the set promises it holds
            record = {
                "node": self.me,
                "url": self.node.config.advertise_url,
                "incarnation": membership.incarnation,
                "lease": membership.lease,
            }
            lease = membership.lease
            won = await campaign(self.node.client, self.node.keys, replica.name, record, lease, isr, isr_rev)
            if won is not None:
                self._lead(replica, d, won, lease)
            return
        if leader.node == self.me:
            if leader.lease == membership.lease and membership.registered:
                self._lead(replica, d, leader.epoch, leader.lease)
            # else a key written with a lease this node no longer holds (an earlier
            # process, or its own lease counted lost): it lapses with that lease
            return
        self._follow(replica, leader)

    # ----------------------------------------------------------------- leading

    def _lead(self, replica: QueueReplica, d: dict[str, Any], epoch: int, lease: int) -> None:
        """Become the leader of ``epoch``, won with membership lease ``lease``: the
        queue enters the core from the log."""
        self._stop_following(replica)
        if not self._tapped:
            tap_records(self.runtime, self.translator.tap)
            self._tapped = True
        core = self.core
        name = replica.name
        if name in core.queues:
            self.node.mirror.drop_queue(name, moved_reason(name, "leading a new epoch"))
        self.node.mirror.hold_queue(name, d, self.node.view)
        queue = core.queues.get(name)
        if queue is None:
            log.error("quorum queue could not be declared in the core", extra={"fields": {"queue": name}})
            return
        led = LedQueue(name, queue.qid)
        led.restoring = True
        self.translator.led[queue.qid] = led
        core.persist_messages(name)  # every message replicated, transient ones too
        live, settled = fold(replica.log.entries)
        core.hold_deliveries(name, 0)  # until the new epoch's first entry has its majority
        restored: list[tuple[int, int]] = []
        now = core.wall_clock()
        try:
            for m in live:
                # possibly delivered by the old leader in its last moments, its mark not
                # on a majority: counted as delivered once (marked redelivered); one held
                # back (a delay) stays held back until it is due
                due = m.due if m.due is not None and m.due > now else None
                seq = core.restore_message(
                    name, m.exchange, m.routing_key, m.body, m.properties, m.wall, max(1, m.deliveries), due,
                    dedup=m.dedup,
                )
                led.ids[seq] = m.id
                restored.append((m.id, seq))
            for exchange, message_id, wall in settled:
                core.remember_message_id(exchange, message_id, wall)
            self.runtime.pump()
        finally:
            led.restoring = False
        replica.led = led
        replica.leading = side = LeaderSide(
            name,
            epoch,
            self.me,
            list(d.get("replicas", [])),
            replica.log,
            release=self._release,
            deliverable=lambda seq: self._deliverable(name, seq),
            alive=self._alive_with(lease),
            compact_after=self.node.config.replica_compact_entries,
        )
        side.unreleased.extend(restored)
        side.isr = in_sync_set(self.node.view, name)[0] or list(side.replicas)
        replica.log.append(epoch, {"t": "lead", "node": self.me})
        side.appended(replica.log.end_offset, 0)
        assert self._nursery is not None
        self._nursery.start_soon(side.serve_sync)
        log.info(
            "leading quorum queue",
            extra={"fields": {"queue": name, "epoch": epoch, "messages": len(live), "log_end": replica.log.end_offset}},
        )
        self._tend(replica, d)

    def _alive_with(self, lease: int) -> Callable[[], bool]:
        """Whether the lease leadership was won with still holds by this node's clock
        (a node that lost it and joined again with a new one leads nothing: its
        leader key went with the old lease)."""
        membership = self.node.membership

        def alive() -> bool:
            return membership.registered and membership.lease == lease

        return alive

    def _append(self, led: LedQueue, op: dict[str, Any], lsn: int, seq: int) -> int:
        """The translator's append: into the led queue's log, holding ``lsn``."""
        replica = self.queues.get(led.name)
        side = replica.leading if replica is not None else None
        if replica is None or side is None:
            return 0
        offset = replica.log.append(side.epoch, op)
        if lsn:
            self._to_hold.append(lsn)
        side.appended(offset, lsn, seq, wake=False)
        self._to_wake[led.name] = side
        return offset

    def _appended_batch(self) -> None:
        """The end of a batch of records (still before the WAL writes it): its
        confirms held, its logs' fetches and sync woken, each once."""
        if self._to_hold:
            self.core.hold_confirms(self._to_hold)
            self._to_hold = []
        if self._to_wake:
            for side in self._to_wake.values():
                side.wake()
            self._to_wake = {}

    def _deliverable(self, queue: str, seq: int) -> None:
        self.core.hold_deliveries(queue, seq)
        self.runtime.pump()

    def _release(self, lsns: list[int]) -> None:
        self.core.release_held_confirms(lsns)
        self.runtime.pump()

    def _tend(self, replica: QueueReplica, d: dict[str, Any]) -> None:
        """The leader's round: the in-sync set, refusal below a majority, stale
        confirms nacked, the lease."""
        side = replica.leading
        assert side is not None
        replicas_now = [str(n) for n in d.get("replicas", [])]
        if replicas_now != side.replicas:
            side.set_replicas(replicas_now)  # a membership change (replica_set.py)
        isr, isr_rev = in_sync_set(self.node.view, replica.name)
        # members being added count at once (before etcd has them: a new member may
        # be elected as soon as etcd has it); members leaving count until the view
        # shows them gone
        effective = sorted(set(isr) | replica.isr_adding) if isr else []
        if effective and effective != sorted(side.isr):
            side.advance(effective)
        replicas = side.replicas
        need = majority(len(replicas))
        answering = [self.me, *side.responsive(self.lag_s)]
        refuse = not holds_majority(answering, replicas)
        if refuse != replica.refused:
            replica.refused = refuse
            self.core.refuse_queue(replica.name, NO_QUORUM if refuse else None)
            log.warning(
                "quorum queue below its majority: refusing publishes" if refuse else "quorum queue has its majority again",
                extra={"fields": {"queue": replica.name, "answering": answering, "replicas": replicas}},
            )
        since = side.waiting_since()
        if refuse and since is not None and trio.current_time() - since > self.lag_s:
            # nacked, not forgotten: the messages stay and may yet reach a majority, so
            # a resend the deduplication window answers must wait for that too
            self.core.nack_held_confirms(side.held_lsns(), NO_QUORUM, keep_held=True)
            self.runtime.pump()
        pending = replica.isr_change_pending
        if pending == -1 or (pending and self.node.view.revision < pending):
            return  # a change in flight, or not yet seen by this node's view
        replica.isr_change_pending = 0
        replica.isr_adding = set()
        now = trio.current_time()
        live = self.node.view.live_nodes()
        # a member whose membership lease lapsed (dead, paused, cut off) leaves at once:
        # a new leader does not wait ``lag_s`` for the old one (failover time)
        silent = [
            n
            for n in isr
            if n != self.me
            and (n not in live or now - side.seen.get(n, side.started) > self.lag_s or n in side.regressed)
        ]
        new_isr = list(isr)
        for n in silent:
            if len(new_isr) - 1 >= need:
                new_isr.remove(n)
        for n in replicas:
            caught_up = side.acked.get(n, 0) >= replica.log.end_offset and n not in side.regressed
            if n not in new_isr and n in answering and caught_up:
                new_isr.append(n)
        if isr and sorted(new_isr) != sorted(isr):
            assert self._nursery is not None
            replica.isr_change_pending = -1
            replica.isr_adding = set(new_isr) - set(isr)
            if replica.isr_adding:
                side.advance(sorted(set(side.isr) | replica.isr_adding))
            self._nursery.start_soon(self._change_isr, replica, side.epoch, isr_rev, new_isr)

    async def _change_isr(self, replica: QueueReplica, epoch: int, isr_rev: int, isr: list[str]) -> None:
        try:
            revision = await change_isr(self.node.client, self.node.keys, replica.name, epoch, isr_rev, isr)
        except EtcdError as exc:
            self.node.note_etcd(exc.message)
            revision = None
        replica.isr_change_pending = revision or 0
        if not revision:
            replica.isr_adding = set()
        if revision:
            log.info("in-sync set changed", extra={"fields": {"queue": replica.name, "isr": sorted(isr), "epoch": epoch}})

    def _step_down(self, replica: QueueReplica, reason: str, *, deleted: bool = False) -> None:
        """Stop leading: no more confirms or deliveries; the queue leaves the core. Its
        consumers here are cancelled as by a delete when ``deleted``; else with the
        mirror's ``queue_moved`` reason, which their channels take as the sign to go
        on from the next leader (``broker/api/channel/relay_resume.py``)."""
        side = replica.leading
        if side is None:
            return
        side.stop()
        replica.leading = None
        led, replica.led = replica.led, None
        if led is not None:
            self.translator.led.pop(led.qid, None)
        # publishes past the commit point leave with the queue (the next leader may
        # truncate them): their resends must land, not be taken for duplicates
        tail = replica.log.read(side.commit + 1, max(0, replica.log.end_offset - side.commit))
        for exchange, message_id in published_ids(tail):
            self.core.dedup.forget(exchange, message_id)
        self.core.nack_held_confirms(side.take_held(), f"{NO_QUORUM}: leadership of queue {replica.name!r} lost")
        replica.refused = False
        try:
            self.node.mirror.drop_queue(replica.name, QUEUE_DELETED if deleted else moved_reason(replica.name, reason))
        finally:
            self.runtime.pump()
        log.warning("stopped leading quorum queue", extra={"fields": {"queue": replica.name, "epoch": side.epoch, "reason": reason}})

    # --------------------------------------------------------------- following

    def _follow(self, replica: QueueReplica, leader: LeaderInfo) -> None:
        target = (leader.url, leader.epoch)
        if replica.follow_target == target:
            return
        self._stop_following(replica)
        replica.follow_target = target
        scope = replica.follow_scope = trio.CancelScope()
        assert self._nursery is not None
        self._nursery.start_soon(self._run_follower, replica, leader, scope)

    async def _run_follower(self, replica: QueueReplica, leader: LeaderInfo, scope: trio.CancelScope) -> None:
        with scope:
            await follow(
                replica.name, self.me, leader.url, leader.epoch, replica.log, replica.follower, timeout_s=max(2.0, self.lag_s),
                settings=self.node.config, compact_after=self.node.config.replica_compact_entries,
            )

    def _stop_following(self, replica: QueueReplica) -> None:
        if replica.follow_scope is not None:
            replica.follow_scope.cancel()
        replica.follow_scope = None
        replica.follow_target = None

    # ------------------------------------------------------------ leader's API

    async def fetch(self, queue: str, body: dict[str, Any]) -> dict[str, Any]:
        """A follower's fetch (``POST /cluster/replicas/{queue}/fetch``). Raises
        StaleEpoch."""
        replica = self.queues.get(queue)
        if replica is None or replica.leading is None:
            raise StaleEpoch(f"this node does not lead queue {queue!r}")
        return await replica.leading.fetch(
            str(body.get("node")), int(body.get("epoch", 0)), int(body.get("offset", 1)), min(5.0, float(body.get("wait_s", 1.0)))
        )

    def epoch_end(self, queue: str, body: dict[str, Any]) -> dict[str, Any]:
        """KIP-279 (``POST /cluster/replicas/{queue}/epoch-end``): where the follower's
        last epoch ends in the leader's log."""
        replica = self.queues.get(queue)
        if replica is None or replica.leading is None:
            raise StaleEpoch(f"this node does not lead queue {queue!r}")
        if int(body.get("leader_epoch", 0)) != replica.leading.epoch:
            raise StaleEpoch(f"this node leads queue {queue!r} in epoch {replica.leading.epoch}")
        return {"end_offset": replica.log.end_of_epoch(int(body.get("epoch", 0))), "epoch": replica.leading.epoch}

    # ----------------------------------------------------------------- showing

    def status(self, queue: str, d: dict[str, Any]) -> dict[str, Any]:
        """A quorum queue's replication, as this node sees it."""
        return replica_status(self.node.view, queue, d, self.queues.get(queue), self.me)

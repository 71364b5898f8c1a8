"""The leader's side of one quorum queue in one epoch: what each follower has, the
majority point, and the confirms waiting for it.

Confirms flow like this. The leader's core holds the queue as any queue and confirms
a publish once its ENQUEUE record is durable in the node's WAL, but the runtime's
record tap (``replica_ops.RecordTranslator``) saw that record first: it appended a
``pub`` op to the queue's replicated log and asked the core to hold the record's LSN
(``Broker.hold_confirms``). The confirm leaves only when :meth:`LeaderSide.advance`
releases the LSN, which it does once the ``pub`` entry is on the disk of every member
of the in-sync set: the leader's own replica log synced, and each in-sync follower's
next fetch asking for an offset past it (a follower fetches the next offset only once
what it has is fsynced), and only while the in-sync set is at least a majority of
the replicas (``Replication`` changes it in etcd before the leader counts without
someone; a forced removal or a replica being added can leave it smaller, and
confirms wait then), so a released confirm is on a majority's disk.

Followers pull (``fetch``): a long-polled request on a kept-alive HTTP/1.1
connection; the entries travel leader -> follower in its answer, and the offset of the
next fetch acknowledges the ones before. A fetch names the epoch the follower believes
in; the leader answers only for its own epoch (``StaleEpoch`` otherwise), and only
while its lease holds.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from broker.cluster.leader import holds_majority
from broker.cluster.replica_log import Entry, ReplicaLog, ReplicaLogRemoved
from broker.cluster.replica_ops import snapshot_op

__all__ = ["COMPACT_AFTER_ENTRIES", "FETCH_MAX_ENTRIES", "CommitWatch", "LeaderSide", "StaleEpoch", "snapshot"]

log = logging.getLogger("ackbus.cluster")

#: The most entries one fetch answer carries.
FETCH_MAX_ENTRIES = 2000
#: A replica compacts its log once this many entries precede the offset every
#: replica holds (``ReplicaLog.compact``).
COMPACT_AFTER_ENTRIES = 10_000
#: Settled message ids a snapshot keeps for deduplication: those published this
#: recently (well past the core's deduplication window, ``dedup_window_s``).
SETTLED_KEEP_S = 600.0


def snapshot(prefix: list[Entry]) -> dict[str, Any] | None:
    """A compacted prefix's ``snap`` op (``replica_ops.snapshot_op``), now."""
    return snapshot_op(prefix, time.time() - SETTLED_KEEP_S)


class StaleEpoch(Exception):
    """A fetch for an epoch this node does not lead (any more)."""


class CommitWatch:
    """Whether one held record reached the majority of its queue's replicas: waited on
    by the cluster's dead letters (``dead_letters.py``), whose source may be settled
    only then. ``committed`` is known once ``done`` is set: True, the majority has it;
    False, this leader stopped first (the record may or may not survive it)."""

    __slots__ = ("done", "committed")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.committed = False

    def resolve(self, committed: bool) -> None:
        if not self.done.is_set():
            self.committed = committed
            self.done.set()


class LeaderSide:
    """One queue led by this node in ``epoch`` (see the module docstring)."""

    def __init__(
        self,
        name: str,
        epoch: int,
        me: str,
        replicas: list[str],
        log: ReplicaLog,
        *,
        release: Callable[[list[int]], None],
        deliverable: Callable[[int], None],
        alive: Callable[[], bool],
        compact_after: int = COMPACT_AFTER_ENTRIES,
    ) -> None:
        self.name = name
        self.compact_after = compact_after
        self.epoch = epoch
        self.me = me
        self.replicas = replicas
        self.log = log
        self._release = release
        self._deliverable = deliverable
        #: whether this node's lease (the one leadership was won with) still holds
        self.alive = alive
        self.started = trio.current_time()
        #: follower -> every entry up to this offset is on its disk
        self.acked: dict[str, int] = {n: 0 for n in replicas if n != me}
        #: follower -> when it last fetched (trio clock)
        self.seen: dict[str, float] = {}
        #: followers that came back with less than they had acknowledged
        self.regressed: set[str] = set()
        #: (offset, LSN, when it began to wait) of publishes whose confirm waits for this
        #: offset's majority
        self.held: deque[tuple[int, int, float]] = deque()
        #: (offset, local seq) of messages consumers may not have before that offset's
        #: majority (a message a majority does not hold may vanish with this leader)
        self.unreleased: deque[tuple[int, int]] = deque()
        self.commit = 0
        #: the in-sync set as etcd has it (every member must hold an entry)
        self.isr = list(replicas)
        self.stopped = False
        #: LSN -> the watch of a held record (:meth:`watch`)
        self._watches: dict[int, CommitWatch] = {}
        self._appended = trio.Event()
        self._to_sync = trio.Event()

    # ------------------------------------------------------------------- appends

    def appended(self, offset: int, lsn: int, seq: int = 0, *, wake: bool = True) -> None:
        """An op was appended at ``offset``; ``lsn``: the core record to hold; ``seq``:
        the local seq of the message it brings. ``wake=False``: one of a batch, whose
        end calls :meth:`wake` once."""
        if lsn:
            self.held.append((offset, lsn, trio.current_time()))
        if seq:
            self.unreleased.append((offset, seq))
        if wake:
            self.wake()

    def wake(self) -> None:
        """Entries were appended: answer the waiting fetches, sync them."""
        self._appended.set()
        self._appended = trio.Event()
        self._to_sync.set()

    async def serve_sync(self) -> None:
        """Keep the leader's own copy synced; each sync may move the majority point.
        Ends when stopped, or when the log was removed (its queue deleted: no failure
        to report)."""
        while not self.stopped:
            await self._to_sync.wait()
            self._to_sync = trio.Event()
            try:
                await self.log.sync()
            except ReplicaLogRemoved:
                # the queue was deleted, or this node left its replica set: not a failed
                # write, and nothing more to sync (the log refuses every later write)
                log.debug("replica log removed: its sync loop ends", extra={"fields": {"queue": self.name}})
                return
            except OSError as exc:
                # nothing past the synced offset counts; the write is tried again
                log.error("replica log write failed", extra={"fields": {"queue": self.name, "error": str(exc)}})
                self._to_sync.set()
                await trio.sleep(0.5)
                continue
            self.advance(None)
            safe = self.held_by_all()
            if self.log.wants_compaction(safe, self.compact_after):
                try:
                    await self.log.compact(safe, snapshot)
                except ReplicaLogRemoved:
                    log.debug("replica log removed: its sync loop ends", extra={"fields": {"queue": self.name}})
                    return
                except OSError as exc:  # the log is as it was: compaction is tried again later
                    log.error("replica log compaction failed", extra={"fields": {"queue": self.name, "error": str(exc)}})

    def held_by_all(self) -> int:
        """The offset up to which every replica holds the log (this one synced):
        what may be compacted."""
        return min([self.log.synced, *self.acked.values()])

    # ------------------------------------------------------------------ followers

    async def fetch(self, node: str, epoch: int, offset: int, wait_s: float) -> dict[str, Any]:
        """A follower's fetch from ``offset`` (it holds everything before)."""
        if epoch != self.epoch or self.stopped or not self.alive():
            raise StaleEpoch(f"this node does not lead epoch {epoch} of queue {self.name!r}")
        if node not in self.acked:
            raise StaleEpoch(f"{node!r} is not a replica of queue {self.name!r}")
        end = self.log.end_offset
        if offset > end + 1:
            return {"epoch": self.epoch, "truncate_to": end, "entries": [], "commit": self.commit}
        self.seen[node] = trio.current_time()
        if offset - 1 > self.acked[node]:
            self.acked[node] = offset - 1
            if node in self.regressed and offset > end:
                self.regressed.discard(node)  # caught up again
            self.advance(None)
        elif offset - 1 < self.acked[node]:
            # it lost entries it had acknowledged (a wiped or damaged data directory):
            # it leaves the in-sync set and counts for nothing until caught up
            self.acked[node] = offset - 1
            self.regressed.add(node)
        if offset > end:
            with trio.move_on_after(wait_s):
                await self._appended.wait()
        entries = self.log.read(offset, FETCH_MAX_ENTRIES)
        return {
            "epoch": self.epoch, "entries": entries, "commit": self.commit, "end": self.log.end_offset,
            "safe": self.held_by_all(),  # (the follower may compact up to there)
        }

    def set_replicas(self, replicas: list[str]) -> None:
        """The replica set changed (``replica_set.py``): an added member starts with
        nothing acknowledged (out of the in-sync set until it caught up); a removed
        one is no longer waited for once the in-sync set says so."""
        self.replicas = list(replicas)
        now = trio.current_time()
        for n in replicas:
            if n != self.me and n not in self.acked:
                self.acked[n] = 0
                self.seen[n] = now  # given ``lag_s`` from now to fetch, as at an epoch's start
        for n in [n for n in self.acked if n not in replicas]:
            del self.acked[n]
            self.seen.pop(n, None)
            self.regressed.discard(n)
        self.advance(None)

    # ------------------------------------------------------------------ majority

    def advance(self, isr: list[str] | None) -> None:
        """Move the majority point (``isr``: the in-sync set, when it changed) and
        release the confirms it covers; nothing once stopped or past the lease."""
        if isr is not None:
            self.isr = isr
        if self.stopped or not self.alive():
            return
        if not holds_majority(self.isr, self.replicas):
            return  # (a forgotten member left the set smaller than a majority: wait for one to join)
        members = [n for n in self.isr if n != self.me]
        point = self.log.synced
        for n in members:
            point = min(point, self.acked.get(n, 0))
        if point <= self.commit:
            return
        self.commit = point
        released = []
        held = self.held
        while held and held[0][0] <= point:
            released.append(held.popleft()[1])
        unreleased = self.unreleased
        seq = 0
        while unreleased and unreleased[0][0] <= point:
            seq = unreleased.popleft()[1]
        if seq:
            self._deliverable(seq)
        if released:
            watches = self._watches
            if watches:
                for lsn in released:
                    w = watches.pop(lsn, None)
                    if w is not None:
                        w.resolve(True)
            self._release(released)

    def watch(self, lsn: int) -> CommitWatch:
        """A watch of held record ``lsn``: resolved True once the majority has it,
        False when this leader stops first. At once False for a record not held here
        (never appended to this queue's log, or this leader has stopped)."""
        w = CommitWatch()
        if self.stopped or not any(held_lsn == lsn for _o, held_lsn, _t in self.held):
            w.resolve(False)
        else:
            self._watches[lsn] = w
        return w

    def _end_watches(self) -> None:
        """This leader stops: what it has not released it can no longer promise."""
        watches, self._watches = self._watches, {}
        for w in watches.values():
            w.resolve(False)

    def waiting_since(self) -> float | None:
        """When the oldest held confirm began to wait (None: none waits)."""
        return self.held[0][2] if self.held else None

    def held_lsns(self) -> list[int]:
        """Every held LSN (they stay held here)."""
        return [lsn for _o, lsn, _t in self.held]

    def take_held(self) -> list[int]:
        """Every held LSN, forgotten here (they are nacked by the caller)."""
        lsns = self.held_lsns()
        self.held.clear()
        self._end_watches()
        return lsns

    def lag(self) -> dict[str, int]:
        """How many entries each follower is behind."""
        end = self.log.end_offset
        return {n: end - a for n, a in sorted(self.acked.items())}

    def responsive(self, within_s: float) -> list[str]:
        """Followers that fetched in the last ``within_s`` seconds (counting from the
        start of the epoch for one not heard from yet: it is given that long)."""
        now = trio.current_time()
        return [n for n in self.acked if now - self.seen.get(n, self.started) <= within_s]

    def stop(self) -> None:
        self.stopped = True
        self._end_watches()
        self._appended.set()
        self._to_sync.set()

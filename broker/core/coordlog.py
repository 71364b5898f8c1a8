"""Coordination as one component: the wake-ups of locks and schedules, the grants
that wait for the log, replaying their records, and the checkpoint records that carry
their state.

Replay is idempotent, as everywhere (a checkpoint may already hold effects of records
logged after its LSN): LOCK_HELD applies when its token is at least the one the lock
has (a refresh keeps the token and moves the expiry), LOCK_RELEASED only to the holder
with its token; SCHEDULE_PUT sets a schedule's whole state, SCHEDULE_TICK moves its
``fired_up_to`` forward (never back) and indexes the tick's message like a logged
publish; COORD_META keeps the larger next token. Replayed locks and schedules start
their timers with the first ``take_effects`` after recovery (:meth:`Coordination.start`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from . import records as rec
from .coordstate import CoordState, Lock
from .locks import CoordTimer, Locks, lock_record
from .log import MessageLog
from .records import RecordType
from .schedules import Schedules, schedule_from_record, schedule_record
from .shared import Outbox

__all__ = ["Coordination", "COORD_RECORD_TYPES"]

COORD_RECORD_TYPES = frozenset(
    {
        RecordType.LOCK_HELD,
        RecordType.LOCK_RELEASED,
        RecordType.SCHEDULE_PUT,
        RecordType.SCHEDULE_DELETE,
        RecordType.SCHEDULE_TICK,
        RecordType.COORD_META,
    }
)


class Coordination:
    """Locks and schedules together: their shared timer and state (see the module
    docstring). The commands are ``locks``' and ``schedules``'."""

    def __init__(
        self,
        coord: CoordState,
        timer: CoordTimer,
        locks: Locks,
        schedules: Schedules,
        outbox: Outbox,
        log: MessageLog,
        *,
        wall_clock: Callable[[], float],
    ) -> None:
        self.coord = coord
        self._timer = timer
        self.locks = locks
        self.schedules = schedules
        self._outbox = outbox
        self._log = log
        self._wall_clock = wall_clock

    def wake(self, now: float) -> None:
        """The coordination timer fired (``now``: monotonic): expire locks, end waits,
        fire schedules that are due; then set the next wake-up."""
        coord = self.coord
        coord.wake_at = None
        heap = coord.heap
        wall = self._wall_clock()
        while heap and heap[0][0] <= now:
            deadline, kind, key, stamp = heapq.heappop(heap)
            if kind == "sched":
                self.schedules.due(key, stamp)
            else:
                self.locks.timer_fired(kind, key, stamp, deadline, wall)
        self._timer.rearm()

    def take_effects(self) -> None:
        """From ``take_effects``: start the timers of replayed locks and schedules, and
        send the grants whose record is durable."""
        coord = self.coord
        if coord.needs_start:
            coord.needs_start = False
            self.start()
        if coord.grants:
            durable = self._log.durable_lsn
            i = 0
            while i < len(coord.grants) and coord.grants[i][0] <= durable:
                self._outbox.emit(coord.grants[i][1])
                i += 1
            del coord.grants[:i]
        coord.pending = bool(coord.grants)

    def start(self) -> None:
        """After recovery: locks expired meanwhile are free, the others get their
        timer; schedules fire what came due while the broker was down (by their
        policy) and plan their next tick."""
        self.locks.start()
        for name in list(self.coord.schedules):
            self.schedules.due(name, None)

    def replay(self, rtype: int, payload: bytes, lsn: int) -> bytes | None:
        """Apply one coordination record during recovery. A SCHEDULE_TICK returns the
        ENQUEUE payload of its message, for recovery to index like a logged publish."""
        coord = self.coord
        coord.needs_start = True
        coord.pending = True
        if rtype == RecordType.SCHEDULE_TICK:
            name, tick, enqueue = rec.decode_tick(payload)
            s = coord.schedules.get(name)
            if s is not None and tick > s.fired_up_to:
                s.fired_up_to = tick
                s.last_tick = tick
            if s is not None:
                s.recovering = True
            if not lsn:
                raise ValueError("SCHEDULE_TICK record in a checkpoint")
            return enqueue
        d = rec.decode_json(payload)
        if rtype == RecordType.LOCK_HELD:
            token = int(d["token"])
            coord.next_token = max(coord.next_token, token + 1)
            lock = coord.locks.get(d["name"])
            if lock is None:
                lock = coord.locks[d["name"]] = Lock(d["name"])
            if token > lock.token or (token == lock.token and lock.owner is not None):
                lock.owner = d["owner"]
                lock.acquired = float(d["acquired"])
                lock.expires = max(float(d["expires"]), lock.expires) if token == lock.token else float(d["expires"])
                lock.ttl_s = float(d["ttl_s"])
                lock.token = token
        elif rtype == RecordType.LOCK_RELEASED:
            lock = coord.locks.get(d["name"])
            if lock is not None and lock.token == int(d["token"]):
                del coord.locks[d["name"]]
        elif rtype == RecordType.SCHEDULE_PUT:
            s = schedule_from_record(d)
            s.recovering = True
            coord.schedules[s.name] = s
        elif rtype == RecordType.SCHEDULE_DELETE:
            coord.schedules.pop(d["name"], None)
        elif rtype == RecordType.COORD_META:
            coord.next_token = max(coord.next_token, int(d.get("next_token", 1)))
        else:  # pragma: no cover - the table sends only the types above
            raise ValueError(f"not a coordination record type: {rtype}")
        return None

    def checkpoint_records(self) -> list[tuple[int, bytes]]:
        """The checkpoint records of every held lock, every schedule and the next
        fencing token."""
        T = rec.RecordType
        out: list[tuple[int, bytes]] = []
        for lock in self.coord.locks.values():
            if lock.owner is not None:
                out.append((T.LOCK_HELD, rec.encode_json(lock_record(lock))))
        for s in self.coord.schedules.values():
            out.append((T.SCHEDULE_PUT, rec.encode_json(schedule_record(s))))
        out.append((T.COORD_META, rec.encode_json({"next_token": self.coord.next_token})))
        return out

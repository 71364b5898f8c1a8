"""The data of coordination: named locks, their waiters, schedules, and their timer.

Plain data, no rules: the rules are in ``locks.py`` (locks), ``schedules.py``
(schedules) and ``coordlog.py`` (their records, replay and checkpoint). One
:class:`CoordState` is shared by those three components (``Broker.coord`` shows it).

Two clocks, as everywhere in the core: a lock's expiry and a schedule's ticks are
wall-clock times (they must mean the same thing after a restart); the timer that wakes
the core for them is on the monotonic clock, set from the wall-clock distance at the
time it is set and checked against the wall clock when it fires.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .effects import Effect
from .timing import Timing, iso_utc

__all__ = [
    "CoordState",
    "Lock",
    "LockWaiter",
    "Schedule",
    "LockGranted",
    "LockWaitEnded",
    "TickFired",
    "MISSED_POLICIES",
]

#: What a schedule does with ticks that came due while the broker was down.
MISSED_POLICIES = ("latest", "skip", "all")


@dataclass(slots=True)
class LockWaiter:
    """An acquire waiting for a held lock, in arrival order."""

    id: int
    channel_id: int
    owner: str
    ttl_s: float
    deadline: float  # monotonic: when the wait gives up
    since: float  # wall: when it started waiting
    ref: Any  # the API's correlation value (a channel op's id), handed back as is


@dataclass(slots=True)
class Lock:
    """A named lock. ``owner`` None: free (kept only while someone waits)."""

    name: str
    owner: str | None = None
    token: int = 0
    acquired: float = 0.0  # wall
    expires: float = 0.0  # wall
    ttl_s: float = 0.0
    deadline: float = 0.0  # monotonic twin of ``expires``
    waiters: deque[LockWaiter] = field(default_factory=deque)

    def info(self, now_wall: float) -> dict[str, Any]:
        """What ``GET /locks/{name}`` shows."""
        held = self.owner is not None
        return {
            "name": self.name,
            "held": held,
            "owner": self.owner,
            "token": self.token if held else None,
            "acquired_at": iso_utc(self.acquired) if held else None,
            "expires_at": iso_utc(self.expires) if held else None,
            "ttl_s": self.ttl_s if held else None,
            "expires_in_s": round(max(0.0, self.expires - now_wall), 3) if held else None,
            "waiters": [{"owner": w.owner, "waiting_since": iso_utc(w.since)} for w in self.waiters],
        }


@dataclass(slots=True)
class Schedule:
    """A schedule: what it publishes, when, and how far it has fired."""

    name: str
    exchange: str
    routing_key: str
    body: bytes
    properties: dict[str, Any] | None
    timing: Timing
    #: the timing fields as given (an idempotent PUT compares these, not the computed start)
    spec: dict[str, Any]
    missed: str = "latest"
    max_missed: int = 100
    paused: bool = False
    created: float = 0.0  # wall
    #: the nominal time of the newest tick handled (fired, or skipped by the policy);
    #: ticks after it are still to come
    fired_up_to: float = 0.0
    #: replayed at a restart: the ticks due now came due while the broker was down
    recovering: bool = False
    next_fire: float | None = None  # wall
    stamp: int = 0  # invalidates its older timer entries
    ticks_fired: int = 0
    ticks_skipped: int = 0
    last_tick: float | None = None  # nominal time of the last tick fired
    last_fired_at: float | None = None  # wall time it fired
    last_lateness_s: float | None = None
    last_error: str | None = None
    deleted: bool = False

    def definition(self) -> dict[str, Any]:
        """What makes two PUTs the same (an equal PUT changes nothing)."""
        return {
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "body": self.body,
            "properties": self.properties,
            "spec": self.spec,
            "missed": self.missed,
            "max_missed": self.max_missed,
        }


@dataclass(slots=True)
class LockGranted(Effect):
    """A waiting acquire got its lock (sent once the lock's record is durable)."""

    channel_id: int
    waiter_id: int
    ref: Any
    info: dict[str, Any]


@dataclass(slots=True)
class LockWaitEnded(Effect):
    """A waiting acquire gave up: ``wait_s`` passed with the lock still held by
    another (``info``: the lock as it is)."""

    channel_id: int
    waiter_id: int
    ref: Any
    info: dict[str, Any]


@dataclass(slots=True)
class TickFired(Effect):
    """A schedule's tick published its message ``lateness_s`` after its nominal time
    (for metrics)."""

    schedule: str
    lateness_s: float


class CoordState:
    """Every lock and schedule of a broker, and the coordination timer heap."""

    def __init__(self) -> None:
        self.locks: dict[str, Lock] = {}
        self.schedules: dict[str, Schedule] = {}
        #: the next fencing token: every acquisition takes one, never reused
        self.next_token = 1
        self.next_waiter = 1
        #: waiter id -> (lock name, waiter), for cancels and timeouts
        self.waiters: dict[int, tuple[str, LockWaiter]] = {}
        #: (monotonic deadline, kind, key, stamp): kind "lock" (expiry; key: name,
        #: stamp: token), "wait" (key: waiter id), "sched" (key: name, stamp: stamp)
        self.heap: list[tuple[float, str, Any, int]] = []
        #: the deadline of the broker timer entry that wakes coordination (None: none)
        self.wake_at: float | None = None
        #: grants waiting for their record to be durable: (lsn, effect)
        self.grants: list[tuple[int, LockGranted]] = []
        #: replayed state whose timers are not yet set (they start at the next take_effects)
        self.needs_start = False
        #: take_effects() has coordination work: grants waiting for the log, or
        #: timers to start after recovery
        self.pending = False
        self.next_stamp = 1
        # metrics
        self.locks_acquired = 0
        self.lock_expiries = 0
        self.ticks_fired = 0
        self.ticks_skipped = 0

    def push(self, deadline: float, kind: str, key: Any, stamp: int = 0) -> None:
        heapq.heappush(self.heap, (deadline, kind, key, stamp))

"""Named locks with an owner, a time to live and a fencing token; and the coordination
timer that locks and schedules share.

Theory of operation
-------------------

A lock is free or held by one *owner* (a string the client chooses, such as
``host-7/pid-311``) until a wall-clock expiry. Every acquisition takes the next
*fencing token* from one broker-wide counter, so tokens grow with every acquisition of
any lock and are never reused (etcd's revisions; Chubby's sequencers): a storage
service that remembers the highest token it has seen can refuse a write from a holder
that lost its lock meanwhile.

* ``lock_acquire``: a free lock is granted at once. A held one is waited for, up to
  ``wait_s``, in arrival order (a FIFO of waiters per lock; the API parks the caller,
  nothing polls); a wait that runs out answers with the lock as it is. An acquire by
  the owner that already holds the lock is a re-acquire: same token, new expiry (so a
  client whose answer was lost can simply ask again).
* ``lock_refresh`` (owner and token must match) extends the expiry; ``lock_release``
  frees the lock and grants it to the first waiter.
* Expiry frees the lock on time, on the monotonic clock while the broker runs. The
  expiry is logged as a wall-clock time: after a restart a lock stays held until
  then (the clocks of the broker host must not jump; see docs/coordination.md).

Durability: each acquisition and refresh is a LOCK_HELD record, each release a
LOCK_RELEASED record; the API answers only once the record is durable, and a grant to
a waiter is sent only then too (``CoordState.grants``), so a token seen by a client
is never handed out again after a crash. Expiry writes nothing: replay compares the
logged expiry with the clock.

:class:`Locks` holds the commands; :class:`CoordTimer` is the one entry on the broker's
timer heap that wakes coordination (locks and schedules) for the earliest deadline of
its own heap; ``coordlog.Coordination`` handles the wake-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import records as rec
from .coordstate import CoordState, Lock, LockGranted, LockWaitEnded, LockWaiter
from .delivery import Deliveries
from .errors import InvalidArgument, PreconditionFailed, ResourceLocked, Unavailable
from .names import check_name
from .shared import Outbox
from .timers import COORD_TIMER, TimerHeap

__all__ = [
    "Locks",
    "CoordTimer",
    "LockBusy",
    "NotLockHolder",
    "MIN_LOCK_TTL_S",
    "MAX_LOCK_TTL_S",
    "MAX_LOCK_WAIT_S",
    "MAX_LOCKS",
    "MAX_LOCK_WAITERS",
    "check_owner",
    "check_lock_ttl",
    "check_lock_wait",
]

MIN_LOCK_TTL_S = 0.1
MAX_LOCK_TTL_S = 7 * 86400.0
MAX_LOCK_WAIT_S = 3600.0
#: Most locks (held or waited for) and waiters of one lock at a time.
MAX_LOCKS = 100_000
MAX_LOCK_WAITERS = 10_000

class LockBusy(ResourceLocked):
    """The lock is held by another owner (and the wait, if any, ran out): 409 with
    the lock as it is (``info``: holder, expiry)."""

    code = "lock_held"

    def __init__(self, message: str, info: dict[str, Any]) -> None:
        super().__init__(message)
        self.info = info

class NotLockHolder(PreconditionFailed):
    """A refresh or release by an owner and token that do not hold the lock (it
    expired, or was never theirs): 409 with the lock as it is."""

    code = "not_lock_holder"

    def __init__(self, message: str, info: dict[str, Any]) -> None:
        super().__init__(message)
        self.info = info

def check_owner(owner: object) -> str:
    """A lock owner: a string of 1..255 bytes without control characters."""
    return check_name("lock owner", owner, allow_reserved=True)

def check_lock_ttl(ttl_s: object) -> float:
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not MIN_LOCK_TTL_S <= ttl_s <= MAX_LOCK_TTL_S:
        raise InvalidArgument(f"ttl_s must be a number of seconds {MIN_LOCK_TTL_S:g}..{MAX_LOCK_TTL_S:g}")
    return float(ttl_s)

def check_lock_wait(wait_s: object) -> float:
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s <= MAX_LOCK_WAIT_S:
        raise InvalidArgument(f"wait_s must be a number of seconds 0..{MAX_LOCK_WAIT_S:g}")
    return float(wait_s)

def check_token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidArgument("token must be a positive integer (the fencing token of the acquire)")
    return token

class CoordTimer:
    """The coordination heap (``CoordState.heap``) and the one entry on the broker's
    timer heap that wakes it, for its earliest deadline."""

    def __init__(self, coord: CoordState, timers: TimerHeap) -> None:
        self._coord = coord
        self._timers = timers

    def at(self, deadline: float, kind: str, key: Any, stamp: int = 0) -> None:
        """Wake coordination at monotonic ``deadline`` for ``(kind, key, stamp)``."""
        coord = self._coord
        coord.push(deadline, kind, key, stamp)
        if coord.wake_at is None or deadline < coord.wake_at:
            coord.wake_at = deadline
            self._timers.push(deadline, COORD_TIMER, 0)

    def rearm(self) -> None:
        """After a wake-up: the broker timer entry for the earliest deadline left."""
        coord = self._coord
        if coord.heap:
            coord.wake_at = coord.heap[0][0]
            self._timers.push(coord.wake_at, COORD_TIMER, 0)

class Locks:
    """Named locks (see the module docstring). Locks live in the shared
    :class:`CoordState`; a waiter belongs to a channel of ``deliveries``."""

    def __init__(
        self,
        coord: CoordState,
        timer: CoordTimer,
        deliveries: Deliveries,
        outbox: Outbox,
        *,
        append: Callable[[int, bytes], int],
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self.coord = coord
        self._timer = timer
        self._deliveries = deliveries
        self._outbox = outbox
        self._append = append
        self._clock = clock
        self._wall_clock = wall_clock

    # ------------------------------------------------------------- commands

    def lock_acquire(
        self, channel_id: int, name: str, owner: object, ttl_s: object, wait_s: object, ref: Any = None
    ) -> tuple[dict[str, Any] | None, int]:
        """Acquire lock ``name`` for ``owner``. Returns ``(info, 0)`` when granted now
        (answer once the log is durable: ``last_lsn`` holds the record), or ``(None,
        waiter id)`` when queued behind the holder: a ``LockGranted`` or
        ``LockWaitEnded`` effect for ``channel_id`` answers it later, carrying ``ref``.

        Raises InvalidArgument (bad name, owner, ttl_s, wait_s), LockBusy (held by
        another and ``wait_s`` is 0), Unavailable (too many locks or waiters)."""
        check_name("lock", name)
        who = check_owner(owner)
        ttl = check_lock_ttl(ttl_s)
        wait = check_lock_wait(wait_s)
        self._deliveries.channel(channel_id)
        coord = self.coord
        lock = coord.locks.get(name)
        if lock is None:
            if len(coord.locks) >= MAX_LOCKS:
                raise Unavailable(f"too many locks (at most {MAX_LOCKS})", code="limit_reached")
            lock = coord.locks[name] = Lock(name)
        now = self._clock()
        if lock.owner is not None and lock.deadline <= now:
            self._expire_lock(lock)  # (its timer has not fired yet)
            lock = coord.locks.setdefault(name, lock)
        if lock.owner is None or lock.owner == who:
            self._hold(lock, who, ttl, new_token=lock.owner is None)
            return lock.info(self._wall_clock()), 0
        if wait <= 0:
            raise LockBusy(f"lock {name!r} is held by {lock.owner!r}", lock.info(self._wall_clock()))
        if len(lock.waiters) >= MAX_LOCK_WAITERS:
            raise Unavailable(f"too many waiters for lock {name!r}", code="limit_reached")
        waiter = LockWaiter(coord.next_waiter, channel_id, who, ttl, now + wait, self._wall_clock(), ref)
        coord.next_waiter += 1
        lock.waiters.append(waiter)
        coord.waiters[waiter.id] = (name, waiter)
        self._timer.at(waiter.deadline, "wait", waiter.id)
        return None, waiter.id

    def lock_cancel_wait(self, waiter_id: int) -> None:
        """Forget a waiting acquire (its caller left). If it was granted the lock and
        the grant is not sent yet (its record not yet durable), the lock is released
        (the next in line gets it). Unknown ids are ignored."""
        entry = self.coord.waiters.pop(waiter_id, None)
        if entry is None:
            self._drop_grant(lambda g: g.waiter_id == waiter_id)
            return
        name, waiter = entry
        lock = self.coord.locks.get(name)
        if lock is not None:
            try:
                lock.waiters.remove(waiter)
            except ValueError:
                pass
            if lock.owner is None and not lock.waiters:
                del self.coord.locks[name]

    def lock_forget_channel(self, channel_id: int) -> None:
        """Channel ``channel_id`` ended: its waiting acquires leave their lines, and a
        lock granted to one whose grant is not sent yet is released."""
        for waiter_id in [w.id for _name, w in self.coord.waiters.values() if w.channel_id == channel_id]:
            self.lock_cancel_wait(waiter_id)
        self._drop_grant(lambda g: g.channel_id == channel_id)

    def _drop_grant(self, which: Callable[[LockGranted], bool]) -> None:
        """Release the locks of the unsent grants ``which`` selects (nobody will hear
        of them)."""
        dropped = [g for _lsn, g in self.coord.grants if which(g)]
        if not dropped:
            return
        self.coord.grants = [(lsn, g) for lsn, g in self.coord.grants if not which(g)]
        for grant in dropped:
            lock = self.coord.locks.get(grant.info["name"])
            if lock is not None and lock.owner == grant.info["owner"] and lock.token == grant.info["token"]:
                self.lock_release(lock.name, lock.owner, lock.token)

    def lock_refresh(self, name: str, owner: object, token: object, ttl_s: object = None) -> dict[str, Any]:
        """Extend the lock ``owner`` holds with ``token`` by ``ttl_s`` from now (default:
        its ttl). Answer once durable. Raises InvalidArgument, NotLockHolder."""
        lock = self._held_by(name, owner, token, "refresh")
        assert lock.owner is not None
        self._hold(lock, lock.owner, lock.ttl_s if ttl_s is None else check_lock_ttl(ttl_s), new_token=False)
        return lock.info(self._wall_clock())

    def lock_release(self, name: str, owner: object, token: object) -> dict[str, Any]:
        """Release the lock ``owner`` holds with ``token``; the first waiter gets it.
        Answer once durable. Returns the lock as it is now. Raises InvalidArgument,
        NotLockHolder."""
        lock = self._held_by(name, owner, token, "release")
        self._append(rec.RecordType.LOCK_RELEASED, rec.encode_json({"name": name, "token": lock.token}))
        lock.owner = None
        self._hand_on(lock)
        return self.lock_info(name)

    def lock_info(self, name: str) -> dict[str, Any]:
        """The lock ``name`` (free if unknown)."""
        check_name("lock", name)
        lock = self.coord.locks.get(name)
        if lock is None:
            lock = Lock(name)
        return lock.info(self._wall_clock())

    def lock_list(self) -> list[dict[str, Any]]:
        """Every held (or waited for) lock, by name."""
        wall = self._wall_clock()
        return [self.coord.locks[name].info(wall) for name in sorted(self.coord.locks)]

    # -------------------------------------------------------------- inside

    def _held_by(self, name: str, owner: object, token: object, what: str) -> Lock:
        check_name("lock", name)
        check_owner(owner)
        check_token(token)
        lock = self.coord.locks.get(name)
        if lock is not None and lock.owner is not None and lock.deadline <= self._clock():
            self._expire_lock(lock)
        lock = self.coord.locks.get(name)
        if lock is None or lock.owner != owner or lock.token != token:
            info = (lock or Lock(name)).info(self._wall_clock())
            held = f"held by {lock.owner!r} with token {lock.token}" if lock is not None and lock.owner else "not held"
            raise NotLockHolder(
                f"cannot {what} lock {name!r}: {owner!r} with token {token} does not hold it (it is {held})", info
            )
        return lock

    def _hold(self, lock: Lock, owner: str, ttl_s: float, *, new_token: bool) -> int:
        """``owner`` holds ``lock`` for ``ttl_s`` from now (a new acquisition takes a
        new token); logs LOCK_HELD and returns its LSN."""
        coord = self.coord
        now, wall = self._clock(), self._wall_clock()
        if new_token:
            lock.token = coord.next_token
            coord.next_token += 1
            lock.acquired = wall
            coord.locks_acquired += 1
        lock.owner = owner
        lock.ttl_s = ttl_s
        lock.expires = wall + ttl_s
        lock.deadline = now + ttl_s
        self._timer.at(lock.deadline, "lock", lock.name, lock.token)
        return self._append(rec.RecordType.LOCK_HELD, rec.encode_json(lock_record(lock)))

    def _expire_lock(self, lock: Lock) -> None:
        self.coord.lock_expiries += 1
        lock.owner = None
        self._hand_on(lock)

    def _hand_on(self, lock: Lock) -> None:
        """``lock`` became free: grant it to the first waiter whose channel is still
        open (its grant leaves once the record is durable), or forget it."""
        coord = self.coord
        while lock.waiters:
            waiter = lock.waiters.popleft()
            coord.waiters.pop(waiter.id, None)
            if waiter.channel_id not in self._deliveries.channels:
                continue
            lsn = self._hold(lock, waiter.owner, waiter.ttl_s, new_token=True)
            coord.grants.append(
                (lsn, LockGranted(waiter.channel_id, waiter.id, waiter.ref, lock.info(self._wall_clock())))
            )
            coord.pending = True
            return
        del coord.locks[lock.name]

    # ------------------------------------------------------ coordination timer

    def timer_fired(self, kind: str, key: Any, stamp: int, deadline: float, wall: float) -> None:
        """A coordination timer entry of kind ``lock`` (expiry) or ``wait`` (a waiter
        giving up) came due; stale ones are ignored."""
        coord = self.coord
        if kind == "lock":
            lock = coord.locks.get(key)
            if lock is not None and lock.owner is not None and lock.token == stamp and lock.deadline == deadline:
                self._expire_lock(lock)
            return
        entry = coord.waiters.get(key)
        if entry is not None and entry[1].deadline == deadline:
            name, waiter = entry
            self.lock_cancel_wait(waiter.id)
            if waiter.channel_id in self._deliveries.channels:
                lock = coord.locks.get(name) or Lock(name)
                self._outbox.emit(LockWaitEnded(waiter.channel_id, waiter.id, waiter.ref, lock.info(wall)))

    def start(self) -> None:
        """After recovery: locks expired meanwhile are free, the others get their timer."""
        now, wall = self._clock(), self._wall_clock()
        for name, lock in list(self.coord.locks.items()):
            if lock.owner is None or lock.expires <= wall:
                del self.coord.locks[name]
                continue
            lock.deadline = now + (lock.expires - wall)
            self._timer.at(lock.deadline, "lock", name, lock.token)

def lock_record(lock: Lock) -> dict[str, Any]:
    """A LOCK_HELD record's payload."""
    return {
        "name": lock.name,
        "owner": lock.owner,
        "token": lock.token,
        "acquired": lock.acquired,
        "expires": lock.expires,
        "ttl_s": lock.ttl_s,
    }

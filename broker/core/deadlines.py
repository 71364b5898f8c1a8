"""Time in the core: the one timer heap read and fired.

Every component that needs waking pushes ``(deadline, owner, key)`` onto the shared
:class:`~broker.core.timers.TimerHeap` and keeps the live deadline itself; entries are
never removed when a deadline moves. :class:`Deadlines` is the one reader of the heap:
:meth:`Deadlines.next_deadline` skips the stale entries and says when the runtime must
next call :meth:`Deadlines.advance`, which fires what is due at its owner: a queue's
timer (delays, expiries, read retries, ``x-expires``: queuetimers.py), coordination's
(locks, schedules), or an unacked delivery's or lease's deadline (delivery.py). The
``Broker`` binds these commands as its own (``Broker.advance``, ...).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from .coordlog import Coordination
from .delivery import Deliveries
from .queues import QueueStore
from .queuetimers import QueueTimers
from .timers import COORD_TIMER, QUEUE_TIMER, TimerHeap

__all__ = ["Deadlines"]


class Deadlines:
    """The timer heap's reader (see the module docstring). Owns nothing: the heap is
    shared, each live deadline is its owner's."""

    def __init__(
        self,
        timers: TimerHeap,
        store: QueueStore,
        queue_timers: QueueTimers,
        coordination: Coordination,
        deliveries: Deliveries,
        *,
        clock: Callable[[], float],
    ) -> None:
        self._timers = timers
        self._store = store
        self._queue_timers = queue_timers
        self._coordination = coordination
        self._deliveries = deliveries
        self._clock = clock

    def next_deadline(self) -> float | None:
        """When :meth:`advance` next has work to do (None: no timer pending)."""
        heap = self._timers.heap
        by_id = self._store.by_id
        coord = self._coordination.coord
        live = self._deliveries.deadline_live
        while heap:
            deadline, owner, key = heap[0]
            if owner == QUEUE_TIMER:
                queue = by_id.get(key)
                stale = queue is None or queue.wake_at != deadline
            elif owner == COORD_TIMER:
                stale = coord.wake_at != deadline
            else:
                stale = not live(owner, key, deadline)
            if not stale:
                return deadline
            heapq.heappop(heap)
        return None

    def earliest_timer(self) -> float | None:
        """The earliest scheduled deadline, possibly stale (cheap; for wake-ups)."""
        return self._timers.earliest()

    def advance(self) -> None:
        """Time passed: deliveries and leases past their deadline go back to their
        queue, queues' timers (delays, expiries, read retries) and coordination's
        (locks, schedules) fire."""
        now = self._clock()
        heap = self._timers.heap
        by_id = self._store.by_id
        coord = self._coordination.coord
        while heap and heap[0][0] <= now:
            deadline, owner, key = heapq.heappop(heap)
            if owner == QUEUE_TIMER:
                queue = by_id.get(key)
                if queue is not None and queue.wake_at == deadline and not queue.deleted:
                    self._queue_timers.wake_queue(queue, now)
            elif owner == COORD_TIMER:
                if coord.wake_at == deadline:
                    self._coordination.wake(now)
            else:
                self._deliveries.deadline_passed(owner, key, deadline)

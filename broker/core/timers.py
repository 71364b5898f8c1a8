"""The broker's one timer heap, shared by the components that need waking.

Entries are ``(monotonic deadline, owner, key)``: ``owner`` is a channel id for an
unacked delivery's ack timeout or lease (``key``: its delivery tag, see delivery.py),
``QUEUE_TIMER`` for a queue's delays, expiries and read retries (``key``: its qid,
see delays.py) or ``COORD_TIMER`` for locks and schedules (see locks.py). Entries are
never removed when their deadline moves: the owner keeps the live deadline and a
popped entry that no longer matches it is skipped (``Broker.advance``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

__all__ = ["TimerHeap", "QUEUE_TIMER", "COORD_TIMER", "TIMERS_COMPACT_MIN"]

#: The owner of a timer entry that wakes a queue (its key is the queue's qid).
QUEUE_TIMER = -1
#: The owner of the timer entry that wakes coordination (locks and schedules).
COORD_TIMER = -2
#: Heap size below which stale entries are not worth a rebuild.
TIMERS_COMPACT_MIN = 1024


class TimerHeap:
    """A heap of ``(deadline, owner, key)`` entries (see the module docstring).

    ``heap`` is the list itself, kept the same object for the heap's whole life, so a
    component on a hot path may bind it once and ``heapq.heappush`` onto it."""

    __slots__ = ("heap", "compact_at")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int]] = []
        #: size at which ``Deliveries`` rebuilds the heap from its live deadlines
        self.compact_at = TIMERS_COMPACT_MIN

    def __len__(self) -> int:
        return len(self.heap)

    def push(self, deadline: float, owner: int, key: int) -> None:
        heapq.heappush(self.heap, (deadline, owner, key))

    def earliest(self) -> float | None:
        """The earliest deadline, possibly stale (cheap; for wake-ups)."""
        return self.heap[0][0] if self.heap else None

    def rebuild(self, live: Iterable[tuple[float, int, int]]) -> None:
        """Replace every delivery entry with ``live`` (the live deadlines of unacked
        deliveries), keeping the queue and coordination entries; the next rebuild
        waits until the heap has doubled."""
        heap = self.heap
        kept = [entry for entry in heap if entry[1] < 0]
        kept.extend(live)
        heap[:] = kept
        heapq.heapify(heap)
        self.compact_at = max(TIMERS_COMPACT_MIN, 2 * len(heap))

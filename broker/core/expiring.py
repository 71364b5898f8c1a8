"""The ready messages of one queue that carry their own ``expiration``, by when they
expire.

With ``x-message-ttl`` alone a queue's messages expire in queue order, so its head is
always the next to expire and needs no index. A per-message ``expiration`` breaks that
order (a short one behind long ones), so each message that carries one is also indexed
here: a dict ``seq -> expires_at`` (wall-clock seconds) and a heap of ``(expires_at,
seq)``. Messages without an expiration never enter it: they cost nothing.

The dict says which messages are indexed; the heap may hold stale pairs (a message that
was delivered, purged, or dropped since), skipped when they reach its top. A message
that leaves the queue's ready messages is *discarded* when that is cheap to know (it
was taken for delivery); otherwise its pair stays until its time, when the queue finds
it gone. When stale pairs outnumber live ones the heap is rebuilt from the dict, so its
size follows the number of indexed messages, not the number of requeues.
"""

from __future__ import annotations

import heapq

__all__ = ["ExpiringMessages"]

#: Heap size below which stale pairs are not worth a rebuild.
_COMPACT_MIN = 64


class ExpiringMessages:
    """A queue's ready messages that carry their own expiration (see the module
    docstring)."""

    __slots__ = ("_at", "_heap")

    def __init__(self) -> None:
        self._at: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._at)

    def __bool__(self) -> bool:
        return bool(self._at)

    def add(self, seq: int, expires_at: float) -> None:
        """Message ``seq`` waits in the queue's ready messages until ``expires_at``."""
        at = self._at
        if at.get(seq) == expires_at:
            return  # (indexed already: its pair is still in the heap)
        at[seq] = expires_at
        heap = self._heap
        heapq.heappush(heap, (expires_at, seq))
        if len(heap) > _COMPACT_MIN and len(heap) > 2 * len(at):
            heap[:] = [(when, s) for s, when in at.items()]
            heapq.heapify(heap)

    def discard(self, seq: int) -> None:
        """Message ``seq`` left the ready messages (taken for delivery, dropped)."""
        self._at.pop(seq, None)

    def clear(self) -> None:
        self._at.clear()
        self._heap.clear()

    def next_due(self) -> float | None:
        """When the first indexed message expires (wall clock), None when none is."""
        heap = self._heap
        at = self._at
        while heap:
            when, seq = heap[0]
            if at.get(seq) == when:
                return when
            heapq.heappop(heap)  # stale
        return None

    def pop_due(self, wall: float) -> list[int]:
        """Remove and return the messages that have expired by ``wall``, earliest first."""
        heap = self._heap
        at = self._at
        out: list[int] = []
        while heap and heap[0][0] <= wall:
            when, seq = heapq.heappop(heap)
            if at.get(seq) == when:
                del at[seq]
                out.append(seq)
        return out

    def items(self) -> list[tuple[int, float]]:
        """``(seq, expires_at)`` of every indexed message (tests, checks)."""
        return list(self._at.items())

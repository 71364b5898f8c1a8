"""One FIFO of a queue's ready messages: a lane.

A plain queue has one lane. A priority queue (``x-max-priority``) has one lane per
priority level and serves the highest non-empty lane first, each in FIFO order, so
everything that keeps a queue's order (requeue to the original place, paging bodies
out to the log and back) is done per lane and holds within each priority.

New entries arrive in increasing sequence order and leave from the front, so every
requeued entry precedes every entry still in ``ready``: requeued entries wait in a
small heap ordered by sequence, which is served before ``ready``.

A durable queue's lane is held in three parts, in this order: ``ready`` (the head, in
memory), ``paged`` (messages whose bodies are only in the log, see
:mod:`broker.core.paging`) and ``tail`` (the newest, in memory until their records
are written and they can be paged out). ``tail`` is used only once ``paged`` or a
long ``ready`` is ahead of it; the broker moves messages between the parts.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from itertools import compress

from .message import Entry
from .paging import PagedRefs

__all__ = ["Lane", "MAX_PRIORITY", "split_by_level"]

#: The largest ``x-max-priority`` (AMQP's priority property is one octet).
MAX_PRIORITY = 255


def _seq_of(entry: Entry) -> int:
    return entry.message.seq


def split_by_level(
    seqs: array[int], locs: array[int], prios: array[int], max_priority: int
) -> Iterator[tuple[int, tuple[array[int], array[int]]]]:
    """Split a recovered queue's ``(seq, locator)`` index (priorities beside it) by
    lane: ``(level, (seqs, locators))`` for each level present, each in sequence
    order. Loops run in C (a million messages at recovery)."""
    levels = prios.tobytes()
    if max_priority < MAX_PRIORITY:  # priorities above the maximum count as the maximum
        levels = levels.translate(bytes(min(p, max_priority) for p in range(256)))
    for level in sorted(set(levels)):
        mask = levels.translate(bytes(p == level for p in range(256)))
        yield level, (array("q", compress(seqs, mask)), array("q", compress(locs, mask)))


class Lane:
    """The ready messages of one priority of a queue, in FIFO order."""

    __slots__ = ("ready", "paged", "tail", "requeued")

    def __init__(self) -> None:
        self.ready: deque[Entry] = deque()
        self.paged = PagedRefs()
        self.tail: deque[Entry] = deque()
        self.requeued: list[tuple[int, Entry]] = []

    def __len__(self) -> int:
        return len(self.ready) + len(self.requeued) + len(self.paged) + len(self.tail)

    def __bool__(self) -> bool:
        return bool(self.ready or self.requeued or self.paged or self.tail)

    def requeue(self, entry: Entry) -> None:
        heapq.heappush(self.requeued, (entry.message.seq, entry))

    def pop(self) -> Entry | None:
        """The next entry held in memory; None when there is none or the next message
        is paged out (the broker pages it in first)."""
        if self.requeued:
            return heapq.heappop(self.requeued)[1]
        if self.ready:
            return self.ready.popleft()
        if self.tail and not self.paged:
            self.ready, self.tail = self.tail, self.ready
            return self.ready.popleft()
        return None

    def head(self) -> Entry | None:
        """The entry :meth:`pop` would return, without taking it."""
        if self.requeued:
            return self.requeued[0][1]
        if self.ready:
            return self.ready[0]
        if self.tail and not self.paged:
            return self.tail[0]
        return None

    def take(self, seq: int) -> Entry | int | None:
        """Remove message ``seq`` from wherever it waits in this lane (an expiry): its
        entry when it is held in memory, its locator when it is paged out, None when
        it is not here. Each part is in sequence order: found by bisection."""
        requeued = self.requeued
        for i, (s, entry) in enumerate(requeued):
            if s == seq:
                requeued[i] = requeued[-1]
                requeued.pop()
                heapq.heapify(requeued)
                return entry
        for part in (self.ready, self.tail):
            if part and part[0].message.seq <= seq <= part[-1].message.seq:
                i = bisect_left(part, seq, key=_seq_of)
                if i < len(part) and part[i].message.seq == seq:
                    entry = part[i]
                    del part[i]
                    return entry
        return self.paged.remove(seq) if self.paged else None

    def held(self) -> list[Entry]:
        """The entries held in memory, in order: requeued, ready, tail."""
        entries = [e for _s, e in self.requeued]
        entries.extend(self.ready)
        entries.extend(self.tail)
        return entries

    def clear(self) -> tuple[list[Entry], list[int]]:
        """Remove every message: (entries held in memory, seqs of paged-out ones)."""
        entries = [e for _s, e in self.requeued]
        entries.extend(self.ready)
        entries.extend(self.tail)
        self.requeued.clear()
        self.ready.clear()
        self.tail.clear()
        return entries, self.paged.clear()

    def remove_entries(self, seqs: set[int]) -> list[Entry]:
        """Remove in-memory entries with these sequence numbers."""
        removed = [e for e in self.ready if e.message.seq in seqs]
        if removed:
            self.ready = deque(e for e in self.ready if e.message.seq not in seqs)
        gone = [e for e in self.tail if e.message.seq in seqs]
        if gone:
            removed.extend(gone)
            self.tail = deque(e for e in self.tail if e.message.seq not in seqs)
        kept = [(s, e) for s, e in self.requeued if s not in seqs]
        if len(kept) != len(self.requeued):
            removed.extend(e for s, e in self.requeued if s in seqs)
            heapq.heapify(kept)
            self.requeued = kept
        return removed

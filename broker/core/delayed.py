"""The delayed messages of one queue: held back until a wall-clock time, by due time.

Messages whose record is written are *paged out* as ready ones are (see
:mod:`broker.core.paging`): their bodies stay in the log, and the queue keeps three
integers each, the due time (ms), the sequence number and the locator (``lsn << 1 |
delivered``). Delays mostly come due in the order they were made (a service retries
with the same delay; a publisher delays everything by the same amount), so those
triples go to a FIFO of ``array('q')`` chunks in due order, 24 bytes a message; one due
earlier than the last goes to a heap of packed ints (``due_ms << 128 | seq << 64 |
locator``, about 56 bytes). The messages whose record is not yet written (or that have
none: transient messages, queues without a log) stay whole in a heap of ``(due, seq,
entry)``. All order by due time, then sequence number.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Iterable, Iterator

from .message import Entry

__all__ = ["DelayedMessages"]

_MASK64 = (1 << 64) - 1


def _pack(due_ms: int, seq: int, loc: int) -> int:
    return (due_ms << 128) | (seq << 64) | loc


def _unpack(key: int) -> tuple[int, int, int]:
    """``(due_ms, seq, locator)``."""
    return key >> 128, (key >> 64) & _MASK64, key & _MASK64


_CHUNK_INTS = 3 * 2048  # (due_ms, seq, locator) triples per chunk of the FIFO


class DelayedMessages:
    """A queue's delayed messages (see the module docstring)."""

    __slots__ = ("entries", "_ordered", "_head", "_ordered_count", "_heap")

    def __init__(self) -> None:
        self.entries: list[tuple[float, int, Entry]] = []
        self._ordered: deque[array[int]] = deque()
        self._head = 0  # index into _ordered[0] of its first triple still held
        self._ordered_count = 0
        self._heap: list[int] = []

    def __len__(self) -> int:
        return len(self.entries) + self._ordered_count + len(self._heap)

    def __bool__(self) -> bool:
        return bool(self.entries or self._ordered_count or self._heap)

    @property
    def paged_count(self) -> int:
        return self._ordered_count + len(self._heap)

    def push_entry(self, due: float, entry: Entry) -> None:
        heapq.heappush(self.entries, (due, entry.message.seq, entry))

    def push_paged(self, due_ms: int, seq: int, loc: int) -> None:
        chunks = self._ordered
        if chunks and due_ms < chunks[-1][-3]:
            heapq.heappush(self._heap, _pack(due_ms, seq, loc))
            return
        if not chunks or len(chunks[-1]) >= _CHUNK_INTS:
            chunks.append(array("q"))
        last = chunks[-1]
        last.append(due_ms)
        last.append(seq)
        last.append(loc)
        self._ordered_count += 1

    def extend_paged(self, dues_ms: Iterable[int], seqs: Iterable[int], locs: Iterable[int]) -> None:
        for due, seq, loc in zip(dues_ms, seqs, locs):
            self.push_paged(due, seq, loc)

    def _ordered_front(self) -> int | None:
        """Due time (ms) of the FIFO's first triple."""
        return self._ordered[0][self._head] if self._ordered_count else None

    def next_due(self) -> float | None:
        """The earliest due time (epoch seconds), or None when empty."""
        candidates = []
        if self.entries:
            candidates.append(self.entries[0][0])
        front = self._ordered_front()
        if front is not None:
            candidates.append(front / 1000.0)
        if self._heap:
            candidates.append((self._heap[0] >> 128) / 1000.0)
        return min(candidates) if candidates else None

    def pop_due(self, wall: float) -> tuple[list[Entry], list[tuple[int, int, int]]]:
        """Remove what is due at ``wall``: (whole entries, ``(due_ms, seq, locator)``
        of paged-out ones)."""
        entries: list[Entry] = []
        while self.entries and self.entries[0][0] <= wall:
            entries.append(heapq.heappop(self.entries)[2])
        paged: list[tuple[int, int, int]] = []
        limit = int(wall * 1000.0)
        while self._heap and self._heap[0] >> 128 <= limit:
            paged.append(_unpack(heapq.heappop(self._heap)))
        chunks = self._ordered
        while self._ordered_count:
            first = chunks[0]
            head = self._head
            if first[head] > limit:
                break
            paged.append((first[head], first[head + 1], first[head + 2]))
            self._ordered_count -= 1
            head += 3
            if head >= len(first):
                chunks.popleft()
                head = 0
            self._head = head
        return entries, paged

    def take_pageable(self, durable_lsn: int) -> list[tuple[float, Entry]]:
        """Remove and return the whole entries whose record is written (``lsn`` up
        to ``durable_lsn``): the caller pages them out."""
        keep: list[tuple[float, int, Entry]] = []
        out: list[tuple[float, Entry]] = []
        for item in self.entries:
            message = item[2].message
            if message.persistent and 0 < message.lsn <= durable_lsn:
                out.append((item[0], item[2]))
            else:
                keep.append(item)
        if out:
            heapq.heapify(keep)
            self.entries = keep
        return out

    def has_unwritten(self) -> bool:
        """Whether a whole entry waits for its record to be written (to be paged out)."""
        return any(e.message.persistent and e.message.lsn for _d, _s, e in self.entries)

    def whole(self) -> list[Entry]:
        return [e for _d, _s, e in self.entries]

    def paged_items(self) -> Iterator[tuple[int, int, int]]:
        """``(due_ms, seq, locator)`` of every paged-out one, in no particular order."""
        head = self._head
        for chunk in self._ordered:
            it = iter(chunk[head:])
            yield from zip(it, it, it)
            head = 0
        for key in self._heap:
            yield _unpack(key)

    def due_times(self) -> list[tuple[int, int]]:
        """``(seq, due in ms since the epoch)`` of every delayed message, by seq."""
        out = [(seq, round(due * 1000.0)) for due, seq, _e in self.entries]
        out.extend((seq, due_ms) for due_ms, seq, _loc in self.paged_items())
        out.sort()
        return out

    def remove_whole(self, seqs: set[int]) -> list[Entry]:
        """Remove the whole entries with these sequence numbers (their records failed)."""
        removed = [e for _d, s, e in self.entries if s in seqs]
        if removed:
            self.entries = [item for item in self.entries if item[1] not in seqs]
            heapq.heapify(self.entries)
        return removed

    def clear(self) -> tuple[list[Entry], list[int]]:
        """Remove everything: (whole entries, sequence numbers of paged-out ones)."""
        entries = self.whole()
        seqs = [seq for _due, seq, _loc in self.paged_items()]
        self.entries = []
        self._ordered = deque()
        self._head = 0
        self._ordered_count = 0
        self._heap = []
        return entries, seqs

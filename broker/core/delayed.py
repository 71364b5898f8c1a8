"""The delayed messages of one queue: held back until a wall-clock time, by due time.

Two heaps. Messages whose record is written are *paged out* as ready ones are (see
:mod:`broker.core.paging`): one Python int each, packing the due time (ms), the sequence
number and the locator (``lsn << 1 | delivered``) as ``due_ms << 128 | seq << 64 |
locator``, about 56 bytes with its list slot, so that a million delayed messages cost
tens of megabytes, not the half a gigabyte their entries would. The others (record not
yet written, transient messages, queues without a log) stay whole in a heap of
``(due, seq, entry)``. Both order by due time, then sequence number.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from .message import Entry

__all__ = ["DelayedMessages"]

_MASK64 = (1 << 64) - 1


def _pack(due_ms: int, seq: int, loc: int) -> int:
    return (due_ms << 128) | (seq << 64) | loc


def _unpack(key: int) -> tuple[int, int, int]:
    """``(due_ms, seq, locator)``."""
    return key >> 128, (key >> 64) & _MASK64, key & _MASK64


class DelayedMessages:
    """A queue's delayed messages (see the module docstring)."""

    __slots__ = ("entries", "paged")

    def __init__(self) -> None:
        self.entries: list[tuple[float, int, Entry]] = []
        self.paged: list[int] = []

    def __len__(self) -> int:
        return len(self.entries) + len(self.paged)

    def __bool__(self) -> bool:
        return bool(self.entries or self.paged)

    def push_entry(self, due: float, entry: Entry) -> None:
        heapq.heappush(self.entries, (due, entry.message.seq, entry))

    def push_paged(self, due_ms: int, seq: int, loc: int) -> None:
        heapq.heappush(self.paged, _pack(due_ms, seq, loc))

    def extend_paged(self, dues_ms: Iterable[int], seqs: Iterable[int], locs: Iterable[int]) -> None:
        """Many paged-out ones at once (recovery): one heapify, not a push each."""
        self.paged.extend(_pack(due, seq, loc) for due, seq, loc in zip(dues_ms, seqs, locs))
        heapq.heapify(self.paged)

    def next_due(self) -> float | None:
        """The earliest due time (epoch seconds), or None when empty."""
        due = self.entries[0][0] if self.entries else None
        if self.paged:
            paged_due = (self.paged[0] >> 128) / 1000.0
            due = paged_due if due is None else min(due, paged_due)
        return due

    def pop_due(self, wall: float) -> tuple[list[Entry], list[tuple[int, int, int]]]:
        """Remove what is due at ``wall``: (whole entries, ``(due_ms, seq, locator)``
        of paged-out ones)."""
        entries: list[Entry] = []
        while self.entries and self.entries[0][0] <= wall:
            entries.append(heapq.heappop(self.entries)[2])
        paged: list[tuple[int, int, int]] = []
        limit = int(wall * 1000.0)
        while self.paged and self.paged[0] >> 128 <= limit:
            paged.append(_unpack(heapq.heappop(self.paged)))
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
        return (_unpack(key) for key in self.paged)

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
        self.paged = []
        return entries, seqs

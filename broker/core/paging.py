"""Paged-out messages: the compact in-memory index of a queue's backlog.

A durable queue keeps in memory (as :class:`~broker.core.message.Entry` objects with
their bodies) only the messages about to be delivered; the rest of its backlog is
*paged out*: their bodies live only in the log segments, where their ENQUEUE records
are, and the queue keeps per message two integers, its sequence number and a *locator*
(``lsn << 1 | delivered``), 16 bytes instead of about 500. When the in-memory head runs
out, the broker reads the next records back by LSN (paging in).

:class:`PagedRefs` is that index for one queue: a FIFO of ``array('q')`` chunks holding
``seq, locator`` pairs, in sequence order. Taking from the front only moves an offset
and appending never moves a pair, so a checkpoint can keep references to the chunks
and encode them later while the queue goes on changing; the one change made in place,
pointing a message at a relocated copy of its record (compaction), is harmless to such
a checkpoint: it refers to one copy or the other, and both exist.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import compress
from typing import Any

from .totals import Totals

__all__ = ["PagedRefs", "ReplayIndex", "CHUNK_MESSAGES", "locator", "mark_all_delivered"]

#: Messages per chunk (two 8-byte integers each: 32 KiB a chunk).
CHUNK_MESSAGES = 2048
_CHUNK_INTS = 2 * CHUNK_MESSAGES


def locator(lsn: int, delivered: bool) -> int:
    """What the index keeps besides the sequence number: the ENQUEUE record's LSN and
    whether the message was delivered before."""
    return (lsn << 1) | delivered


_SET_BIT0 = bytes(b | 1 for b in range(256))


def mark_all_delivered(locators: array[int]) -> array[int]:
    """``locators`` with every delivered bit (bit 0) set, without a loop in Python on
    a little-endian machine: bit 0 of an int64 is bit 0 of its first byte."""
    if sys.byteorder != "little":
        return array("q", (loc | 1 for loc in locators))
    raw = bytearray(locators.tobytes())
    raw[0::8] = raw[0::8].translate(_SET_BIT0)
    out = array("q")
    out.frombytes(raw)
    return out


#: Where a lane not yet adopted by a broker counts (nobody reads it).
_UNCOUNTED = Totals()


class PagedRefs:
    """The paged-out messages of one queue, oldest first. Each change of their number
    is counted in ``totals.paged`` too (the broker's running counts, set when the
    queue store adopts the queue: see totals.py)."""

    __slots__ = ("_chunks", "_head", "_count", "totals")

    def __init__(self) -> None:
        self._chunks: deque[array[int]] = deque()
        self._head = 0  # index into _chunks[0] of the first pair still queued
        self._count = 0
        self.totals = _UNCOUNTED

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def append(self, seq: int, loc: int) -> None:
        chunks = self._chunks
        if not chunks or len(chunks[-1]) >= _CHUNK_INTS:
            chunks.append(array("q"))
        last = chunks[-1]
        last.append(seq)
        last.append(loc)
        self._count += 1
        self.totals.paged += 1

    def extend(self, seqs: array[int], locs: array[int]) -> None:
        """Append many pairs at once (recovery: a million in C loops, not Python ones).
        They go to chunks of their own: a chunk need not be full to have one after it."""
        n = len(seqs)
        for start in range(0, n, CHUNK_MESSAGES):
            stop = min(n, start + CHUNK_MESSAGES)
            chunk = array("q", bytes(16 * (stop - start)))
            chunk[0::2] = seqs[start:stop]
            chunk[1::2] = locs[start:stop]
            self._chunks.append(chunk)
        self._count += n
        self.totals.paged += n

    def first_seq(self) -> int | None:
        """The seq of the oldest paged-out message (None: there is none)."""
        head = self._head
        for chunk in self._chunks:
            if head < len(chunk):
                return chunk[head]
            head = 0
        return None

    def take(self, n: int) -> list[tuple[int, int]]:
        """Remove and return up to ``n`` ``(seq, locator)`` pairs from the front."""
        out: list[tuple[int, int]] = []
        chunks = self._chunks
        while len(out) < n and chunks:
            first = chunks[0]
            head = self._head
            stop = min(len(first), head + 2 * (n - len(out)))
            it = iter(first[head:stop])
            out.extend(zip(it, it))
            if stop >= len(first):
                chunks.popleft()  # (even the last, partly filled one: appends start anew)
                self._head = 0
            else:
                self._head = stop
        self._count -= len(out)
        self.totals.paged -= len(out)
        return out

    def put_back(self, pairs: list[tuple[int, int]]) -> None:
        """Return pairs just taken (oldest first) to the front, where they were."""
        if not pairs:
            return
        chunks = self._chunks
        if self._head and chunks:
            chunks[0] = chunks[0][self._head :]
            self._head = 0
        front = array("q", bytes(16 * len(pairs)))
        front[0::2] = array("q", [seq for seq, _loc in pairs])
        front[1::2] = array("q", [loc for _seq, loc in pairs])
        chunks.appendleft(front)
        self._count += len(pairs)
        self.totals.paged += len(pairs)

    def clear(self) -> list[int]:
        """Remove everything; return the sequence numbers removed."""
        seqs = [seq for seq, _loc in self]
        self._chunks = deque()
        self._head = 0
        self._count = 0
        self.totals.paged -= len(seqs)
        return seqs

    def __iter__(self) -> Iterator[tuple[int, int]]:
        head = self._head
        for chunk in self._chunks:
            it = iter(chunk[head:])
            yield from zip(it, it)
            head = 0

    def relocate(self, seq: int, lsn: int) -> bool:
        """Point message ``seq`` at a new copy of its record (compaction), keeping its
        delivered flag; False if it is not here (any more). Pairs are in sequence order."""
        found = find_pair(self._chunks, self._head, seq)
        if found is None:
            return False
        chunk, i = found
        chunk[i + 1] = (lsn << 1) | (chunk[i + 1] & 1)
        return True

    def remove(self, seq: int) -> int | None:
        """Remove message ``seq`` from wherever it is (an expiry, see expiry.py); return
        its locator, or None if it is not here. Its chunk is replaced by a copy
        without it, never changed in place: a checkpoint may hold the old one (see
        the module docstring)."""
        found = find_pair(self._chunks, self._head, seq)
        if found is None:
            return None
        chunk, i = found
        chunks = self._chunks
        index = next(k for k, c in enumerate(chunks) if c is chunk)
        loc = chunk[i + 1]
        rest = chunk[:i] + chunk[i + 2 :]
        if len(rest) > (self._head if index == 0 else 0):
            chunks[index] = rest
        else:  # nothing left in it
            del chunks[index]
            if index == 0:
                self._head = 0
        self._count -= 1
        self.totals.paged -= 1
        return loc

    def cut(self) -> list[tuple[array[int], int, int]]:
        """References to the current contents as ``(chunk, start, stop)`` slices, for a
        checkpoint to encode later (see the module docstring)."""
        out = []
        head = self._head
        for chunk in self._chunks:
            out.append((chunk, head, len(chunk)))
            head = 0
        return out


def find_pair(chunks: "deque[array[int]]", head: int, seq: int) -> tuple[array[int], int] | None:
    """The chunk and index of ``seq`` in sorted ``(seq, locator)`` chunks, or None."""
    lo_c, hi_c = 0, len(chunks) - 1
    while lo_c <= hi_c:  # the chunk whose range holds seq
        mid = (lo_c + hi_c) // 2
        chunk = chunks[mid]
        start = head if mid == 0 else 0
        if start >= len(chunk) or seq < chunk[start]:
            hi_c = mid - 1
        elif seq > chunk[-2]:
            lo_c = mid + 1
        else:
            lo, hi = start // 2, len(chunk) // 2 - 1
            while lo <= hi:
                m = (lo + hi) // 2
                value = chunk[2 * m]
                if value == seq:
                    return chunk, 2 * m
                if value < seq:
                    lo = m + 1
                else:
                    hi = m - 1
            return None
    return None


def on_disk_mask(locators: array[int], spans: Sequence[tuple[int, int]]) -> bytes | None:
    """Which of ``locators`` point at a record on disk, ``spans`` being the LSN ranges
    ``[first, end)`` the log holds (in order): None when all of them do (the common
    case, found without a loop per message), else a mask, 1 for a record on disk."""
    if not locators:
        return None
    lo, hi = min(locators) >> 1, max(locators) >> 1
    for first, end in spans:
        if first <= lo and hi < end:
            return None
    firsts = [first for first, _end in spans]
    mask = bytearray(len(locators))
    for i, loc in enumerate(locators):
        lsn = loc >> 1
        j = bisect_right(firsts, lsn) - 1
        if j >= 0 and lsn < spans[j][1]:
            mask[i] = 1
    return None if 0 not in mask else bytes(mask)


class ReplayIndex:
    """One queue's messages while the log is replayed at recovery: ``seq -> locator``
    (or an in-memory entry, for a message recovered whole from an older checkpoint).

    Logged publishes arrive in sequence order, so the common case is two growing arrays
    searched by bisection, with no object per message: a million recovered messages
    cost 16 MB here, not the hundred or so of a dict of ints, and leave no heap behind
    fragmented by a million small objects freed at the end. Out-of-order arrivals
    (checkpoint references to requeued or unacked messages, entries recovered whole) go
    to a small dict. A settled message is marked dead (locator -1) in place.
    """

    __slots__ = (
        "seqs", "locs", "extra", "counts", "due_seqs", "due_ms", "due_extra", "prios", "extra_prios", "expiring",
    )

    def __init__(self, *, priorities: bool = False) -> None:
        self.seqs = array("q")
        self.locs = array("q")
        self.extra: dict[int, Any] = {}
        #: a priority queue's: each message's priority, beside ``seqs`` (one byte a
        #: message), and those of the messages in ``extra`` indexed by LSN
        self.prios: array[int] | None = array("B") if priorities else None
        self.extra_prios: dict[int, int] = {}
        #: delivery counts above one, by seq (few: a dict); the larger value read wins
        self.counts: dict[int, int] = {}
        #: due times (ms since the epoch) of delayed messages: there may be a million
        #: (delayed publishes, in sequence order), so two arrays as for the messages,
        #: and a dict for the few out of order (nack delays); the larger value wins
        self.due_seqs = array("q")
        self.due_ms = array("q")
        self.due_extra: dict[int, int] = {}
        #: when the messages that carry their own expiration expire (wall-clock
        #: seconds), by seq: from their records and the checkpoint's EXPIRES
        self.expiring: dict[int, float] = {}

    def raise_count(self, seq: int, count: int) -> None:
        if count > self.counts.get(seq, 0):
            self.counts[seq] = count

    def raise_due(self, seq: int, due_ms: int) -> None:
        seqs = self.due_seqs
        if not seqs or seq > seqs[-1]:
            seqs.append(seq)
            self.due_ms.append(due_ms)
        elif seq == seqs[-1]:
            self.due_ms[-1] = max(self.due_ms[-1], due_ms)
        elif due_ms > self.due_extra.get(seq, 0):
            self.due_extra[seq] = due_ms

    def due_after(self, now_ms: float) -> tuple[array[int], array[int]]:
        """``(seqs, due times)`` of the messages due after ``now_ms``, by seq (each
        message once, with the largest due time read; settled ones included)."""
        seqs, dues = self.due_seqs, self.due_ms
        if self.due_extra:
            merged = dict(zip(seqs, dues))
            for seq, due in self.due_extra.items():
                if due > merged.get(seq, 0):
                    merged[seq] = due
            pairs = sorted(merged.items())
            seqs = array("q", [s for s, _d in pairs])
            dues = array("q", [d for _s, d in pairs])
        later = bytes(d > now_ms for d in dues)
        return array("q", compress(seqs, later)), array("q", compress(dues, later))

    def _index(self, seq: int) -> int:
        seqs = self.seqs
        if not seqs or seq > seqs[-1]:
            return -1
        i = bisect_left(seqs, seq)
        return i if i < len(seqs) and seqs[i] == seq else -1

    def __contains__(self, seq: int) -> bool:
        i = self._index(seq)
        return self.locs[i] >= 0 if i >= 0 else seq in self.extra

    def add(self, seq: int, loc: int, *, update: bool, prio: int = 0) -> None:
        """Index a logged message (of priority ``prio``, in a priority queue). If it is
        already there, ``update`` points it at this (newer) copy of its record, keeping
        its delivered flag."""
        seqs = self.seqs
        if not seqs or seq > seqs[-1]:
            seqs.append(seq)
            self.locs.append(loc)
            if self.prios is not None:
                self.prios.append(prio)
            return
        i = self._index(seq)
        if i >= 0:
            old = self.locs[i]
            if old < 0:
                self.locs[i] = loc  # settled before, logged again: present again
            elif update:
                self.locs[i] = loc | (old & 1)
            return
        old_extra = self.extra.get(seq)
        if old_extra is None:
            self.extra[seq] = loc
            if prio:
                self.extra_prios[seq] = prio
        elif update and type(old_extra) is int:
            self.extra[seq] = loc | (old_extra & 1)

    def add_whole(self, seq: int, entry: Any) -> None:
        """A message recovered whole (with its body), if not already there."""
        if seq not in self:
            self.extra[seq] = entry

    def settle(self, seq: int) -> None:
        i = self._index(seq)
        if i >= 0:
            self.locs[i] = -1
        else:
            self.extra.pop(seq, None)

    def mark_delivered(self, seq: int) -> None:
        i = self._index(seq)
        if i >= 0:
            if self.locs[i] >= 0:
                self.locs[i] |= 1
            return
        old = self.extra.get(seq)
        if old is None:
            return
        if type(old) is int:
            self.extra[seq] = old | 1
        elif not old.deliveries:
            old.deliveries = 1

    def logged(self) -> tuple[array[int], array[int], array[int] | None] | None:
        """``(seqs, locators, priorities or None)`` of every message present, when all
        of them are indexed by LSN (no whole ones): the common case, handed over
        without a loop per message but the one that drops settled messages. None
        otherwise (use :meth:`items`)."""
        if self.extra:
            return None
        seqs, locs, prios = self.seqs, self.locs, self.prios
        if locs and min(locs) < 0:
            live = bytes(loc >= 0 for loc in locs)
            seqs = array("q", compress(seqs, live))
            locs = array("q", compress(locs, live))
            if prios is not None:
                prios = array("B", compress(prios, live))
        return seqs, locs, prios

    def priority(self, seq: int) -> int:
        """The priority indexed for message ``seq`` (0 if none was)."""
        i = self._index(seq)
        if i >= 0 and self.prios is not None:
            return self.prios[i]
        return self.extra_prios.get(seq, 0)

    def items(self) -> Iterator[tuple[int, Any]]:
        """``(seq, locator or entry)`` of every message present, in sequence order."""
        extra = sorted(self.extra.items())
        k = 0
        seqs, locs = self.seqs, self.locs
        for i in range(len(seqs)):
            loc = locs[i]
            if loc < 0:
                continue
            seq = seqs[i]
            while k < len(extra) and extra[k][0] < seq:
                yield extra[k]
                k += 1
            yield seq, loc
        yield from extra[k:]

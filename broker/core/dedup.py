"""Publish deduplication window.

A publish carrying a ``message_id`` already seen on the same exchange within the
window is acknowledged again without being enqueued again. The window is by wall-clock
time (it must survive restarts, so it travels in the log and in checkpoints).

There is one entry per publish in the window: a million at 8k msgs/s over the default
two minutes, while the whole broker must hold a million queued messages in 150 MB. So an
entry is a few machine words in flat arrays, never a Python object: about 42 bytes an
entry at a million entries, where a dict of strings took about 150.

Rules and layout:

* **Key.** An entry is keyed by :func:`digest`, 64 bits of BLAKE2b over
  ``exchange + "\\0" + message_id`` (UTF-8; exchange names hold no control characters,
  so the separator is unambiguous), 0 (the empty slot) and 1 (reserved) moved to 2 and
  3. It is stable across processes (it is written to checkpoints), which Python's
  ``hash()`` is not. The id itself is not kept, so two ids with the same digest are
  taken for one: a new publish is taken for a duplicate, acknowledged and dropped, with
  probability about ``len(window) / 2**64`` (5e-14 with a million entries). At 8k
  msgs/s around the clock with a full window that is one lost message in about 70
  years, below the rate of undetected disk and memory corruption that a broker cannot
  help either; keys of 128 bits would cost 25 more bytes an entry, 60% more. BLAKE2b
  rather than a cheaper checksum so that a client cannot choose a ``message_id`` that
  collides with somebody else's (that is a second preimage: 2**64 hashes).
* **Table.** Open addressing with linear probing in one ``array('Q')``, ``_table``: slot
  ``s`` is the digest at ``2s`` (0 = empty) and its value at ``2s + 1``, side by side so
  that a hit costs one cache miss, not two. A value packs ``lsn_tag << 44 | wall_ms`` (44
  bits of milliseconds last until the year 2527). The table doubles when it is 70% full
  and is rebuilt smaller when a prune leaves it less than 1/8 full, so memory is given
  back after a burst. A deletion shifts the following entries of its cluster back
  (Knuth's algorithm R) instead of leaving a tombstone: tombstones pile up under the
  window's steady insert-one-delete-one traffic and force a full rebuild (a pause of
  about 0.4 s at a million entries) every few minutes.
* **LSN tag.** The 20 bits beside the time cannot hold the LSN the first publish waited
  on (LSNs pass 2**20 after a million records), so they hold a tag, 1 + (LSN - 1)
  modulo 2**20 - 1 (0 for "no wait"), and :meth:`lookup` answers the largest LSN with
  that tag not above the largest LSN remembered. That is exact for an entry less than a
  million LSNs old. For an older one it is a later LSN than its own, but never one not
  yet issued: the duplicate's confirm waits a little longer than needed (the original
  was durable long before), never forever and never less than needed.
* **Expiry order.** ``_chunks`` is a FIFO of the digests in the order they were
  remembered (= time order), in ``array('Q')`` chunks of 1024; ``_chunk_max`` holds the
  newest time in each full chunk, ``_tail_max`` that of the last chunk. A refreshed or
  forgotten entry leaves a stale item behind, so an item deletes its entry only if the
  table's time for it is before the horizon. A chunk whose newest time is before the
  horizon is consumed whole (an entry skipped there is newer than the chunk, so a later
  item stands for it). The first chunk not wholly expired is scanned to its end (at most
  1024 probes a prune), dropping expired entries, and consumed up to the first item that
  may stand for a live entry. With a steady clock a prune so drops every expired entry;
  a clock stepping back can only delay freeing, never an answer of :meth:`lookup`.
* Expired entries are dropped in batches, at most every ``window_s / 64``, so the cost
  of pruning is paid in few long strides. :meth:`lookup` still applies the exact window
  (an expired hit is dropped and reported as unseen), so batching only delays when
  memory is freed.
* A checkpoint writes the live entries in time order as ``DEDUP_DIGESTS`` payloads
  (:meth:`checkpoint_payloads`); recovery replays them (:meth:`load_payload`) and then
  the log's publishes (:meth:`remember`).

The keys (:func:`digest`) and the checkpoint payloads' byte layout live in
``dedupkeys.py``; this module is the window itself. Its probe loops are written out in
each operation (a call per probe doubled the cost of a publish), which repeats a few
lines on purpose.
"""

from __future__ import annotations

from array import array
from collections import deque
from itertools import compress

from .dedupkeys import decode_payload, digest, digest_utf8, encode_payloads

__all__ = ["DedupWindow", "digest", "digest_utf8"]

_MS_BITS = 44
_MS_MASK = (1 << _MS_BITS) - 1
# LSN tags are 1.._LSN_MOD; 0 means "no wait" (the publish was durable or unknown)
_LSN_MOD = (1 << (64 - _MS_BITS)) - 1
_MIN_SLOTS = 1024  # a power of two
_CHUNK = 1024  # digests per FIFO chunk (the most a prune scans beyond expired ones)
_REST_HINT_MAX = 1 << 24  # trust a payload's size hint up to 16M entries (a 512 MB table)

def _ms(wall_s: float) -> int:
    return round(wall_s * 1000.0)


def _slots_for(count: int) -> int:
    """Table size for ``count`` entries: at most half full after a rebuild."""
    slots = _MIN_SLOTS
    while slots < 2 * count:
        slots *= 2
    return slots


def _zeros(n: int) -> array[int]:
    return array("Q", [0]) * n  # exactly n slots (array("Q", bytes(...)) allocates 1/16 more)


class DedupWindow:
    """Message ids seen per exchange in the last ``window_s`` seconds (see the module
    docstring for the rules). ``window_s <= 0`` disables deduplication."""

    __slots__ = (
        "_window_s",
        "_window_ms",
        "_table",
        "_mask",
        "_count",
        "_grow_above",
        "_shrink_below",
        "_chunks",
        "_chunk_max",
        "_tail",
        "_tail_max",
        "_head",
        "_next_prune_ms",
        "_max_lsn",
        "_last_exchange",
        "_last_id",
        "_last_digest",
        "_last_slot",
    )

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._window_ms = _ms(window_s)
        self._count = 0
        self._set_table(_zeros(2 * _MIN_SLOTS))
        self._tail: array[int] = array("Q")
        self._chunks: deque[array[int]] = deque([self._tail])
        self._chunk_max: deque[int] = deque()  # newest time of every chunk but the tail
        self._tail_max = 0
        self._head = 0  # items of _chunks[0] already consumed
        self._next_prune_ms = 0
        self._max_lsn = 0
        # the digest of the last lookup, for the remember that usually follows it
        self._last_exchange = ""
        self._last_id = ""
        self._last_digest = digest("", "")
        # the empty slot where that lookup ended, while no entry has moved since (-1:
        # none): the remember that follows a miss inserts there without probing again
        self._last_slot = -1

    @property
    def window_s(self) -> float:
        return self._window_s

    def clear(self) -> None:
        """Forget every entry (recovery, when it cannot tell which ids to trust)."""
        max_lsn = self._max_lsn
        self.__init__(self._window_s)  # type: ignore[misc]
        self._max_lsn = max_lsn

    def __len__(self) -> int:
        """Entries held: live ones, and expired ones not yet pruned."""
        return self._count

    def slots(self) -> int:
        """Size of the lookup table (for tests and statistics)."""
        return len(self._table) // 2

    # ------------------------------------------------------------------ lookups
    #
    # Probing works on doubled slot numbers: ``j = 2 * slot`` holds the key and ``j + 1``
    # the value; ``(d << 1) & mask`` is the home of digest d, ``(j + 2) & mask`` the next
    # slot (mask = 2 * slots - 2). The loops are written out in each method: a call per
    # probe would double the cost of a publish.

    def lookup(self, exchange: str, message_id: str, wall_s: float) -> int | None:
        """The LSN the first publish of this id waited on (0 if it did not wait), or
        None if the id was not seen on this exchange in the window ending at ``wall_s``.

        Raises UnicodeEncodeError for a string that is not valid Unicode."""
        if self._window_s <= 0:
            return None
        now_ms = round(wall_s * 1000.0)
        if now_ms >= self._next_prune_ms:
            self._prune_ms(now_ms)
        d = digest(exchange, message_id)
        self._last_exchange = exchange
        self._last_id = message_id
        self._last_digest = d
        table = self._table
        mask = self._mask
        j = (d << 1) & mask
        while True:
            k = table[j]
            if k == d:
                break
            if not k:
                self._last_slot = j
                return None
            j = (j + 2) & mask
        self._last_slot = -1
        packed = table[j + 1]
        if (packed & _MS_MASK) < now_ms - self._window_ms:
            self._delete(j)
            return None
        tag = packed >> _MS_BITS
        if not tag:
            return 0
        top = self._max_lsn
        return top - (top - tag) % _LSN_MOD

    def remember(self, exchange: str, message_id: str, wall_s: float, lsn: int) -> None:
        """Record a publish of ``message_id`` at ``wall_s`` whose confirm waits on
        ``lsn`` (0: none). An id already present is refreshed: new time, new LSN.

        Raises UnicodeEncodeError for a string that is not valid Unicode."""
        if self._window_s <= 0:
            return
        if message_id is self._last_id and exchange is self._last_exchange:
            self.remember_digest(self._last_digest, wall_s, lsn, self._last_slot)
        else:
            self.remember_digest(digest(exchange, message_id), wall_s, lsn)

    def remember_digest(self, digest: int, wall_s: float, lsn: int, slot: int = -1) -> None:
        """:meth:`remember` by key: ``digest`` as made by :func:`digest`, ``lsn >= 0``.
        ``slot``: where a lookup of it just ended (``_last_slot``), if known."""
        if self._window_s <= 0:
            return
        ms = round(wall_s * 1000.0)
        if ms >> _MS_BITS:  # before 1970 or after 2527
            ms = 0 if ms < 0 else _MS_MASK
        tail_max = self._tail_max
        if ms > tail_max:
            self._tail_max = ms
        if lsn:
            if lsn > self._max_lsn:
                self._max_lsn = lsn
            ms |= ((lsn - 1) % _LSN_MOD + 1) << _MS_BITS
        table = self._table
        if slot >= 0:
            j = slot
            table[j] = digest
            self._count += 1
        else:
            mask = self._mask
            j = (digest << 1) & mask
            while True:
                k = table[j]
                if k == digest:
                    break
                if not k:
                    table[j] = digest
                    self._count += 1
                    break
                j = (j + 2) & mask
        self._last_slot = -1
        table[j + 1] = ms
        tail = self._tail
        tail.append(digest)
        if len(tail) >= _CHUNK:
            self._new_tail()
        if self._count > self._grow_above:
            self._rebuild(_slots_for(self._count))

    def forget(self, exchange: str, message_id: str, lsn: int = 0) -> None:
        """Drop the entry of ``message_id`` (a publish whose record was lost), if any;
        with ``lsn``, only if that entry is the publish whose confirm waits on it (a
        lost publish made without deduplication must not take away the entry of an
        earlier one with the same id).

        Raises UnicodeEncodeError for a string that is not valid Unicode."""
        d = digest(exchange, message_id)
        table = self._table
        mask = self._mask
        j = (d << 1) & mask
        while True:
            k = table[j]
            if k == d:
                if not lsn or table[j + 1] >> _MS_BITS == (lsn - 1) % _LSN_MOD + 1:
                    self._delete(j)
                return
            if not k:
                return
            j = (j + 2) & mask

    def prune(self, wall_s: float) -> None:
        """Drop every entry older than the window now."""
        self._prune_ms(_ms(wall_s))

    # -------------------------------------------------------------- checkpoints

    def checkpoint_payloads(self, max_entries: int) -> list[bytes]:
        """The entries, oldest first, as ``DEDUP_DIGESTS`` record payloads of at most
        ``max_entries`` entries each. Empty if the window is. A payload is, little-endian::

            count u32 | rest u32 | count x digest u64 | count x wall_ms u64

        where ``rest`` counts the entries of this payload and of the payloads after it,
        so that recovery sizes the table once (:meth:`load_payload`).

        Raises ValueError if ``max_entries < 1``."""
        digests, times = self._in_order()
        return encode_payloads(digests, times, max_entries)

    def load_payload(self, payload: bytes) -> None:
        """Add the entries of one ``DEDUP_DIGESTS`` payload (recovery). Idempotent: an
        entry already present keeps the newer of its two times (and its LSN if it keeps
        its own time). Expired entries are taken too; the next prune drops them.

        Raises ValueError for a malformed payload: its length does not match its count,
        or it holds a reserved digest (0 or 1) or a time beyond 44 bits."""
        digests, times, rest = decode_payload(payload, _MS_MASK)
        if not digests or self._window_s <= 0:
            return
        self._load(digests, times, rest)

    def load_entries(self, digests: array[int], wall_ms: array[int]) -> None:
        """Remember many publishes at once, in time order, without their LSNs: what
        recovery collected from the log's ENQUEUE records (one call instead of a
        :meth:`remember` per record, about four times cheaper). ``digests`` as made by
        :func:`digest`, ``wall_ms`` their times in milliseconds (``round(wall_s *
        1000)``); the same rules as :meth:`load_payload`."""
        if not digests or self._window_s <= 0:
            return
        if min(wall_ms) >= 0 and max(wall_ms) <= _MS_MASK:
            times = array("Q", wall_ms)  # (a C loop; the clamping below is a Python one)
        else:
            # (a generator, not a list: a million int objects alive at once would
            # leave the heap fragmented after they are freed)
            times = array("Q", (0 if ms < 0 else min(ms, _MS_MASK) for ms in wall_ms))
        self._load(digests, times, len(digests))

    def _load(self, digests: array[int], times: array[int], rest: int) -> None:
        self._last_slot = -1
        n = len(digests)
        if self._count + n > self._grow_above:
            # room for the rest of the checkpoint too (rest is only a hint: bounded)
            self._rebuild(_slots_for(self._count + max(n, min(rest, _REST_HINT_MAX))))
        table = self._table
        mask = self._mask
        present = 0
        skipped: list[int] = []  # positions of entries present with a newer time
        for pos, (d, ms) in enumerate(zip(digests, times)):
            j = (d << 1) & mask
            while True:
                k = table[j]
                if not k:
                    table[j] = d
                    table[j + 1] = ms
                    break
                if k == d:
                    present += 1
                    if (table[j + 1] & _MS_MASK) >= ms:
                        skipped.append(pos)
                    else:
                        table[j + 1] = ms
                    break
                j = (j + 2) & mask
        self._count += n - present
        if skipped:
            keep = bytearray(b"\1") * n
            for pos in skipped:
                keep[pos] = 0
            digests = array("Q", compress(digests, keep))
            times = array("Q", compress(times, keep))
        self._append_fifo(digests, times)

    def digests(self) -> list[tuple[int, int]]:
        """The entries as ``(digest, wall_ms)``, oldest first (to compare two windows)."""
        digests, times = self._in_order()
        return list(zip(digests, times))

    # ----------------------------------------------------------------- internals

    def _set_table(self, table: array[int]) -> None:
        self._last_slot = -1
        self._table = table
        slots = len(table) // 2
        self._mask = 2 * slots - 2
        self._grow_above = slots * 7 // 10
        self._shrink_below = slots // 8 if slots > _MIN_SLOTS else -1

    def _delete(self, j: int) -> None:
        """Empty the slot at ``j`` and move back the entries after it that may take its
        place (Knuth's algorithm R: linear probing must find no empty slot between an
        entry's home and the entry)."""
        self._last_slot = -1
        table = self._table
        mask = self._mask
        i = j
        while True:
            j = (j + 2) & mask
            k = table[j]
            if not k:
                break
            # k (home (k << 1) & mask) may move to the hole i if the hole lies cyclically
            # between its home and j
            if ((j - (k << 1)) & mask) >= ((j - i) & mask):
                table[i] = k
                table[i + 1] = table[j + 1]
                i = j
        table[i] = 0
        self._count -= 1

    def _rebuild(self, slots: int) -> None:
        old = self._table
        table = _zeros(2 * slots)
        mask = 2 * slots - 2
        it = iter(old)
        for k, v in zip(it, it):
            if k:
                j = (k << 1) & mask
                while table[j]:
                    j = (j + 2) & mask
                table[j] = k
                table[j + 1] = v
        self._set_table(table)

    def _new_tail(self) -> None:
        self._chunks[-1] = self._tail[:]  # a copy without the slack of growing by appends
        self._chunk_max.append(self._tail_max)
        self._tail = array("Q")
        self._chunks.append(self._tail)
        self._tail_max = 0

    def _append_fifo(self, digests: array[int], times: array[int]) -> None:
        start = 0
        while start < len(digests):
            tail = self._tail
            end = start + _CHUNK - len(tail)
            tail.extend(digests[start:end])
            newest = max(times[start:end])
            if newest > self._tail_max:
                self._tail_max = newest
            start = end
            if len(tail) >= _CHUNK:
                self._new_tail()

    def _prune_ms(self, now_ms: int) -> None:
        self._last_slot = -1  # (entries move: the deletes below are inlined)
        horizon = now_ms - self._window_ms
        if self._count and self._tail_max < horizon and max(self._chunk_max, default=0) < horizon:
            # Every item is older than the window, and so is every entry (an entry's
            # time is that of one of its items): start afresh instead of deleting them
            # one by one (a restart after a pause longer than the window: a million
            # deletes took a second).
            self._set_table(_zeros(2 * _MIN_SLOTS))
            self._count = 0
            self._tail = array("Q")
            self._chunks = deque([self._tail])
            self._chunk_max = deque()
            self._tail_max = 0
            self._head = 0
        chunks = self._chunks
        table = self._table
        mask = self._mask
        delete = self._delete
        while True:
            chunk = chunks[0]
            last = len(chunks) == 1
            newest = self._tail_max if last else self._chunk_max[0]
            head = self._head
            if newest < horizon:  # every item expired: consume the chunk whole
                deleted = 0
                for d in chunk[head:] if head else chunk:
                    i = (d << 1) & mask
                    while True:
                        k = table[i]
                        if k == d:
                            break
                        if not k:
                            break
                        i = (i + 2) & mask
                    if not k or (table[i + 1] & _MS_MASK) >= horizon:
                        continue
                    # self._delete(i), written out: this loop is most of the cost of pruning
                    j = i
                    while True:
                        j = (j + 2) & mask
                        k = table[j]
                        if not k:
                            break
                        if ((j - (k << 1)) & mask) >= ((j - i) & mask):
                            table[i] = k
                            table[i + 1] = table[j + 1]
                            i = j
                    table[i] = 0
                    deleted += 1
                self._count -= deleted
            else:
                # Scan the rest of the chunk, dropping what has expired (an item of an
                # entry refreshed within the chunk may come before expired ones), but
                # consume it only up to the first item that may stand for a live entry:
                # one whose entry is inside the window and not newer than the chunk.
                n = len(chunk)
                stop = -1
                for pos in range(head, n):
                    d = chunk[pos]
                    j = (d << 1) & mask
                    while True:
                        k = table[j]
                        if k == d or not k:
                            break
                        j = (j + 2) & mask
                    if k:
                        ms = table[j + 1] & _MS_MASK
                        if ms < horizon:
                            delete(j)
                        elif stop < 0 and ms <= newest:
                            stop = pos
                if stop >= 0:
                    self._head = stop
                    break
            self._head = 0
            if last:  # the tail is used up: reuse it
                del chunk[:]
                self._tail_max = 0
                break
            chunks.popleft()
            self._chunk_max.popleft()
        self._next_prune_ms = now_ms + max(1, _ms(self._window_s / 64))
        if self._count < self._shrink_below:
            self._rebuild(_slots_for(self._count))

    def _in_order(self) -> tuple[array[int], array[int]]:
        """Live (digests, wall_ms) in the order of their last FIFO item."""
        table = self._table
        mask = self._mask
        chunks = self._chunks
        first = chunks[0]
        times: array[int] = array("Q")
        if sum(map(len, chunks)) - self._head == self._count:
            # as many items as entries, and every entry has one: no stale item
            digests: array[int] = array("Q")
            for chunk in chunks:
                digests.extend(chunk[self._head :] if chunk is first else chunk)
            for d in digests:
                j = (d << 1) & mask
                while True:
                    k = table[j]
                    if k == d:
                        break
                    if not k:
                        raise RuntimeError("dedup window: a FIFO item has no entry")  # a bug
                    j = (j + 2) & mask
                times.append(table[j + 1] & _MS_MASK)
            return digests, times
        # walk the FIFO backwards, keeping the first (= last) item of each live entry
        taken = bytearray(len(table) // 2)
        digests = array("Q")
        for chunk in reversed(chunks):
            for d in reversed(chunk[self._head :] if chunk is first else chunk):
                j = (d << 1) & mask
                while True:
                    k = table[j]
                    if k == d:
                        if not taken[j >> 1]:
                            taken[j >> 1] = 1
                            digests.append(d)
                            times.append(table[j + 1] & _MS_MASK)
                        break
                    if not k:
                        break
                    j = (j + 2) & mask
        digests.reverse()
        times.reverse()
        return digests, times

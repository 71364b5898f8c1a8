"""Reading logged records back by LSN: where each record of each segment starts.

One job: answer "give me the records with these LSNs" for the broker's paged-out
messages, whose bodies live only in the log segments (see "Memory" in
docs/durability.md). It knows segments, offsets and frames; what the records mean is
the core's.

Theory of operation
-------------------

* **The index.** For every segment it knows, :class:`LogReader` keeps an
  ``array('Q')`` of the byte offset of each record, in LSN order (a segment holds
  consecutive LSNs), plus the offset where its last record ends: 8 bytes a record.
  The WAL writer adds offsets as it writes batches (:meth:`LogReader.note_written`);
  recovery adds those of the segments it replays (:meth:`LogReader.note_segment`), and
  scans the frames of the segments it skipped because a checkpoint covers them
  (:meth:`LogReader.scan`), checking every CRC.
* **Reads** (:meth:`LogReader.read`) group the wanted LSNs by segment and read each run
  of nearby records with one ``read``; every frame is checked (length, CRC) before its
  payload is returned. A record that cannot be read comes back as a
  :class:`ReadFailure` saying why and whether trying again later may work: *transient*
  when the operating system failed the open or the read (``EMFILE``, ``EIO``...: the
  record may well be intact), not transient when the bytes are really unusable (a CRC
  mismatch, a file shorter than its index, a record in no segment, a segment file that
  is gone). The caller decides what each means. A failed open is not remembered (the
  next read opens the file again), and a handle whose read failed is closed. Reads are
  blocking and meant for records the WAL has reported durable (written), which the page
  cache usually still holds.
* **Segment formats.** A record's frame is the same in both formats (``segment.py``);
  in a segment of write groups the frames of a group follow its header, so the gap
  between the last record of a group and the next record holds the next header: a read
  takes a frame's end from its length field, checked against that gap.
* **Threads.** The WAL's IO thread appends offsets while the event loop thread reads;
  each structural change (a segment added or dropped) happens under a lock, and a
  reader only ever looks at offsets of records already reported written.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
import zlib
from array import array
from collections.abc import Iterable, Sequence
from typing import BinaryIO

from . import faults
from .framing import (
    FRAME_HEADER_BYTES,
    FRAME_OVERHEAD_BYTES,
    FrameProblem,
    ProblemKind,
    RecordDecoder,
)
from .fs import FileSystem
from .group import GroupDecoder
from .segment import (
    LEGACY_SEGMENT_VERSION,
    SEGMENT_HEADER_BYTES,
    BadSegmentHeader,
    decode_segment_header,
    zero_filled,
)

__all__ = ["LogReader", "ReadFailure", "ReadResult", "SegmentsToKeep"]

logger = logging.getLogger("ackbus.storage")


class ReadFailure(str):
    """Why a record could not be read back (the string itself), and whether that may
    pass: ``transient`` is true when the operating system failed the open or the read
    (the record may be intact; read it again later), false when the record is really
    unreadable (damaged, cut short, in no segment).

    It is a ``str`` so that a consumer that only tells a record from a reason
    (``isinstance(result, str)``) keeps working; read ``transient`` to tell more.
    Immutable.
    """

    transient: bool

    def __new__(cls, reason: str, *, transient: bool) -> ReadFailure:
        self = super().__new__(cls, reason)
        self.__dict__["transient"] = transient
        return self

    @property
    def reason(self) -> str:
        """The reason as a plain string."""
        return str.__str__(self)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ReadFailure is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("ReadFailure is immutable")

    def __repr__(self) -> str:
        return f"ReadFailure({self.reason!r}, transient={self.transient})"


#: ``(rtype, payload)`` of a record, or a :class:`ReadFailure` (a ``str``) saying why
#: it could not be read.
ReadResult = tuple[int, bytes] | str

_HEADER = struct.Struct("<II")
# Nearby wanted records are read with one call when the bytes between them are few.
_READ_GAP_BYTES = 64 * 1024
_SCAN_CHUNK_BYTES = 1 << 20
# Read handles kept open (a deep backlog spans many segments; file descriptors are
# shared with the connections).
_MAX_OPEN_FILES = 32
_NOT_READ = ReadFailure("not read", transient=False)  # placeholder, always replaced


class _SegmentIndex:
    __slots__ = ("first_lsn", "path", "offsets", "end")

    def __init__(self, first_lsn: int, path: str) -> None:
        self.first_lsn = first_lsn
        self.path = path
        self.offsets = array("Q")  # offsets[i]: where record first_lsn + i starts
        self.end = SEGMENT_HEADER_BYTES  # where the last indexed record ends


class LogReader:
    """Offsets of every record in the log segments, and reads by LSN."""

    def __init__(self, wal_dir: str, fs: FileSystem, *, max_record_bytes: int) -> None:
        self._wal_dir = wal_dir
        self._fs = fs
        self._max_record_bytes = max_record_bytes
        self._lock = threading.Lock()
        self._firsts: list[int] = []  # sorted first LSNs of the indexed segments
        self._segments: dict[int, _SegmentIndex] = {}
        self._files: dict[int, BinaryIO] = {}

    # ------------------------------------------------------------------ building

    def _segment(self, first_lsn: int, path: str) -> _SegmentIndex:
        seg = self._segments.get(first_lsn)
        if seg is None:
            seg = _SegmentIndex(first_lsn, path)
            with self._lock:
                self._segments[first_lsn] = seg
                bisect.insort(self._firsts, first_lsn)
        return seg

    def note_written(self, first_lsn: int, path: str, base: int, frame_sizes: Iterable[int]) -> None:
        """Records written at ``base`` of segment ``first_lsn``, one frame size each.

        Called by the WAL writer after each successful write, in LSN order."""
        seg = self._segment(first_lsn, path)
        offsets = seg.offsets
        pos = base
        for size in frame_sizes:
            offsets.append(pos)
            pos += size
        seg.end = pos

    def note_segment(self, first_lsn: int, path: str, offsets: array[int], end: int) -> None:
        """The whole index of a segment read by recovery (its valid records only)."""
        seg = self._segment(first_lsn, path)
        seg.offsets = offsets
        seg.end = end

    def scan(self, first_lsn: int, path: str) -> FrameProblem | None:
        """Index a segment by reading its records (a segment recovery did not replay).

        Stops at the first frame (or write group) that does not check out and returns
        what is wrong there (None if the whole segment is sound, an unused preallocated
        tail of zeros included); the records after it cannot be read later (a read of
        them reports the damage).
        """
        offsets = array("Q")
        with self._fs.open_read(path) as file:
            raw = file.read(SEGMENT_HEADER_BYTES)
            try:
                grouped = decode_segment_header(raw).version != LEGACY_SEGMENT_VERSION
            except BadSegmentHeader as exc:
                return FrameProblem(0, ProblemKind.BAD_GROUP, f"bad segment header: {exc}")
            if grouped:
                end, problem = _scan_groups(file, first_lsn, offsets, self._max_record_bytes)
            else:
                end, problem = _scan_frames(file, offsets, self._max_record_bytes)
            if problem is not None and problem.kind is ProblemKind.ZEROED and zero_filled(file, problem.offset):
                problem = None  # unused preallocated space (see segment.py)
        self.note_segment(first_lsn, path, offsets, end)
        return problem

    def drop(self, first_lsn: int) -> None:
        """Forget a segment (it is being deleted) and close its read handle."""
        with self._lock:
            self._segments.pop(first_lsn, None)
            i = bisect.bisect_left(self._firsts, first_lsn)
            if i < len(self._firsts) and self._firsts[i] == first_lsn:
                del self._firsts[i]
            file = self._files.pop(first_lsn, None)
        if file is not None:
            file.close()

    def close(self) -> None:
        with self._lock:
            files = list(self._files.values())
            self._files.clear()
        for file in files:
            file.close()

    # ------------------------------------------------------------------ lookups

    def segments_holding(self, lsns: Iterable[int]) -> tuple[dict[int, int], list[int]]:
        """How many of these records each segment holds, by the segment's first LSN,
        and the LSNs not indexed yet (not written yet, or in no segment on disk).

        Only an indexed record is known to be in the segment before it: a record still
        buffered by the WAL may go to a segment that does not exist yet. A caller that
        keeps segments for the records it names must ask again for the unindexed ones
        once they are written.
        """
        with self._lock:
            firsts = list(self._firsts)
            segments = [self._segments[first] for first in firsts]
        found: dict[int, int] = {}
        unindexed: list[int] = []
        lo = hi = 0  # LSNs indexed in the segment last matched: most lookups repeat it
        n = 0
        for lsn in lsns:
            if lo <= lsn < hi:
                n += 1
                continue
            if n:
                found[lo] = found.get(lo, 0) + n
            i = bisect.bisect_right(firsts, lsn) - 1
            seg = segments[i] if i >= 0 else None
            if seg is None or lsn - seg.first_lsn >= len(seg.offsets):
                unindexed.append(lsn)
                lo = hi = n = 0
                continue
            lo = seg.first_lsn
            hi = lo + len(seg.offsets)
            n = 1
        if n:
            found[lo] = found.get(lo, 0) + n
        return found, unindexed

    def spans(self) -> list[tuple[int, int]]:
        """The LSN ranges ``[first, end)`` of the records on disk, adjacent segments
        merged, in order: what a reference to a record may point at."""
        with self._lock:
            segments = [self._segments[first] for first in self._firsts]
        spans: list[tuple[int, int]] = []
        for seg in segments:
            first, end = seg.first_lsn, seg.first_lsn + len(seg.offsets)
            if first == end:
                continue
            if spans and spans[-1][1] == first:
                spans[-1] = (spans[-1][0], end)
            else:
                spans.append((first, end))
        return spans

    def record_count(self, first_lsn: int) -> int:
        """Records indexed in the segment starting at ``first_lsn`` (0 if unknown)."""
        seg = self._segments.get(first_lsn)
        return len(seg.offsets) if seg is not None else 0

    def read(self, lsns: Sequence[int]) -> list[ReadResult]:
        """The records with these LSNs, in the order asked (blocking; see the module
        docstring). Each result is ``(rtype, payload)`` or a :class:`ReadFailure`: why it
        could not be read, and whether that is ``transient``."""
        results: list[ReadResult] = [_NOT_READ] * len(lsns)
        order = sorted(range(len(lsns)), key=lsns.__getitem__)
        firsts = self._firsts
        k = 0
        while k < len(order):
            lsn = lsns[order[k]]
            i = bisect.bisect_right(firsts, lsn) - 1
            seg = self._segments.get(firsts[i]) if i >= 0 else None
            if seg is None or lsn - seg.first_lsn >= len(seg.offsets):
                results[order[k]] = ReadFailure(f"record {lsn} is in no WAL segment on disk", transient=False)
                k += 1
                continue
            # every wanted record of this segment, read in runs of nearby records
            j = k
            limit = seg.first_lsn + len(seg.offsets)
            while j < len(order) and lsns[order[j]] < limit:
                j += 1
            self._read_segment(seg, [order[x] for x in range(k, j)], lsns, results)
            k = j
        return results

    def _read_segment(
        self, seg: _SegmentIndex, positions: list[int], lsns: Sequence[int], results: list[ReadResult]
    ) -> None:
        # Extents are taken once, up front: the WAL writer may append to this segment
        # (and move seg.end) while the file is read. It appends offsets first and moves
        # seg.end after, so seg.end is read first: whatever the interleaving, a record's
        # extent then reaches at most to the next record's offset or the end of the batch
        # it was written in (past the frame by a group header if it ends a group).
        end_of_last = seg.end
        offsets = seg.offsets
        n = len(offsets)
        extents: list[tuple[int, int]] = []
        for p in positions:
            idx = lsns[p] - seg.first_lsn
            extents.append((offsets[idx], offsets[idx + 1] if idx + 1 < n else end_of_last))
        try:
            file = self._file(seg)
        except OSError as exc:
            # not remembered: the next read opens it again
            transient = not isinstance(exc, FileNotFoundError)
            failure = ReadFailure(f"WAL segment {seg.path} cannot be opened: {exc}", transient=transient)
            for p in positions:
                results[p] = failure
            return
        k = 0
        while k < len(positions):
            run_start, run_end = extents[k]
            j = k + 1
            while j < len(positions):
                s, e = extents[j]
                if s - run_end > _READ_GAP_BYTES:
                    break
                run_end = max(run_end, e)
                j += 1
            try:
                faults.hit("reader.read_error")
                file.seek(run_start)
                data = file.read(run_end - run_start)
            except OSError as exc:
                # this run and the rest of the segment's: a fresh handle next time
                failure = ReadFailure(f"reading WAL segment {seg.path} failed: {exc}", transient=True)
                for p in positions[k:]:
                    results[p] = failure
                self._forget_file(seg.first_lsn, file)
                return
            for x in range(k, j):
                s, e = extents[x]
                results[positions[x]] = self._decode_frame(data, s - run_start, e - s, seg, lsns[positions[x]], s)
            k = j

    def _decode_frame(
        self, data: bytes, pos: int, size: int, seg: _SegmentIndex, lsn: int, file_offset: int
    ) -> ReadResult:
        """The record whose frame starts at ``data[pos]``, at most ``size`` bytes long."""
        if size < FRAME_OVERHEAD_BYTES or pos + FRAME_HEADER_BYTES > len(data):
            return self._unreadable(lsn, file_offset, seg, "is cut short (the file is shorter than its index)")
        length, crc = _HEADER.unpack_from(data, pos)
        end = pos + FRAME_HEADER_BYTES + length
        if length == 0 or FRAME_HEADER_BYTES + length > size:
            return self._unreadable(lsn, file_offset, seg, "has a damaged length")
        if end > len(data):
            return self._unreadable(lsn, file_offset, seg, "is cut short (the file is shorter than its index)")
        frame = data[pos + FRAME_HEADER_BYTES : end]
        if zlib.crc32(frame) != crc:
            return self._unreadable(lsn, file_offset, seg, "fails its CRC check")
        return frame[0], frame[1:]

    @staticmethod
    def _unreadable(lsn: int, file_offset: int, seg: _SegmentIndex, what: str) -> ReadFailure:
        return ReadFailure(f"record {lsn} at offset {file_offset} of {seg.path} {what}", transient=False)

    def _file(self, seg: _SegmentIndex) -> BinaryIO:
        file = self._files.get(seg.first_lsn)
        if file is None:
            faults.hit("reader.open_emfile")
            file = self._fs.open_read(seg.path)
            stale = None
            with self._lock:
                if len(self._files) >= _MAX_OPEN_FILES:  # the least recently opened
                    stale = self._files.pop(next(iter(self._files)))
                self._files[seg.first_lsn] = file
            if stale is not None:
                stale.close()
        return file

    def _forget_file(self, first_lsn: int, file: BinaryIO) -> None:
        with self._lock:
            if self._files.get(first_lsn) is file:
                del self._files[first_lsn]
        try:
            file.close()
        except OSError:
            pass


def _scan_groups(
    file: BinaryIO, first_lsn: int, offsets: array[int], max_record_bytes: int
) -> tuple[int, FrameProblem | None]:
    """Index the records of a segment of write groups; ``(end, problem)``."""
    decoder = GroupDecoder(
        first_lsn=first_lsn, offset=SEGMENT_HEADER_BYTES, max_record_bytes=max_record_bytes, offsets=offsets
    )
    while True:
        chunk = file.read(_SCAN_CHUNK_BYTES)
        if chunk:
            decoder.feed(chunk)
        else:
            decoder.feed_eof()
        for _group in decoder.iter_groups():
            pass
        if decoder.problem is not None or not chunk:
            return decoder.offset, decoder.problem


def _scan_frames(file: BinaryIO, offsets: array[int], max_record_bytes: int) -> tuple[int, FrameProblem | None]:
    """Index the records of a segment of bare frames (version 1); ``(end, problem)``."""
    decoder = RecordDecoder(max_record_bytes=max_record_bytes, offset=SEGMENT_HEADER_BYTES)
    pos = SEGMENT_HEADER_BYTES
    while True:
        chunk = file.read(_SCAN_CHUNK_BYTES)
        if chunk:
            decoder.feed(chunk)
        else:
            decoder.feed_eof()
        for _rtype, _payload in decoder.iter_records():
            offsets.append(pos)
            pos = decoder.offset
        if decoder.problem is not None or not chunk:
            return pos, decoder.problem


class SegmentsToKeep:
    """The segments a checkpoint must keep because it refers to records in them (the
    bodies of queued messages), by first LSN with how many such records.

    Built while the checkpoint is written (:meth:`add` for each ``QUEUE_REFS``
    record). A record the WAL has not written yet cannot be placed then: it may go to
    a segment that does not exist yet. :meth:`release_limit`, called once the WAL is
    synced, places those and says through which LSN segments may be released.
    """

    def __init__(self, reader: LogReader) -> None:
        self._reader = reader
        self.counts: dict[int, int] = {}
        self._unplaced: list[int] = []

    def add(self, lsns: Iterable[int]) -> None:
        found, unindexed = self._reader.segments_holding(lsns)
        counts = self.counts
        for first, n in found.items():
            counts[first] = counts.get(first, 0) + n
        self._unplaced.extend(unindexed)

    def release_limit(self, lsn: int) -> int:
        """``lsn``, or less if a record referred to is in no segment on disk even now
        (lost to damage under --repair): nothing from it on may be released then, as
        nobody knows which segment would have held it. Call after the WAL is synced."""
        pending, self._unplaced = self._unplaced, []
        if pending:
            self.add(pending)
        if self._unplaced:
            return min(lsn, min(self._unplaced) - 1)
        return lsn

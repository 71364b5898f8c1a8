"""Recovery: find what survived, hand it back in order, and cut away torn tails.

One job: the read phase after a start or a crash. :func:`recover` loads the newest whole
checkpoint and streams the WAL records after it; once those are read, the append phase
(``WriteAheadLog.open(recovery)``) continues at ``recovery.next_lsn``.

Rules (etcd's, extended with write groups):

* Segments are read in name order = LSN order. Record LSNs follow from the segment's
  first LSN; a segment must not overlap its predecessor.
* **Torn tail.** In the LAST segment, damage a crash can leave is cut off: the file is
  truncated there (durably), and the drop is logged on ``ackbus.storage`` and listed in
  the report. Which damage that is, ``damage.py`` decides: in a segment of write groups,
  a damaged group is torn unless a later group shows that an fsync covered it (a power
  cut may persist any part of what was written after the last fsync, so valid groups
  after a damaged one prove nothing by themselves); in a segment of the previous format,
  a short, zeroed or CRC-failing frame with no valid frame after it. Under the
  ``always`` policy no record in a torn tail was ever acknowledged: the fsync covering
  it had not returned.
* **Corruption.** The same damage anywhere else - in an earlier segment, or with
  evidence that it had been fsynced - raises :class:`CorruptLog` naming the file and
  offset. Missing LSNs between segments (a deleted segment) are corruption too. Nothing
  is skipped silently.
* **Repair** (``repair=True``): treat the first corruption as the end of the log. Every
  record before it is kept; the bytes after it are copied to ``<segment>.at-<offset>.dropped``
  and the segment truncated; later segments are renamed to ``*.dropped``. Everything in
  those files is lost to the broker: messages in them, including acknowledged ones, and
  later acks, which may make consumed messages reappear. A prefix is kept rather than
  resuming after the damage because records build on each other; a hole in the middle
  would leave the core in a state that never existed.
* **Void batches.** A segment header may say "records with LSN >= V in earlier segments
  are void" (written after an IO failure, see ``segment.py``). Such records were never
  reported durable; they are dropped (and truncated away) with a warning, not replayed.
  LSN gaps explained by a void marker are expected.
* **Preallocated tails.** Zero bytes from a frame boundary to the end of a segment are
  space the writer reserved and had not used (``wal_segments.py``), not damage: they are cut off
  (logged at INFO) and are not listed as torn. This holds in any segment, since whether
  a retired segment's cut reached the disk before a power loss is up to the file system;
  a record lost under such zeros would show as missing LSNs before the next segment.
* Segments whose records are all covered by the checkpoint are not read at all.
* Leftover temporary files (``*.tmp``) are removed.
* The last segment holding records is fsynced at the end: what a crashed process left
  in the page cache is then on disk, as the WAL that continues the log assumes (its
  groups record everything before them as fsynced).

Where each part lives: this module lists the segments (:func:`recover`) and reads them
in order, yielding records (:class:`Recovery`); ``recovery_tail.py`` acts on damage
(void batches, torn and preallocated tails, repair); ``recovery_report.py`` keeps the
account. What damage means is decided in ``damage.py``, how a segment decodes in
``framing.py`` and ``group.py``.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Generator, Iterator
from typing import BinaryIO, Final, NamedTuple

from .checkpoint import LoadedCheckpoint, read_latest_checkpoint
from .errors import CorruptLog, RecoveryNotFinished
from .framing import (
    DEFAULT_MAX_RECORD_BYTES,
    FRAME_OVERHEAD_BYTES,
    FrameProblem,
    RecordDecoder,
)
from .fs import OS_FILE_SYSTEM, FileSystem
from .group import GROUP_HEADER_BYTES, GroupDecoder
from .reader import LogReader
from .recovery_report import Findings, RecoveryReport, TruncatedTail, VoidedRecords
from .recovery_tail import SegmentInfo, StopLog, TailRepair, list_segments
from .segment import (
    LEGACY_SEGMENT_VERSION,
    SEGMENT_HEADER_BYTES,
    WAL_DIRNAME,
)

__all__ = ["recover", "Recovery", "RecoveryReport", "TruncatedTail", "VoidedRecords"]

logger = logging.getLogger("ackbus.storage")

_CHUNK_BYTES: Final = 4 * 1024 * 1024
_NO_CUTOFF: Final = 1 << 64  # above every LSN

WalRecord = tuple[int, int, bytes]


class _SegmentEnd(NamedTuple):
    """Where reading a segment stopped."""

    next_lsn: int  # the LSN after the last record read
    end: int  # where the last record read ends
    void_offset: int | None  # a failed batch starts here: cut it off
    problem: FrameProblem | None  # damage here


def recover(
    data_dir: str | os.PathLike[str],
    *,
    repair: bool = False,
    fs: FileSystem | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Recovery:
    """Start recovery of ``data_dir``: load the checkpoint, list and check the segments.

    Blocking (run it before serving, or in a worker thread). The WAL records are read
    lazily through ``Recovery.wal_records``; torn tails are truncated as they are reached.

    Raises:
        CorruptCheckpoint: the newest checkpoint is unreadable and no older one is whole.
        CorruptLog: (also later, while iterating ``wal_records``) damage that is not a
            torn tail, unless ``repair`` is true.
        OSError: from the file system.
    """
    fs = fs if fs is not None else OS_FILE_SYSTEM
    root = os.fspath(data_dir)
    checkpoint = read_latest_checkpoint(root, fs=fs, max_record_bytes=max_record_bytes)
    wal_dir = os.path.join(root, WAL_DIRNAME)
    segments, removed = list_segments(wal_dir, fs, max_record_bytes)
    return Recovery(
        root,
        checkpoint=checkpoint,
        segments=segments,
        removed=removed,
        repair=repair,
        fs=fs,
        max_record_bytes=max_record_bytes,
    )


class Recovery:
    """The result of :func:`recover`: a checkpoint and the WAL records after it.

    Use in this order: apply ``checkpoint_records`` (if any), apply every
    ``(lsn, rtype, payload)`` of ``wal_records``, then read ``report`` / ``next_lsn`` and
    open the WAL with ``WriteAheadLog.open(recovery)``. Both iterators are single-use and
    streamed from disk.
    """

    def __init__(
        self,
        data_dir: str,
        *,
        checkpoint: LoadedCheckpoint | None,
        segments: list[SegmentInfo],
        removed: list[str],
        repair: bool,
        fs: FileSystem,
        max_record_bytes: int,
    ) -> None:
        self.data_dir = data_dir
        self.fs = fs
        self.max_record_bytes = max_record_bytes
        self.repair = repair
        self.checkpoint = checkpoint
        self.checkpoint_lsn = checkpoint.lsn if checkpoint is not None else 0
        self.checkpoint_records: Iterator[tuple[int, bytes]] = (
            checkpoint.records if checkpoint is not None else iter(())
        )
        self._wal_dir = os.path.join(data_dir, WAL_DIRNAME)
        self._segments = segments
        self._findings = Findings(removed)
        self._tail = TailRepair(
            self._wal_dir,
            segments,
            self._findings,
            repair=repair,
            fs=fs,
            max_record_bytes=max_record_bytes,
        )
        self._segments_read = 0
        self._replayed = 0
        self._last_lsn = self.checkpoint_lsn
        self._read_paths: set[str] = set()
        #: Where every record of the log is, for reading message bodies back by LSN:
        #: filled while the segments are read, and handed on to the WAL.
        self.reader = LogReader(self._wal_dir, fs, max_record_bytes=max_record_bytes)
        self._report: RecoveryReport | None = None
        #: ``(lsn, rtype, payload)`` for every WAL record after the checkpoint, in order.
        self.wal_records: Iterator[WalRecord] = self._iter_wal()

    def records(self) -> Iterator[WalRecord]:
        """The same single-use iterator as :attr:`wal_records`."""
        return self.wal_records

    @property
    def finished(self) -> bool:
        """True once ``wal_records`` was read to the end."""
        return self._report is not None

    @property
    def report(self) -> RecoveryReport:
        """What was found and done.

        Raises:
            RecoveryNotFinished: ``wal_records`` not yet exhausted.
        """
        if self._report is None:
            raise RecoveryNotFinished("read recovery.wal_records to the end first")
        return self._report

    @property
    def last_lsn(self) -> int:
        """Highest LSN recovered (checkpoint or WAL); 0 for an empty data directory."""
        return self.report.last_lsn

    @property
    def next_lsn(self) -> int:
        """The LSN the next appended record gets."""
        return self.report.next_lsn

    # ------------------------------------------------------------------ reading

    def _iter_wal(self) -> Iterator[WalRecord]:
        segments = self._segments
        ckpt = self.checkpoint_lsn
        # cutoffs[i]: records of segment i with LSN >= this are void (failed batches).
        cutoffs = [_NO_CUTOFF] * len(segments)
        running = _NO_CUTOFF
        for index in range(len(segments) - 1, -1, -1):
            cutoffs[index] = running
            header = segments[index].header
            if header is not None and header.void_from_lsn:
                running = min(running, header.void_from_lsn)
        expected: int | None = None  # next LSN after the previous segment's records
        try:
            for index, segment in enumerate(segments):
                is_last = index == len(segments) - 1
                if segment.first_lsn >= cutoffs[index]:
                    logger.warning(
                        "ignoring WAL segment %s: it only holds a failed batch (LSN >= %d, "
                        "never reported durable)",
                        segment.path,
                        segment.first_lsn,
                    )
                    self._findings.voided.append(
                        VoidedRecords(
                            segment.path, 0, segment.first_lsn, self.fs.getsize(segment.path)
                        )
                    )
                    continue
                if not is_last and segments[index + 1].first_lsn - 1 <= ckpt:
                    expected = None  # wholly covered by the checkpoint: not read
                    continue
                header = segment.header
                if header is None:
                    self._tail.corrupt(index, 0, f"bad segment header: {segment.header_error}")
                if header.first_lsn != segment.first_lsn:
                    self._tail.corrupt(
                        index,
                        0,
                        f"header says first LSN {header.first_lsn}, "
                        f"file name says {segment.first_lsn}",
                    )
                if expected is not None and segment.first_lsn < expected:
                    self._tail.corrupt(
                        index,
                        0,
                        f"segment starts at LSN {segment.first_lsn} but the previous segment "
                        f"already holds records up to LSN {expected - 1}",
                    )
                need = max(expected or 0, ckpt + 1)
                if segment.first_lsn > need and not (
                    header.void_from_lsn and header.void_from_lsn <= need
                ):
                    self._tail.corrupt(
                        index,
                        0,
                        f"records with LSN {need}..{segment.first_lsn - 1} are missing before "
                        "this segment (a deleted segment, or an unreadable newer checkpoint)",
                    )
                self._segments_read += 1
                expected = yield from self._read_segment(index, is_last, cutoffs[index])
        except StopLog:
            pass
        self._finish()

    def _read_segment(
        self, index: int, is_last: bool, cutoff: int
    ) -> Generator[WalRecord, None, int]:
        """Yield a segment's records after the checkpoint; return the LSN after its last."""
        segment = self._segments[index]
        assert segment.header is not None
        grouped = segment.header.version != LEGACY_SEGMENT_VERSION
        read = self._read_groups if grouped else self._read_frames
        path = segment.path
        offsets = array("Q")  # where each valid record starts, for self.reader
        self._read_paths.add(path)
        with self.fs.open_read(path) as file:
            file.seek(SEGMENT_HEADER_BYTES)
            state = yield from read(segment.first_lsn, file, offsets, cutoff)
        lsn, end, void_offset, problem = state
        # (before handling damage, which may stop the log here: what was read stands)
        self.reader.note_segment(segment.first_lsn, path, offsets, end)
        if void_offset is not None:
            self._tail.void_tail(path, void_offset, lsn)
        elif problem is not None:
            self._tail.handle_problem(index, is_last, problem, lsn, grouped)
        if lsn > segment.first_lsn:
            self._last_lsn = max(self._last_lsn, lsn - 1)
        return lsn

    def _read_groups(
        self, lsn: int, file: BinaryIO, offsets: array[int], cutoff: int
    ) -> Generator[WalRecord, None, _SegmentEnd]:
        """The records of a segment of write groups (version 2), a whole group at a time."""
        ckpt = self.checkpoint_lsn
        first_lsn = lsn
        decoder = GroupDecoder(
            first_lsn=lsn,
            offset=SEGMENT_HEADER_BYTES,
            max_record_bytes=self.max_record_bytes,
            offsets=offsets,
        )
        while True:
            chunk = file.read(_CHUNK_BYTES)
            if chunk:
                decoder.feed(chunk)
            else:
                decoder.feed_eof()
            for group_lsn, _synced, records in decoder.iter_groups():
                count = len(records)
                if group_lsn + count > cutoff:
                    # a failed batch (and whatever follows it): not replayed
                    del offsets[group_lsn - first_lsn :]
                    start = decoder.offset - GROUP_HEADER_BYTES - sum(
                        FRAME_OVERHEAD_BYTES + len(payload) for _rtype, payload in records
                    )
                    return _SegmentEnd(lsn, start, start, None)
                if lsn > ckpt:
                    for rtype, payload in records:
                        yield lsn, rtype, payload
                        lsn += 1
                    self._replayed += count
                    self._last_lsn = lsn - 1
                else:  # (partly) covered by the checkpoint
                    for rtype, payload in records:
                        if lsn > ckpt:
                            self._replayed += 1
                            self._last_lsn = lsn
                            yield lsn, rtype, payload
                        lsn += 1
            problem = decoder.problem
            if problem is not None:
                if lsn >= cutoff:
                    return _SegmentEnd(lsn, decoder.offset, problem.offset, None)
                return _SegmentEnd(lsn, decoder.offset, None, problem)
            if not chunk:
                return _SegmentEnd(lsn, decoder.offset, None, None)

    def _read_frames(
        self, lsn: int, file: BinaryIO, offsets: array[int], cutoff: int
    ) -> Generator[WalRecord, None, _SegmentEnd]:
        """The records of a segment of bare frames (version 1, before write groups)."""
        ckpt = self.checkpoint_lsn
        decoder = RecordDecoder(max_record_bytes=self.max_record_bytes, offset=SEGMENT_HEADER_BYTES)
        pos = SEGMENT_HEADER_BYTES
        while True:
            chunk = file.read(_CHUNK_BYTES)
            if chunk:
                decoder.feed(chunk)
            else:
                decoder.feed_eof()
            for rtype, payload in decoder.iter_records():
                if lsn >= cutoff:
                    return _SegmentEnd(lsn, pos, decoder.offset - FRAME_OVERHEAD_BYTES - len(payload), None)
                offsets.append(pos)
                pos = decoder.offset
                if lsn > ckpt:
                    self._replayed += 1
                    self._last_lsn = lsn
                    yield lsn, rtype, payload
                lsn += 1
            problem = decoder.problem
            if problem is not None:
                if lsn >= cutoff:
                    return _SegmentEnd(lsn, pos, problem.offset, None)
                return _SegmentEnd(lsn, pos, None, problem)
            if not chunk:
                return _SegmentEnd(lsn, pos, None, None)

    def _sync_last_segment(self, last_lsn: int) -> None:
        """fsync the last segment holding records: a crashed process (not a power loss)
        leaves its last writes in the page cache, unsynced, and the WAL continues the
        log claiming everything before it was fsynced (``group.py``)."""
        for segment in reversed(self._segments):
            if segment.first_lsn > last_lsn or segment.path in self._findings.moved_aside:
                continue
            if self.fs.exists(segment.path):
                file = self.fs.open_append(segment.path)
                try:
                    file.sync()
                finally:
                    file.close()
            return

    def _finish(self) -> None:
        # Segments after the last record hold nothing worth keeping: an empty segment
        # from an interrupted rollover or failure probe, or a failed batch already
        # declared void (and void tails were durably truncated above). Removing them
        # lets the log continue at last_lsn + 1 with no gap and no stale void marker.
        last = self._last_lsn
        emptied = False
        for segment in self._segments:
            if segment.first_lsn > last and segment.path not in self._findings.moved_aside:
                logger.info("removing WAL segment %s: it holds no records to keep", segment.path)
                self.fs.remove(segment.path)
                self._findings.removed.append(segment.path)
                emptied = True
        if emptied:
            self.fs.sync_dir(self._wal_dir)
        self._sync_last_segment(last)
        # Segments a checkpoint covers were not replayed, but the ones still on disk
        # are kept because they hold bodies of queued messages: index them.
        for segment in self._segments:
            if (
                segment.path not in self._read_paths
                and segment.path not in self._findings.moved_aside
                and segment.first_lsn <= last
                and segment.header is not None
                and self.fs.exists(segment.path)
            ):
                problem = self.reader.scan(segment.first_lsn, segment.path)
                if problem is None:
                    continue
                reason = f"{problem} (a segment kept for the bodies of queued messages)"
                if not self.repair:
                    raise CorruptLog(segment.path, problem.offset, reason)
                logger.error(
                    "WAL segment %s is damaged at byte offset %d: %s; repair: the queued "
                    "messages stored from there on are dropped when their turn comes",
                    segment.path,
                    problem.offset,
                    reason,
                )
        self._report = report = self._findings.report(
            checkpoint_lsn=self.checkpoint_lsn,
            checkpoint_path=self.checkpoint.path if self.checkpoint is not None else None,
            segments_read=self._segments_read,
            records_replayed=self._replayed,
            last_lsn=self._last_lsn,
        )
        logger.info(
            "recovery finished: checkpoint LSN %d, %d WAL records replayed from %d segment(s), "
            "next LSN %d%s",
            self.checkpoint_lsn,
            self._replayed,
            self._segments_read,
            report.next_lsn,
            f", {len(report.truncated)} tail(s) truncated" if report.truncated else "",
        )

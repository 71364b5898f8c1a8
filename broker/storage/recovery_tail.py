"""Recovery's cleanup: leftovers, void batches, torn tails, preallocated tails, repair.

One job: change the log's files where recovery found something that must not be
replayed. What the damage *means* is decided in ``damage.py``; this module acts on it:

* leftover temporary files (``*.tmp``) are removed, and so is a last segment whose
  header is unreadable and that holds no record (:func:`list_segments`);
* a failed batch a later segment declares void: truncated away, with a warning;
* zeros from a frame boundary to the end of a segment: unused preallocated space, cut
  off (INFO), in any segment;
* other damage in the last segment that a crash can leave (a torn tail): truncated
  durably, logged, listed in the report;
* anything else is corruption: :class:`~broker.storage.CorruptLog`, or under
  ``repair`` the end of the log: the rest of the segment is saved to
  ``<segment>.at-<offset>.dropped`` and cut, later segments renamed to ``*.dropped``,
  and :class:`StopLog` tells the reader to stop.

Every change is noted in the recovery's :class:`~.recovery_report.Findings`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import NoReturn

from .damage import count_frames, judge_frames, judge_groups
from .errors import CorruptLog
from .framing import FrameProblem, ProblemKind, ScanGaveUp, find_valid_frame
from .fs import FileSystem
from .recovery_report import Findings, TruncatedTail, VoidedRecords
from .segment import (
    DROPPED_SUFFIX,
    LEGACY_SEGMENT_VERSION,
    SEGMENT_HEADER_BYTES,
    TMP_SUFFIX,
    BadSegmentHeader,
    SegmentHeader,
    decode_segment_header,
    parse_segment_name,
    zero_filled,
)

__all__ = ["SegmentInfo", "StopLog", "TailRepair", "list_segments"]

logger = logging.getLogger("ackbus.storage")


@dataclass(slots=True)
class SegmentInfo:
    """A segment file as recovery listed it (its header, or why it is unreadable)."""

    first_lsn: int
    path: str
    header: SegmentHeader | None
    header_error: str | None


class StopLog(Exception):
    """A repair ended the log at this point: read no further."""


def list_segments(
    wal_dir: str, fs: FileSystem, max_record_bytes: int
) -> tuple[list[SegmentInfo], list[str]]:
    """The segments of ``wal_dir`` in LSN order, with their headers, and the files
    removed on the way: leftover temporary files, and a last segment with an unreadable
    header that holds no record."""
    removed: list[str] = []
    segments: list[SegmentInfo] = []
    for name in sorted(fs.listdir(wal_dir)):
        path = os.path.join(wal_dir, name)
        if name.endswith(TMP_SUFFIX):
            logger.info("removing leftover temporary WAL file %s", path)
            fs.remove(path)
            removed.append(path)
            continue
        first = parse_segment_name(name)
        if first is None:
            continue
        with fs.open_read(path) as file:
            raw = file.read(SEGMENT_HEADER_BYTES)
        try:
            header: SegmentHeader | None = decode_segment_header(raw)
            error = None
        except BadSegmentHeader as exc:
            header, error = None, str(exc)
        segments.append(SegmentInfo(first, path, header, error))
    # Segments are created temp -> fsync -> rename, so a bad header is damage, not a torn
    # write; still, a last segment holding nothing valid at all cannot hold a record
    # anyone was told about, so it is treated like a torn tail and removed.
    while segments and segments[-1].header_error is not None:
        last = segments[-1]
        with fs.open_read(last.path) as file:
            content = file.read()
        try:
            if find_valid_frame(content, 0, max_record_bytes=max_record_bytes) is not None:
                break
        except ScanGaveUp:
            break
        logger.warning(
            "removing the last WAL segment %s: unreadable header (%s) and no records",
            last.path,
            last.header_error,
        )
        fs.remove(last.path)
        fs.sync_dir(wal_dir)
        removed.append(last.path)
        segments.pop()
    return segments, removed


class TailRepair:
    """Cuts void batches and torn tails off the log's segments, and under ``repair``
    ends the log at the first corruption."""

    def __init__(
        self,
        wal_dir: str,
        segments: list[SegmentInfo],
        findings: Findings,
        *,
        repair: bool,
        fs: FileSystem,
        max_record_bytes: int,
    ) -> None:
        self._wal_dir = wal_dir
        self._segments = segments
        self._findings = findings
        self._repair = repair
        self._fs = fs
        self._max_record_bytes = max_record_bytes

    def void_tail(self, path: str, offset: int, first_lsn: int) -> None:
        """Truncate a failed batch (LSN ``first_lsn`` on) starting at ``offset``."""
        size = self._fs.getsize(path)
        logger.warning(
            "discarding %d bytes at offset %d of %s: a failed batch (LSN >= %d) that was "
            "never reported durable",
            size - offset,
            offset,
            path,
            first_lsn,
        )
        self._fs.truncate(path, offset)
        self._findings.voided.append(VoidedRecords(path, offset, first_lsn, size - offset))

    def _zero_filled(self, path: str, offset: int) -> bool:
        with self._fs.open_read(path) as file:
            return zero_filled(file, offset)

    def _read_from(self, path: str, offset: int) -> bytes:
        with self._fs.open_read(path) as file:
            file.seek(offset)
            return file.read()

    def handle_problem(
        self, index: int, is_last: bool, problem: FrameProblem, lsn: int, grouped: bool
    ) -> None:
        """Damage at ``problem.offset``, where the record with LSN ``lsn`` would start.

        Raises: ``CorruptLog``, or ``StopLog`` under repair (see :meth:`corrupt`).
        """
        path = self._segments[index].path
        offset = problem.offset
        fs = self._fs
        if problem.kind is ProblemKind.ZEROED and self._zero_filled(path, offset):
            size = fs.getsize(path)
            logger.info(
                "WAL segment %s ends at offset %d: cutting off %d bytes of unused "
                "preallocated space",
                path,
                offset,
                size - offset,
            )
            fs.truncate(path, offset)
            return
        rest = self._read_from(path, offset)
        what = "group" if grouped else "record"
        if not is_last:
            self.corrupt(
                index,
                offset,
                f"{problem.kind.value} {what} ({problem.detail}) in a segment that is not "
                "the last one",
                rest,
            )
        if grouped:
            verdict = judge_groups(problem, rest, offset, lsn)
        else:
            verdict = judge_frames(problem, rest, offset, self._max_record_bytes)
        if verdict.corruption is not None:
            self.corrupt(index, offset, verdict.corruption, rest)
        if verdict.fallback is not None:
            logger.warning(
                "could not rule out valid records after the damaged %s at %s offset %d "
                "(the scan gave up); treating it as a torn tail because %s",
                what,
                path,
                offset,
                verdict.fallback,
            )
        if rest.count(0) == len(rest):
            dropped = 0  # nothing was written there
        elif grouped:
            dropped = max(1, count_frames(rest, self._max_record_bytes, grouped=True))
        else:
            dropped = 1  # the partial record
        logger.warning(
            "WAL torn tail: truncating %s at offset %d, dropping %d bytes "
            "(%s%d record%s): %s",
            path,
            offset,
            len(rest),
            "about " if grouped and dropped else "",
            dropped,
            "" if dropped == 1 else "s",
            problem,
        )
        fs.truncate(path, offset)
        self._findings.truncated.append(
            TruncatedTail(path, offset, len(rest), dropped, str(problem))
        )

    def corrupt(self, index: int, offset: int, reason: str, rest: bytes | None = None) -> NoReturn:
        """Raise CorruptLog, or under repair end the log here (then raise StopLog)."""
        segment = self._segments[index]
        if not self._repair:
            raise CorruptLog(segment.path, offset, reason)
        fs = self._fs
        findings = self._findings
        logger.error(
            "REPAIR: %s is corrupt at offset %d (%s); keeping the records before it and "
            "dropping everything after it",
            segment.path,
            offset,
            reason,
        )
        later = self._segments[index + 1 :]
        if offset <= SEGMENT_HEADER_BYTES and rest is None:
            # Nothing of this segment is usable: move the whole file aside.
            later = self._segments[index:]
        else:
            if rest is None:
                rest = self._read_from(segment.path, offset)
            saved = f"{segment.path}.at-{offset}{DROPPED_SUFFIX}"
            out = fs.create(saved)
            try:
                out.write(rest)
                out.sync()
            finally:
                out.close()
            header = segment.header
            grouped = header is not None and header.version != LEGACY_SEGMENT_VERSION
            records = count_frames(rest, self._max_record_bytes, grouped=grouped)
            fs.truncate(segment.path, offset)
            logger.error(
                "REPAIR: truncated %s at offset %d: %d bytes (about %d records) dropped, "
                "saved to %s",
                segment.path,
                offset,
                len(rest),
                records,
                saved,
            )
            findings.truncated.append(
                TruncatedTail(segment.path, offset, len(rest), records, reason, True, saved)
            )
            findings.dropped.append(saved)
        for victim in later:
            aside = victim.path + DROPPED_SUFFIX
            fs.rename(victim.path, aside)
            findings.moved_aside.add(victim.path)
            logger.error(
                "REPAIR: moved later WAL segment %s aside to %s (its records are lost)",
                victim.path,
                aside,
            )
            findings.dropped.append(aside)
        fs.sync_dir(self._wal_dir)
        raise StopLog

"""The write-ahead log's files: its segments on disk, the active one, and the space reserve.

One job: the files under ``<data_dir>/wal/`` as the writer sees them.

* **The list.** First LSNs of the segment files on disk, sorted: found at start
  (:meth:`SegmentFiles.__init__` refuses segments past the point appending begins),
  grown by the IO thread as segments are created, shrunk by :meth:`release_through`
  once a checkpoint covers them; hence a (threading) lock.
* **The active segment.** The one being appended to (:class:`ActiveSegment`), opened
  for the first batch: an empty segment named by the next LSN, left by a rollover or a
  failure probe, is appended to (its void marker kept); otherwise a new one is created
  temp -> fsync -> rename -> fsync directory, so every segment but the last is complete
  on disk. ``dirty`` says bytes were written to it since its last fsync.
* **Rollover.** A batch that would take the active segment past ``segment_max_bytes``
  goes to a new segment; the old one is cut back to its records, fsynced (if needed)
  and closed first (:meth:`io_segment_for`).
* **Preallocation.** The active segment keeps ``preallocate_bytes`` of reserved,
  zero-reading space ahead of its end, so a batch's fdatasync commits no size change;
  cut off when the segment is retired or closed. Best effort.
* **After a failure.** :meth:`io_abandon_active` truncates the active segment to its
  last good offset; :meth:`io_probe` starts a fresh one whose header voids the failed
  batch.
* **The space reserve** (``reserve.py``): wanted at start and after segments were
  released; the writer makes it when idle (:meth:`io_ensure_reserve`).

Methods named ``io_*`` block on the disk: the writer runs them in its IO thread (one
at a time) or, for a small batch, on the event loop. The batch's write itself (group
headers, frames, fsync policy) is the writer's, in ``wal_commit.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Container
from dataclasses import dataclass

from . import faults
from .checkpoint import newest_checkpoint_bytes
from .errors import StorageError
from .fs import FileSystem, WritableFile
from .reader import LogReader
from .reserve import ensure_reserve, wanted_reserve_bytes
from .segment import (
    SEGMENT_HEADER_BYTES,
    SEGMENT_VERSION,
    TMP_SUFFIX,
    BadSegmentHeader,
    SegmentHeader,
    decode_segment_header,
    encode_segment_header,
    parse_segment_name,
    segment_name,
)

__all__ = ["ActiveSegment", "SegmentFiles", "fsync_segment"]

logger = logging.getLogger("ackbus.storage")


@dataclass(slots=True)
class ActiveSegment:
    """The segment being appended to (touched only by the single IO thread at a time)."""

    first_lsn: int
    path: str
    file: WritableFile
    size: int
    good_size: int  # end of the last batch written (and, under "always", fsynced) whole
    has_records: bool
    # the file's size: ``size`` plus preallocated space (or the segment limit once the
    # file system refused to preallocate, so that it is not asked again)
    allocated: int


def fsync_segment(segment: ActiveSegment) -> float:
    """fsync ``segment``'s file; how long it took, in seconds."""
    faults.hit("wal.before_fsync")
    faults.hit("wal.fsync_error")
    faults.hit("wal.fsync_enospc")
    started = time.perf_counter()
    segment.file.sync()
    duration = time.perf_counter() - started
    faults.hit("wal.after_fsync")
    return duration


class SegmentFiles:
    """The segment files of one WAL directory, the active segment, the space reserve.

    Raises (constructor):
        StorageError: the directory holds segments at or after ``next_lsn`` that
            contain records (recovery was not run, or ``next_lsn`` is wrong).
    """

    def __init__(
        self,
        data_dir: str,
        wal_dir: str,
        fs: FileSystem,
        reader: LogReader,
        *,
        next_lsn: int,
        segment_max_bytes: int,
        preallocate_bytes: int,
        reserve_bytes: int,
    ) -> None:
        self._data_dir = data_dir
        self._wal_dir = wal_dir
        self._fs = fs
        self._reader = reader
        self.segment_max_bytes = segment_max_bytes
        self._preallocate_bytes = preallocate_bytes
        self._reserve_bytes = reserve_bytes
        #: the space reserve is to be made or grown when the writer is idle
        self.reserve_wanted = reserve_bytes > 0
        # First LSNs of the segment files on disk, sorted. Mutated by the IO thread (new
        # segments) and by release_through, hence the (threading) lock.
        self._segments: list[int] = []
        self._segments_lock = threading.Lock()
        # an empty segment named by next_lsn, found at start: appended to (if it is in
        # the current format) or made again with the same void marker
        self._reuse_segment: SegmentHeader | None = None
        self._scan_existing_segments(next_lsn)
        self.active: ActiveSegment | None = None
        #: bytes written to the active segment since its last fsync
        self.dirty = False

    def _scan_existing_segments(self, next_lsn: int) -> None:
        fs = self._fs
        for name in fs.listdir(self._wal_dir):
            first = parse_segment_name(name)
            if first is None:
                continue
            if first > next_lsn:
                raise StorageError(
                    f"{os.path.join(self._wal_dir, name)} starts after LSN {next_lsn}, where "
                    "appending would begin; run recover() and open the WAL from its result"
                )
            if first == next_lsn:
                path = os.path.join(self._wal_dir, name)
                if fs.getsize(path) != SEGMENT_HEADER_BYTES:
                    raise StorageError(
                        f"{path} already holds data at LSN {next_lsn}, where appending would "
                        "begin; run recover() and open the WAL from its result"
                    )
                # An empty segment left by a rollover or a failure probe: append to it
                # (its name is ours, and its header may carry a void marker to keep).
                with fs.open_read(path) as file:
                    raw = file.read(SEGMENT_HEADER_BYTES)
                try:
                    self._reuse_segment = decode_segment_header(raw)
                except BadSegmentHeader:
                    self._reuse_segment = SegmentHeader(first)
            self._segments.append(first)
        self._segments.sort()

    @property
    def count(self) -> int:
        """Segment files on disk."""
        return len(self._segments)

    @property
    def active_first_lsn(self) -> int | None:
        active = self.active
        return active.first_lsn if active is not None else None

    def release_through(self, lsn: int, keep: Container[int] = ()) -> list[str]:
        """Delete segment files all of whose records have LSN <= ``lsn``, except those
        whose first LSN is in ``keep``; never the active one. The paths deleted. A
        deletion that fails is logged and retried by a later call."""
        active_first = self.active_first_lsn
        victims: list[int] = []
        with self._segments_lock:
            segments = self._segments
            for index in range(len(segments) - 1):
                first = segments[index]
                if first == active_first or segments[index + 1] - 1 > lsn:
                    break
                if first not in keep:
                    victims.append(first)
            self._segments = [first for first in segments if first not in victims]
        removed: list[str] = []
        for first in victims:
            self._reader.drop(first)
            path = os.path.join(self._wal_dir, segment_name(first))
            try:
                self._fs.remove(path)
            except FileNotFoundError:
                removed.append(path)
            except OSError as exc:
                logger.warning("could not delete released WAL segment %s: %s", path, exc)
                with self._segments_lock:
                    self._segments.append(first)
                    self._segments.sort()
            else:
                removed.append(path)
        if removed:
            logger.info("released %d WAL segment(s) through LSN %d", len(removed), lsn)
            if self._reserve_bytes:
                # room again: the writer makes (or grows) the space reserve when idle
                self.reserve_wanted = True
        return removed

    def want_reserve(self) -> bool:
        """The space reserve was used: make it again when idle. False if the WAL keeps
        no reserve."""
        if self._reserve_bytes:
            self.reserve_wanted = True
            return True
        return False

    # ------------------------------------------------------------------ IO thread

    def io_segment_for(self, first_lsn: int, nbytes: int) -> tuple[ActiveSegment, float | None]:
        """The segment a batch of ``nbytes`` starting at ``first_lsn`` goes to, rolling
        over when it would take the active one past ``segment_max_bytes`` (a segment
        holding a single larger batch is allowed); and how long retiring the old
        segment's fsync took, if one was needed."""
        segment = self.active
        if segment is not None and (
            not segment.has_records or segment.size + nbytes <= self.segment_max_bytes
        ):
            return segment, None
        retired_sync_s = self.io_retire_active() if segment is not None else None
        return self._io_open_segment(first_lsn), retired_sync_s

    def io_preallocate(self, segment: ActiveSegment, need: int) -> None:
        """Reserve space for at least ``need`` bytes and a step beyond, within the
        segment's size limit (best effort: a refusal only costs the fsync saving)."""
        step = self._preallocate_bytes
        if not step:
            return
        target = max(need, min(need + step, self.segment_max_bytes))
        try:
            faults.hit("wal.preallocate_enospc")
            segment.file.preallocate(target)
        except OSError as exc:
            logger.info("could not preallocate %s to %d bytes: %s", segment.path, target, exc)
            target = self.segment_max_bytes  # do not ask again for this segment
        segment.allocated = max(segment.allocated, target)

    def io_sync_active(self) -> float | None:
        """fsync the active segment (if any); how long it took."""
        segment = self.active
        if segment is None:
            return None
        return fsync_segment(segment)

    def _io_cut_preallocated(self, segment: ActiveSegment) -> bool:
        """Cut the segment's preallocated space off (a finished segment ends at its
        last record); True if the file changed and needs an fsync."""
        if segment.allocated <= segment.size:
            return False
        segment.file.truncate(segment.size)
        segment.allocated = segment.size
        return True

    def io_retire_active(self) -> float | None:
        """Cut, fsync (if needed) and close the active segment before starting the next."""
        segment = self.active
        assert segment is not None
        cut = self._io_cut_preallocated(segment)
        duration = fsync_segment(segment) if self.dirty or cut else None
        self.dirty = False
        self.active = None
        segment.file.close()
        return duration

    def _io_open_segment(self, first_lsn: int) -> ActiveSegment:
        """Open the segment the next batch (starting at ``first_lsn``) goes to."""
        if self._reuse_segment is not None:
            reuse, self._reuse_segment = self._reuse_segment, None
            if reuse.first_lsn == first_lsn:
                if reuse.version != SEGMENT_VERSION:
                    # an older format: made again, keeping its void marker
                    return self._io_create_segment(SegmentHeader(first_lsn, reuse.void_from_lsn))
                path = os.path.join(self._wal_dir, segment_name(first_lsn))
                file = self._fs.open_append(path)
                size = self._fs.getsize(path)
                self.active = ActiveSegment(first_lsn, path, file, size, size, False, size)
                return self.active
        return self._io_create_segment(SegmentHeader(first_lsn))

    def _io_create_segment(self, header: SegmentHeader) -> ActiveSegment:
        """Create a segment: temp file, header, fsync, rename, fsync directory."""
        fs = self._fs
        fs.makedirs(self._wal_dir)
        path = os.path.join(self._wal_dir, segment_name(header.first_lsn))
        tmp = path + TMP_SUFFIX
        data = encode_segment_header(header)
        file = fs.create(tmp)
        allocated = len(data)
        try:
            faults.hit("wal.segment_create_error")
            faults.hit("wal.segment_create_enospc")
            file.write(data)
            if self._preallocate_bytes:
                # under the fsync that follows, so the first batch's fsync stays cheap
                allocated = min(len(data) + self._preallocate_bytes, max(self.segment_max_bytes, len(data)))
                try:
                    faults.hit("wal.preallocate_enospc")
                    file.preallocate(allocated)
                except OSError as exc:
                    logger.info("could not preallocate %s: %s", tmp, exc)
                    allocated = self.segment_max_bytes  # do not ask again for it
            file.sync()
            fs.rename(tmp, path)
            faults.hit("wal.after_segment_create")
            fs.sync_dir(self._wal_dir)
        except Exception:
            file.close()
            for leftover in (tmp, path):
                try:
                    fs.remove(leftover)
                except OSError:
                    pass
            raise
        with self._segments_lock:
            if header.first_lsn not in self._segments:
                self._segments.append(header.first_lsn)
                self._segments.sort()
        self.active = ActiveSegment(header.first_lsn, path, file, len(data), len(data), False, allocated)
        return self.active

    def io_abandon_active(self) -> None:
        """After a failure: truncate the active segment to its last good offset, close it."""
        segment = self.active
        if segment is None:
            return
        self.active = None
        self.dirty = False
        try:
            # Always truncate: after a failed write the OS may have kept part of it, and
            # segment.size does not know how much.
            segment.file.truncate(segment.good_size)
            segment.file.sync()
        except OSError as exc:
            logger.warning(
                "could not truncate %s back to offset %d after an IO error (%s); "
                "recovery will discard the failed batch",
                segment.path,
                segment.good_size,
                exc,
            )
        try:
            segment.file.close()
        except OSError:
            pass

    def io_probe(self, header: SegmentHeader) -> None:
        """Start a fresh segment with ``header`` (leaving the failed state)."""
        self._reuse_segment = None
        self._io_create_segment(header)

    def io_close_active(self, failed: bool) -> None:
        """Close the active segment (on close), cut back to its records unless failed."""
        segment = self.active
        self.active = None
        if segment is None:
            return
        try:
            if not failed and self._io_cut_preallocated(segment):
                segment.file.sync()
        except OSError as exc:
            logger.warning(
                "could not cut the preallocated space off %s on close (%s); recovery will",
                segment.path,
                exc,
            )
        finally:
            segment.file.close()

    def io_ensure_reserve(self) -> bool:
        """Make or grow the space reserve (best effort: a full disk just has to wait);
        whether it is in place."""
        size = wanted_reserve_bytes(self._reserve_bytes, newest_checkpoint_bytes(self._data_dir, self._fs))
        return ensure_reserve(self._data_dir, size, self._fs)

"""The write-ahead log's writer: group commit, fsync, the failed state and its probes.

One job: turn what the append buffer holds (``wal_append.py``) into durable bytes in
the active segment (``wal_segments.py``) and say so through ``on_durable(lsn)``.

* **Group commit.** One writer task (:meth:`GroupCommitter.serve`) waits until
  something is buffered, takes all of it, writes it with one ``write`` and fsyncs once
  (policy permitting, in the WAL's IO thread), then reports the batch's last LSN. Whatever
  is appended meanwhile forms the next batch. A batch of at most
  ``inline_max_records`` that fits the active segment is written and fsynced on the
  event loop instead, when ``inline_allowed()`` (if given) agrees; so is a batch that
  is not to be fsynced and of at most ``inline_write_max_bytes`` (a write into the page
  cache costs less than the thread hand-off).
* **Write groups.** A batch is one group (``group.py``): a header carrying
  ``synced_lsn``, the highest LSN fsynced before it, then the frames; a batch over
  16 MiB is several groups, in the same write.
* **Policies** (``fsync_policy.py``) and lazy records: which batches are fsynced, and
  when the writer fsyncs the active segment without a batch (an ``interval`` tick, or
  ``lazy_sync_s`` after lazily written records under ``always``).
* **The failed state.** An ``OSError`` from a write or fsync: the batch's LSNs are
  reported through ``on_failure`` and never as durable, the active segment is cut back
  to its last good offset, later batches fail at once, and every ``retry_interval_s`` a
  probe tries a fresh segment whose header voids the failed LSNs; ``on_recovered()``
  when it works. After ``ENOSPC``, :meth:`sync` probes at once.
* **The IO thread** (``wal_thread.py``): one long-lived thread, started by
  :meth:`~GroupCommitter.serve` and stopped and joined when it ends or by
  :meth:`~GroupCommitter.aclose`, runs the blocking calls; handing it a batch costs
  less than ``trio.to_thread.run_sync`` (a thread from trio's cache, a context copy,
  a scheduling round per call). IO while it is not running goes to trio's threads.
* **Cancellation.** IO once handed to a thread is never abandoned; a batch taken but
  not yet handed over is put back.

All of it runs under one trio lock (``_io_lock``), and one IO call at a time
(``limiter``): writes, fsyncs and probes are strictly ordered.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from . import faults
from .errors import WALClosed, WALFailed
from .fsync_policy import FsyncPolicy
from .group import (
    GROUP_HEADER_BYTES,
    GROUP_SPLIT_BYTES,
    encode_group_header,
    group_spans,
)
from .reader import LogReader
from .reserve import is_disk_full
from .segment import SegmentHeader
from .wal_append import AppendBuffer
from .wal_segments import SegmentFiles, fsync_segment
from .wal_thread import IOThread

__all__ = [
    "GroupCommitter",
    "InlineAllowed",
    "OnDurable",
    "OnFailure",
    "OnFsync",
    "OnRecovered",
    "OnReserve",
]

logger = logging.getLogger("ackbus.storage")

OnDurable = Callable[[int], None]
OnFailure = Callable[[int, int, OSError], None]
OnRecovered = Callable[[], None]
OnFsync = Callable[[float], None]
OnReserve = Callable[[bool], None]
InlineAllowed = Callable[[], bool]


@dataclass(frozen=True, slots=True)
class _WriteResult:
    nbytes: int  # written, group headers included
    fsync_s: float | None
    retired_sync_s: float | None


class GroupCommitter:
    """The WAL's writer task and its state: what is written, synced, reported, failed.

    It owns the LSN marks past the buffer (``good_lsn``: written whole, and synced under
    ``always``; ``synced_lsn``; ``durable_lsn``: reported), the failed state, the
    open/closing/closed lifecycle, ``wakeup`` (set when there is work) and the
    counters; it takes records from ``buffer`` and writes them to ``files``.
    """

    def __init__(
        self,
        buffer: AppendBuffer,
        files: SegmentFiles,
        reader: LogReader,
        *,
        policy: FsyncPolicy,
        on_durable: OnDurable,
        on_failure: OnFailure | None,
        on_recovered: OnRecovered | None,
        on_fsync: OnFsync | None,
        on_reserve: OnReserve | None,
        retry_interval_s: float,
        lazy_sync_s: float,
        inline_max_records: int,
        inline_allowed: InlineAllowed | None,
        inline_write_max_bytes: int = 0,
    ) -> None:
        self._buffer = buffer
        self._files = files
        self._reader = reader
        self.policy = policy
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._on_recovered = on_recovered
        self._on_fsync = on_fsync
        self._on_reserve = on_reserve
        self._retry_interval_s = retry_interval_s
        self._lazy_sync_s = lazy_sync_s
        self._inline_max_records = inline_max_records
        self._inline_allowed = inline_allowed
        self._inline_write_max_bytes = inline_write_max_bytes

        start = buffer.last_lsn
        self._good_lsn = start  # last LSN written whole (and synced under "always")
        self.synced_lsn = start
        self.durable_lsn = start  # last LSN reported through on_durable
        self._dirty_since = math.inf  # when files.dirty last became true
        self._last_sync_time = -math.inf

        self.failed = False
        self._failure: OSError | None = None
        self._retry_at = math.inf
        self.closing = False
        self._closed = False
        self._serving = False
        #: set when there is work: records buffered, the reserve wanted, closing
        self.wakeup = trio.Event()
        self._io_lock = trio.Lock()
        # One IO call at a time: writes, fsyncs and probes are strictly ordered, and the
        # WAL never waits behind unrelated work in trio's shared default thread pool.
        self.limiter = trio.CapacityLimiter(1)
        #: The WAL's own IO thread (``wal_thread.py``), running while :meth:`serve` does.
        self._io = IOThread(self.limiter)

        self.bytes_written = 0
        self.records_written = 0
        self.fsyncs = 0

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, task_status: trio.TaskStatus[None]) -> None:
        """The group-commit writer task (see ``WriteAheadLog.serve``)."""
        if self._serving:
            raise RuntimeError("WriteAheadLog.serve() is already running")
        if self.closing:
            raise WALClosed("the write-ahead log is closed")
        self._serving = True
        self._io.start()
        try:
            task_status.started()
            while not self.closing:
                await self._serve_once()
        finally:
            self._serving = False
            # Stop the IO thread once no call is in flight (a sync() may hold the lock;
            # its IO is never abandoned), so the join is immediate. aclose() may have
            # stopped it already.
            with trio.CancelScope(shield=True):
                async with self._io_lock:
                    self._io.stop()

    async def sync(self) -> int:
        """Write and fsync everything now (see ``WriteAheadLog.sync``)."""
        async with self._io_lock:
            if self._closed:
                raise WALClosed("the write-ahead log is closed")
            if self.failed and self._failure is not None and is_disk_full(self._failure):
                # A full disk: the caller is most likely a checkpoint that just made
                # room (its own file, or the space reserve it released). Waiting for the
                # next probe would keep it from releasing segments until the next one.
                await self._probe()
            if not self.failed and self._buffer.chunks:
                await self._commit(force_sync=True)
            if not self.failed and self._files.dirty:
                await self._sync_active()
            if self.failed:
                self._fail_buffered()
                raise WALFailed(f"the write-ahead log is failed: {self._failure}")
            return self.synced_lsn

    async def aclose(self) -> None:
        """Flush, close the files, stop :meth:`serve` (see ``WriteAheadLog.aclose``)."""
        if self._closed:
            return
        self.closing = True
        self.wakeup.set()
        with trio.CancelScope(shield=True):
            async with self._io_lock:
                if self._closed:
                    return
                try:
                    if self.failed:
                        self._fail_buffered()
                    else:
                        if self._buffer.chunks:
                            await self._commit(force_sync=True)
                        if not self.failed and self._files.dirty:
                            await self._sync_active()
                        if self.failed:
                            self._fail_buffered()
                finally:
                    failed = self.failed
                    try:
                        await self._io.run(lambda: self._files.io_close_active(failed))
                    finally:
                        self._io.stop()  # idle: we hold _io_lock
                    self._reader.close()
                    self._closed = True

    # ------------------------------------------------------------------ writer loop

    async def _serve_once(self) -> None:
        buffer = self._buffer
        files = self._files
        policy = self.policy
        if self.failed:
            deadline = self._retry_at
        elif files.dirty and policy.mode == "interval":
            deadline = self._last_sync_time + policy.interval_s
        elif files.dirty and policy.mode == "always":
            deadline = self._dirty_since + self._lazy_sync_s  # lazily written records
        else:
            deadline = math.inf
        if not buffer.chunks:
            with trio.move_on_at(deadline):
                while not buffer.chunks and not self.closing and not self._reserve_due():
                    self.wakeup = trio.Event()
                    await self.wakeup.wait()
        # Acquiring the lock is a schedule point (as every trio primitive's is): the
        # tasks woken together with this one run first, so a delivery made by the same
        # publish goes out before a (possibly inline) fsync holds the thread, and the
        # records they append join this batch.
        async with self._io_lock:
            if self.closing:
                return  # aclose() flushes what is left
            if self.failed:
                self._fail_buffered()
                if trio.current_time() >= self._retry_at:
                    await self._probe()
            elif buffer.chunks:
                await self._commit(force_sync=False)
            elif files.dirty and trio.current_time() >= deadline:
                await self._sync_active()
            elif self._reserve_due():
                files.reserve_wanted = False
                in_place = await self._io.run(files.io_ensure_reserve)
                if self._on_reserve is not None:
                    self._on_reserve(in_place)

    def _reserve_due(self) -> bool:
        return self._files.reserve_wanted and not self.failed

    async def _commit(self, *, force_sync: bool) -> None:
        """Write (and maybe fsync) every buffered record as one batch. Holds _io_lock."""
        batch = self._buffer.take()
        first = batch.first
        last = batch.last
        data = batch.data
        policy = self.policy
        now = trio.current_time()
        do_sync = (
            force_sync
            or (policy.mode == "always" and batch.wants_sync)
            or (policy.mode == "interval" and now - self._last_sync_time >= policy.interval_s)
        )
        active = self._files.active
        inline = (
            active is not None
            and active.size + GROUP_HEADER_BYTES + len(data) <= self._files.segment_max_bytes
            and len(data) <= GROUP_SPLIT_BYTES
            and (
                (not do_sync and len(data) <= self._inline_write_max_bytes)
                or (
                    last - first < self._inline_max_records
                    and (self._inline_allowed is None or self._inline_allowed())
                )
            )
        )
        synced = self.synced_lsn
        try:
            if inline:
                # A small batch (a lone publisher's one record): write and fsync on
                # this thread. Handing it to a worker thread and back costs more than
                # the fsync itself (measured: ~150 us vs ~200 us here), and with so
                # few records there is nothing to overlap the fsync with anyway. Or a
                # batch that is only written (a consumer's delivery marks and
                # settles): a write into the page cache is cheaper than the hand-off.
                result = self._io_write(data, first, do_sync, batch.sizes, synced, batch.together)
            else:
                sizes = batch.sizes
                together = batch.together
                result = await self._io.run(
                    lambda: self._io_write(data, first, do_sync, sizes, synced, together)
                )
        except trio.Cancelled:
            # Raised only before the thread started: nothing was written. Put it back.
            self._buffer.put_back(batch)
            raise
        except OSError as exc:
            await self._enter_failed(exc, first, last)
            return
        self.bytes_written += result.nbytes
        self.records_written += last - first + 1
        self._good_lsn = last
        if result.retired_sync_s is not None:
            # the segment moved past was fsynced: everything before this batch is on disk
            self.synced_lsn = max(self.synced_lsn, first - 1)
            self._note_fsync(result.retired_sync_s)
        if result.fsync_s is not None:
            self.synced_lsn = last
            self._files.dirty = False
            self._last_sync_time = trio.current_time()
            self._note_fsync(result.fsync_s)
        elif not self._files.dirty:
            self._files.dirty = True
            self._dirty_since = trio.current_time()
        self.durable_lsn = last
        self._on_durable(last)

    async def _sync_active(self) -> None:
        """fsync the active segment (interval tick, sync(), close). Holds _io_lock."""
        target = self._good_lsn
        try:
            duration = await self._io.run(self._files.io_sync_active)
        except OSError as exc:
            logger.error(
                "fsync of the write-ahead log failed: %s; LSNs %d..%d were reported durable "
                "under fsync policy %s but may not be on disk",
                exc,
                self.synced_lsn + 1,
                target,
                self.policy,
            )
            await self._enter_failed(exc, None, None)
            return
        if duration is not None:
            self._note_fsync(duration)
        self.synced_lsn = target
        self._files.dirty = False
        self._last_sync_time = trio.current_time()

    def _note_fsync(self, duration_s: float) -> None:
        self.fsyncs += 1
        if self._on_fsync is not None:
            self._on_fsync(duration_s)

    # ------------------------------------------------------------------ failed state

    async def _enter_failed(self, exc: OSError, first: int | None, last: int | None) -> None:
        """Switch to the failed state after an IO error. Holds _io_lock."""
        self.failed = True
        self._failure = exc
        self._retry_at = trio.current_time() + self._retry_interval_s
        if first is not None and last is not None:
            logger.error(
                "write-ahead log IO failed for LSNs %d..%d: %s; failing new batches and "
                "probing again every %.3g s",
                first,
                last,
                exc,
                self._retry_interval_s,
            )
        with trio.CancelScope(shield=True):
            await self._io.run(self._files.io_abandon_active)
        if first is not None and last is not None and self._on_failure is not None:
            self._on_failure(first, last, exc)

    def _fail_buffered(self) -> None:
        """Report every buffered record as failed without writing it (failed state)."""
        dropped = self._buffer.drop()
        if dropped is None:
            return
        assert self._failure is not None
        if self._on_failure is not None:
            self._on_failure(dropped[0], dropped[1], self._failure)

    async def _probe(self) -> None:
        """Try to leave the failed state by starting a fresh segment. Holds _io_lock."""
        next_lsn = self._buffer.last_lsn + 1
        header = SegmentHeader(next_lsn, void_from_lsn=self._good_lsn + 1)
        try:
            await self._io.run(lambda: self._files.io_probe(header))
        except OSError as exc:
            self._failure = exc
            self._retry_at = trio.current_time() + self._retry_interval_s
            logger.warning(
                "write-ahead log still failing (%s); next probe in %.3g s",
                exc,
                self._retry_interval_s,
            )
            return
        self.failed = False
        self._failure = None
        self._retry_at = math.inf
        self._files.dirty = False
        self._last_sync_time = trio.current_time()
        logger.warning("write-ahead log recovered: appending again from LSN %d", next_lsn)
        if self._on_recovered is not None:
            self._on_recovered()

    # ------------------------------------------------------------------ worker-thread IO

    def _io_write(
        self,
        data: bytes,
        first_lsn: int,
        do_sync: bool,
        sizes: Sequence[int],
        synced_lsn: int,
        together: Sequence[tuple[int, int]] = (),
    ) -> _WriteResult:
        """Write one batch (``data``: the frames of ``sizes`` records from ``first_lsn``)
        as one write group, or several if it is large (``group.py``). ``synced_lsn``:
        the highest LSN fsynced so far, recorded in the group as evidence for recovery."""
        spans = group_spans(sizes, together) if len(data) > GROUP_SPLIT_BYTES else None
        nbytes = len(data) + GROUP_HEADER_BYTES * (1 if spans is None else len(spans))
        previous = self._files.active
        segment, retired_sync_s = self._files.io_segment_for(first_lsn, nbytes)
        if segment is not previous:
            # every earlier segment was fsynced before this one was started
            synced_lsn = max(synced_lsn, first_lsn - 1)
        base = segment.size
        if spans is None:
            parts: Sequence[bytes | memoryview] = (
                encode_group_header(first_lsn, len(sizes), synced_lsn, len(data)),
                data,
            )
        else:
            parts = _group_parts(data, first_lsn, sizes, spans, synced_lsn)
        try:
            faults.hit("wal.write_error")
            faults.hit("wal.write_enospc")
        except OSError:
            half = b"".join(parts)[: nbytes // 2]
            segment.file.write(half)
            segment.size += len(half)
            raise
        if base + nbytes > segment.allocated:
            self._files.io_preallocate(segment, base + nbytes)
        segment.file.write_parts(parts)
        segment.size += nbytes
        segment.has_records = True
        faults.hit("wal.after_write")
        fsync_s = fsync_segment(segment) if do_sync else None
        segment.good_size = segment.size
        reader = self._reader
        if spans is None:
            reader.note_written(segment.first_lsn, segment.path, base + GROUP_HEADER_BYTES, sizes)
        else:
            pos = base
            for start, end, frame_bytes in spans:
                pos += GROUP_HEADER_BYTES
                reader.note_written(segment.first_lsn, segment.path, pos, sizes[start:end])
                pos += frame_bytes
        return _WriteResult(nbytes, fsync_s, retired_sync_s)


def _group_parts(
    data: bytes,
    first_lsn: int,
    sizes: Sequence[int],
    spans: Sequence[tuple[int, int, int]],
    synced_lsn: int,
) -> list[bytes | memoryview]:
    """Headers and frames of a batch written as several groups (one write)."""
    parts: list[bytes | memoryview] = []
    view = memoryview(data)
    pos = 0
    for start, end, frame_bytes in spans:
        parts.append(encode_group_header(first_lsn + start, end - start, synced_lsn, frame_bytes))
        parts.append(view[pos : pos + frame_bytes])
        pos += frame_bytes
    return parts

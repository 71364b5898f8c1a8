"""The write-ahead log: append records, make them durable in batches, say which LSN is safe.

One job: turn ``append_nowait(records)`` calls into durable bytes in segment files, with
one write and (policy permitting) one fsync per batch, and report the highest durable LSN
through ``on_durable(lsn)``. It knows bytes and files; what records mean is the core's.

Theory of operation
-------------------

* **LSNs.** Records are numbered 1, 2, 3... in append order, across segments. The WAL
  assigns them in :meth:`WriteAheadLog.append_nowait` (which returns the LSN of the last
  record it was given); the core keeps an identical counter. An LSN, once assigned, is
  never reused, even if its record could not be written.
* **Group commit.** ``append_nowait`` only frames the records and buffers them. A single
  writer task, :meth:`WriteAheadLog.serve`, waits until something is buffered, takes all
  of it, writes it with one ``write`` and fsyncs once (``fdatasync``, in the WAL's IO
  thread, ``wal_thread.py``: one long-lived thread while :meth:`serve` runs),
  then calls ``on_durable(last_lsn)``. Whatever is appended during that write and fsync
  forms the next batch: under load, batches grow and fsyncs per record fall. A batch
  of at most ``inline_max_records`` records that fits the active segment is written
  and fsynced on the calling (event loop) thread instead: for a lone publisher the
  thread hand-off costs as much as the fsync. 0 (the default) never does this, nor
  does a batch for which ``inline_allowed()`` (if given) says no: the owner keeps its
  event loop free while that loop has other clients to serve. A batch that is not to
  be fsynced (lazy records, or a policy other than ``always``) and of at most
  ``inline_write_max_bytes`` bytes is written on the event loop too, whatever
  ``inline_allowed()`` says: a write into the page cache takes microseconds, the hand-off
  to a thread and back tens of them (0, the default, never does this).
* **Fsync policies** (:class:`FsyncPolicy`): ``always`` reports after the fsync (the only
  policy that survives power loss); ``interval=N`` reports after the write and fsyncs
  at most every N ms; ``never`` reports after the write and fsyncs only on
  :meth:`~WriteAheadLog.sync`, on close and when a segment is retired. ``interval`` and
  ``never`` survive a crash of the process (the page cache holds the data) but not of the
  machine.
* **Lazy records.** ``append_nowait(records, lazy=True)`` marks records nobody waits
  for (a consumer's ack): under ``always`` a batch of only such records is written
  without an fsync and reported at once, as ``interval`` would; the next fsync (the
  next batch that has a record someone waits for, a sync, a segment's retirement) or at
  the latest ``lazy_sync_s`` later makes it durable. So acks neither cost an fsync each
  nor hold the event loop while a publish waits to be read.
* **Write groups.** Each batch is written as one *group* (``group.py``): a 32-byte
  header (first LSN, record count, and ``synced_lsn``, the highest LSN fsynced before
  the group was written) then the records' frames (``framing.py``), in one ``writev``.
  ``synced_lsn`` is what lets recovery tell a write torn by a power cut from damage to
  bytes an fsync covered. A batch over 16 MiB is several groups, in the same write.
* **Segments.** ``<data_dir>/wal/<first LSN in 16 hex>.wal``, 32-byte header
  (``segment.py``) then groups. A batch that would take the active
  segment past ``segment_max_bytes`` goes to a new segment (a segment holding a single
  batch larger than that is allowed). Before moving on, the old segment is fsynced, and
  the new one is created temp -> fsync -> rename -> fsync directory, so every segment
  but the last is complete on disk.
* **Preallocation.** The active segment keeps ``preallocate_bytes`` (default 4 MiB) of
  reserved, zero-reading space ahead of its end (``fallocate``), as etcd's WAL does: a
  batch then overwrites allocated blocks without growing the file, and its fdatasync
  commits no size or allocation change (about 55 us cheaper per fsync on this kind of
  disk, a third of the fsync). A segment is cut back to its records when retired and on
  close; after a crash, recovery recognises the zero-filled tail and cuts it
  (``recovery.py``). Preallocation is best effort: if the file system refuses, the
  segment just grows by appends.
* **IO failure.** If a write or fsync raises ``OSError`` (ENOSPC, EIO...), the batch's
  LSNs are never reported durable: ``on_failure(first_lsn, last_lsn, exc)`` is called,
  the failed segment is truncated back to its last good offset (best effort) and closed,
  and the WAL enters its *failed state*: later batches fail at once through
  ``on_failure`` without being written. Every ``retry_interval_s`` it probes by creating
  a fresh segment named by the next LSN to be appended, whose header marks everything
  after the last good LSN as void (so a truncation that did not work cannot resurrect a
  failed batch at recovery). When the probe's fsyncs succeed it calls ``on_recovered()``
  and accepts batches again. LSN gaps between segments are expected after this. No
  ``OSError`` escapes :meth:`serve`: the broker keeps running and nacks. After a full
  disk (``ENOSPC``), :meth:`sync` probes at once instead of waiting for the timer: the
  caller is normally a checkpoint that just made room, and wants to release segments.
* **Space reserve.** With ``reserve_bytes`` > 0 the WAL keeps ``<data_dir>/reserve``
  (``reserve.py``), a preallocated file of at least that size (twice the newest
  checkpoint if larger) that a checkpoint on a full disk deletes to make room. The
  writer makes it when it starts and again after segments were released, when idle.
* **Cancellation.** IO runs in a thread and is never abandoned: cancelling
  :meth:`serve` waits for the current write/fsync to finish. A batch taken for writing
  but not yet handed to its thread is put back, so cancellation never loses a record.

Where each part lives: :class:`WriteAheadLog` is the facade (the API the runtime's
``LogPort`` and the tests use) over three parts that own their state:
``wal_append.py`` (the append buffer and LSN counter), ``wal_commit.py`` (the writer
task: group commit, fsync, the failed state and probes, with its IO thread in
``wal_thread.py``) and ``wal_segments.py`` (the
segment files, the active segment, rollover, preallocation, release, the space
reserve). The policy is ``fsync_policy.py``; the formats written are ``segment.py``
and ``group.py``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Container, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import trio

from .errors import InvalidConfiguration, WALClosed
from .framing import DEFAULT_MAX_RECORD_BYTES
from .fs import OS_FILE_SYSTEM, FileSystem
from .fsync_policy import FsyncPolicy, parse_fsync_policy
from .reader import LogReader
from .segment import SEGMENT_HEADER_BYTES, WAL_DIRNAME
from .wal_append import AppendBuffer
from .wal_commit import (
    GroupCommitter,
    InlineAllowed,
    OnDurable,
    OnFailure,
    OnFsync,
    OnRecovered,
    OnReserve,
)
from .wal_segments import SegmentFiles

if TYPE_CHECKING:
    from .recovery import Recovery

__all__ = [
    "DEFAULT_SEGMENT_MAX_BYTES",
    "DEFAULT_PREALLOCATE_BYTES",
    "DEFAULT_RETRY_INTERVAL_S",
    "DEFAULT_LAZY_SYNC_S",
    "FsyncPolicy",
    "parse_fsync_policy",
    "WALStatistics",
    "WriteAheadLog",
    "open_wal",
]

#: Segment rollover size. Kafka and etcd use 1 GiB and 64 MiB; 64 MiB keeps the space
#: a checkpoint can free reasonably fine-grained.
DEFAULT_SEGMENT_MAX_BYTES: Final = 64 * 1024 * 1024
#: Space reserved ahead of the active segment's end. etcd reserves a whole segment; a
#: few MiB gets the same fsync saving (one size change per step is noise) without a
#: killed broker leaving 64 MiB of zeros behind.
DEFAULT_PREALLOCATE_BYTES: Final = 4 * 1024 * 1024
DEFAULT_RETRY_INTERVAL_S: Final = 1.0
#: Longest a lazily appended record (see the module docstring) stays unsynced under
#: ``always``: a power loss may bring back the acks of this last stretch of time.
DEFAULT_LAZY_SYNC_S: Final = 0.2


@dataclass(frozen=True, slots=True)
class WALStatistics:
    """A snapshot of the WAL's counters (for metrics and ``GET /overview``)."""

    bytes_written: int
    records_written: int
    fsyncs: int
    segments: int
    failed: bool
    last_durable_lsn: int
    #: highest LSN fsynced (equals last_durable_lsn under "always")
    last_synced_lsn: int
    #: highest LSN assigned by append_nowait
    last_lsn: int
    buffered_records: int
    buffered_bytes: int
    active_segment: str | None


def _noop_durable(lsn: int) -> None:
    pass


def _check_options(
    next_lsn: int,
    segment_max_bytes: int,
    retry_interval_s: float,
    lazy_sync_s: float,
    max_record_bytes: int,
    preallocate_bytes: int,
    reserve_bytes: int,
) -> None:
    """Raise ``InvalidConfiguration`` for the first option out of range."""
    if next_lsn < 1:
        raise InvalidConfiguration(f"next_lsn must be >= 1, got {next_lsn}")
    if segment_max_bytes < SEGMENT_HEADER_BYTES + 1:
        raise InvalidConfiguration(f"segment_max_bytes too small: {segment_max_bytes}")
    if not retry_interval_s > 0:
        raise InvalidConfiguration(f"retry_interval_s must be > 0, got {retry_interval_s}")
    if not lazy_sync_s > 0:
        raise InvalidConfiguration(f"lazy_sync_s must be > 0, got {lazy_sync_s}")
    if max_record_bytes < 1:
        raise InvalidConfiguration(f"max_record_bytes must be >= 1, got {max_record_bytes}")
    if preallocate_bytes < 0:
        raise InvalidConfiguration(f"preallocate_bytes must be >= 0, got {preallocate_bytes}")
    if reserve_bytes < 0:
        raise InvalidConfiguration(f"reserve_bytes must be >= 0, got {reserve_bytes}")


class WriteAheadLog:
    """A segmented, group-committing write-ahead log (see the module docstring).

    Normally built by :meth:`open` from a finished :class:`~broker.storage.Recovery`.
    Run :meth:`serve` in a nursery; feed it with :meth:`append_nowait`; close it with
    :meth:`aclose`.

    Raises (constructor):
        InvalidConfiguration: bad sizes, intervals or fsync policy.
        StorageError: the WAL directory holds segments at or after ``next_lsn`` that
            contain records (recovery was not run, or ``next_lsn`` is wrong).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        next_lsn: int = 1,
        fsync_policy: FsyncPolicy | str | int = "always",
        on_durable: OnDurable = _noop_durable,
        on_failure: OnFailure | None = None,
        on_recovered: OnRecovered | None = None,
        on_fsync: OnFsync | None = None,
        on_reserve: OnReserve | None = None,
        segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES,
        retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S,
        lazy_sync_s: float = DEFAULT_LAZY_SYNC_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        inline_max_records: int = 0,
        inline_allowed: InlineAllowed | None = None,
        inline_write_max_bytes: int = 0,
        preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES,
        reserve_bytes: int = 0,
        fs: FileSystem | None = None,
        reader: LogReader | None = None,
    ) -> None:
        _check_options(
            next_lsn,
            segment_max_bytes,
            retry_interval_s,
            lazy_sync_s,
            max_record_bytes,
            preallocate_bytes,
            reserve_bytes,
        )
        policy = parse_fsync_policy(fsync_policy)
        data_dir = os.fspath(data_dir)
        wal_dir = os.path.join(data_dir, WAL_DIRNAME)
        fs = fs if fs is not None else OS_FILE_SYSTEM
        #: Reads records back by LSN (message bodies paged out of memory).
        self.reader = reader if reader is not None else LogReader(
            wal_dir, fs, max_record_bytes=max_record_bytes
        )
        self._buffer = AppendBuffer(next_lsn, max_record_bytes)
        self._files = SegmentFiles(
            data_dir,
            wal_dir,
            fs,
            self.reader,
            next_lsn=next_lsn,
            segment_max_bytes=segment_max_bytes,
            preallocate_bytes=preallocate_bytes,
            reserve_bytes=reserve_bytes,
        )
        self._committer = GroupCommitter(
            self._buffer,
            self._files,
            self.reader,
            policy=policy,
            on_durable=on_durable,
            on_failure=on_failure,
            on_recovered=on_recovered,
            on_fsync=on_fsync,
            on_reserve=on_reserve,
            retry_interval_s=retry_interval_s,
            lazy_sync_s=lazy_sync_s,
            inline_max_records=inline_max_records,
            inline_allowed=inline_allowed,
            inline_write_max_bytes=inline_write_max_bytes,
        )

    @classmethod
    def open(
        cls,
        recovery: Recovery,
        *,
        fsync_policy: FsyncPolicy | str | int = "always",
        on_durable: OnDurable = _noop_durable,
        on_failure: OnFailure | None = None,
        on_recovered: OnRecovered | None = None,
        on_fsync: OnFsync | None = None,
        on_reserve: OnReserve | None = None,
        segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES,
        retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S,
        inline_max_records: int = 0,
        inline_allowed: InlineAllowed | None = None,
        inline_write_max_bytes: int = 0,
        preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES,
        reserve_bytes: int = 0,
    ) -> WriteAheadLog:
        """The append phase after a recovery: a WAL that continues at ``recovery.next_lsn``.

        Raises:
            RecoveryNotFinished: the recovery's WAL records were not all read yet.
            InvalidConfiguration: see the constructor.
        """
        return cls(
            recovery.data_dir,
            next_lsn=recovery.next_lsn,
            fsync_policy=fsync_policy,
            on_durable=on_durable,
            on_failure=on_failure,
            on_recovered=on_recovered,
            on_fsync=on_fsync,
            on_reserve=on_reserve,
            segment_max_bytes=segment_max_bytes,
            retry_interval_s=retry_interval_s,
            max_record_bytes=recovery.max_record_bytes,
            inline_max_records=inline_max_records,
            inline_allowed=inline_allowed,
            inline_write_max_bytes=inline_write_max_bytes,
            preallocate_bytes=preallocate_bytes,
            reserve_bytes=reserve_bytes,
            fs=recovery.fs,
            reader=recovery.reader,
        )

    # ------------------------------------------------------------------ public API

    @property
    def policy(self) -> FsyncPolicy:
        """The fsync policy in force."""
        return self._committer.policy

    @property
    def last_lsn(self) -> int:
        """LSN of the last record appended (0 if none ever was)."""
        return self._buffer.last_lsn

    @property
    def active_first_lsn(self) -> int | None:
        """First LSN of the segment being appended to (None before the first write)."""
        return self._files.active_first_lsn

    @property
    def failed(self) -> bool:
        """True while the WAL is in its failed state."""
        return self._committer.failed

    def append_nowait(
        self, records: Sequence[tuple[int, bytes]], *, lazy: bool = False, together: bool = False
    ) -> int:
        """Buffer records for the next batch; return the LSN of the last one. Never blocks.

        Records get consecutive LSNs in the order given. An empty sequence returns the
        current last LSN. While the WAL is failed, records are still numbered and then
        reported through ``on_failure`` without being written. ``lazy``: nobody waits
        for these records, so under ``always`` they alone do not cost an fsync (see
        "Lazy records" in the module docstring). ``together``: these records are written in
        one write group, all or nothing after a crash (a transaction's commit).

        Raises:
            WALClosed: after :meth:`aclose` began.
            ValueError: a record type outside 0..255.
            RecordTooLarge: a record over ``max_record_bytes``. Nothing of the call is
                buffered (and no LSN assigned) if any record is rejected.
        """
        committer = self._committer
        if committer.closing:
            raise WALClosed("the write-ahead log is closed")
        buffer = self._buffer
        if buffer.append(records, lazy, together):
            committer.wakeup.set()
        return buffer.last_lsn

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The group-commit writer task. Runs until :meth:`aclose` or cancellation.

        Raises:
            RuntimeError: already serving.
            WALClosed: the WAL was closed.
            Whatever ``on_durable``/``on_failure``/``on_recovered``/``on_fsync`` raise
            (a bug in the caller). ``OSError`` never escapes: it becomes the failed state.
        """
        await self._committer.serve(task_status)

    async def sync(self) -> int:
        """Write everything buffered and fsync it now, whatever the policy.

        Use it before taking a checkpoint under the ``never`` policy, or whenever a
        caller needs everything so far on disk. Returns the highest fsynced LSN.

        Raises:
            WALClosed: the WAL is closed.
            WALFailed: the WAL is (or just became) failed; the buffered records were
                reported through ``on_failure``.
        """
        return await self._committer.sync()

    def release_through(self, lsn: int, keep: Container[int] = ()) -> list[str]:
        """Delete segment files all of whose records have LSN <= ``lsn``, except those
        whose first LSN is in ``keep`` (they hold bodies of messages still queued).

        Call it once a checkpoint covering ``lsn`` is safely written. The last segment
        (the active one) is never deleted. Returns the paths deleted. It blocks for the
        unlink calls only (a handful of files per checkpoint). A deletion that fails is
        logged and retried by a later call; it does not raise.
        """
        removed = self._files.release_through(lsn, keep)
        if removed and self._files.reserve_wanted:
            self._committer.wakeup.set()
        return removed

    def want_reserve(self) -> None:
        """The space reserve was used (a checkpoint on a full disk took it): make it
        again when the writer is idle and there is room (reported by ``on_reserve``)."""
        if self._files.want_reserve():
            self._committer.wakeup.set()

    async def aclose(self) -> None:
        """Write and fsync whatever is buffered, close the files, stop :meth:`serve`.

        Runs shielded from cancellation (it is the shutdown path and only waits for the
        disk). Idempotent. IO errors are reported through ``on_failure`` and logged.
        """
        await self._committer.aclose()

    def statistics(self) -> WALStatistics:
        """Counters and state, cheap to call."""
        committer = self._committer
        buffer = self._buffer
        active = self._files.active
        return WALStatistics(
            bytes_written=committer.bytes_written,
            records_written=committer.records_written,
            fsyncs=committer.fsyncs,
            segments=self._files.count,
            failed=committer.failed,
            last_durable_lsn=committer.durable_lsn,
            last_synced_lsn=committer.synced_lsn,
            last_lsn=buffer.last_lsn,
            buffered_records=buffer.buffered_records,
            buffered_bytes=buffer.nbytes,
            active_segment=active.path if active is not None else None,
        )


@asynccontextmanager
async def open_wal(recovery: Recovery, **options: Any) -> AsyncIterator[WriteAheadLog]:
    """Open the WAL after ``recovery``, run its writer task, and close it on exit.

    ``options`` are those of :meth:`WriteAheadLog.open`. On exit everything buffered is
    written and fsynced (:meth:`WriteAheadLog.aclose`).
    """
    wal = WriteAheadLog.open(recovery, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        try:
            yield wal
        finally:
            await wal.aclose()

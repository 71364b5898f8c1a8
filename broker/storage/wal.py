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
  of it, writes it with one ``write`` and fsyncs once (``fdatasync``, in a worker thread),
  then calls ``on_durable(last_lsn)``. Whatever is appended during that write and fsync
  forms the next batch: under load, batches grow and fsyncs per record fall. A batch
  of at most ``inline_max_records`` records that fits the active segment is written
  and fsynced on the calling (event loop) thread instead: for a lone publisher the
  thread hand-off costs as much as the fsync. 0 (the default) never does this, nor
  does a batch for which ``inline_allowed()`` (if given) says no: the owner keeps its
  event loop free while that loop has other clients to serve.
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
* **Cancellation.** IO runs in worker threads that are never abandoned: cancelling
  :meth:`serve` waits for the current write/fsync to finish. A batch taken for writing
  but not yet handed to its thread is put back, so cancellation never loses a record.

The module is long because it is one state machine - LSN bookkeeping, the active
segment, the failed state - shared by the event loop side and the IO thread; the
formats it writes live in ``segment.py`` and ``group.py``.

Why one module of ~1,000 lines: the writer's state (buffer, active segment, failure
and retry, preallocation, the space reserve) is touched by the trio side and by the IO
steps (``_io_*``) run in a worker thread, under rules that hold only if both halves are
read together; the record and group codecs, the reader and recovery are modules apart.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Container, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import trio

from . import faults
from .checkpoint import newest_checkpoint_bytes
from .errors import InvalidConfiguration, StorageError, WALClosed, WALFailed
from .framing import DEFAULT_MAX_RECORD_BYTES, FRAME_OVERHEAD_BYTES, encode_records
from .fs import OS_FILE_SYSTEM, FileSystem, WritableFile
from .group import (
    GROUP_HEADER_BYTES,
    GROUP_SPLIT_BYTES,
    encode_group_header,
    group_spans,
)
from .reader import LogReader
from .reserve import ensure_reserve, is_disk_full, wanted_reserve_bytes
from .segment import (
    SEGMENT_HEADER_BYTES,
    SEGMENT_VERSION,
    TMP_SUFFIX,
    WAL_DIRNAME,
    BadSegmentHeader,
    SegmentHeader,
    decode_segment_header,
    encode_segment_header,
    parse_segment_name,
    segment_name,
)

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

logger = logging.getLogger("ackbus.storage")

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

OnDurable = Callable[[int], None]
OnFailure = Callable[[int, int, OSError], None]
OnRecovered = Callable[[], None]
OnFsync = Callable[[float], None]
OnReserve = Callable[[bool], None]
InlineAllowed = Callable[[], bool]


@dataclass(frozen=True, slots=True)
class FsyncPolicy:
    """When the WAL fsyncs, and therefore when it reports records durable.

    Build one with :meth:`always`, :meth:`never`, :meth:`every` or
    :func:`parse_fsync_policy`; ``str(policy)`` gives the text form back.
    """

    mode: Literal["always", "interval", "never"]
    interval_ms: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("always", "interval", "never"):
            raise InvalidConfiguration(f"unknown fsync policy mode {self.mode!r}")
        if self.mode == "interval" and self.interval_ms < 1:
            raise InvalidConfiguration(
                f"fsync interval must be a positive number of milliseconds, got {self.interval_ms}"
            )

    @classmethod
    def always(cls) -> FsyncPolicy:
        """fsync every batch before reporting it durable (safe against power loss)."""
        return cls("always")

    @classmethod
    def never(cls) -> FsyncPolicy:
        """Report after the write; fsync only on sync/close/rollover. UNSAFE on power loss."""
        return cls("never")

    @classmethod
    def every(cls, interval_ms: int) -> FsyncPolicy:
        """Report after the write; fsync at most every ``interval_ms``. Loses up to that
        much acknowledged data on power loss."""
        return cls("interval", interval_ms)

    @property
    def interval_s(self) -> float:
        """The interval in seconds (0 unless mode is interval)."""
        return self.interval_ms / 1000.0

    def __str__(self) -> str:
        return f"interval={self.interval_ms}" if self.mode == "interval" else self.mode


def parse_fsync_policy(text: str | int | FsyncPolicy) -> FsyncPolicy:
    """Parse ``"always"``, ``"never"`` or ``"interval=<ms>"`` (an int means interval ms).

    Raises:
        InvalidConfiguration: (a ``ValueError``) anything else, with the accepted forms.
    """
    if isinstance(text, FsyncPolicy):
        return text
    if isinstance(text, int) and not isinstance(text, bool):
        return FsyncPolicy.every(text)
    if not isinstance(text, str):
        raise InvalidConfiguration(f"fsync policy must be a string, got {type(text).__name__}")
    value = text.strip().lower()
    if value in ("always", "never"):
        return FsyncPolicy(value)  # type: ignore[arg-type]
    key, sep, number = value.partition("=")
    if sep and key.strip() == "interval":
        try:
            interval_ms = int(number.strip())
        except ValueError:
            interval_ms = 0
        if interval_ms >= 1:
            return FsyncPolicy.every(interval_ms)
    raise InvalidConfiguration(
        f"invalid fsync policy {text!r}: must be always, never, or interval=<ms> "
        "with a whole number of milliseconds >= 1, e.g. interval=50"
    )


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


@dataclass(slots=True)
class _Segment:
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


@dataclass(frozen=True, slots=True)
class _WriteResult:
    nbytes: int  # written, group headers included
    fsync_s: float | None
    retired_sync_s: float | None


def _noop_durable(lsn: int) -> None:
    pass


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
        preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES,
        reserve_bytes: int = 0,
        fs: FileSystem | None = None,
        reader: LogReader | None = None,
    ) -> None:
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
        self._policy = parse_fsync_policy(fsync_policy)
        self._data_dir = os.fspath(data_dir)
        self._wal_dir = os.path.join(self._data_dir, WAL_DIRNAME)
        self._fs: FileSystem = fs if fs is not None else OS_FILE_SYSTEM
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._on_recovered = on_recovered
        self._on_fsync = on_fsync
        self._on_reserve = on_reserve
        self._segment_max_bytes = segment_max_bytes
        self._retry_interval_s = retry_interval_s
        self._lazy_sync_s = lazy_sync_s
        self._max_record_bytes = max_record_bytes
        self._inline_max_records = inline_max_records
        self._inline_allowed = inline_allowed
        self._preallocate_bytes = preallocate_bytes
        self._reserve_bytes = reserve_bytes
        # the space reserve (reserve.py) is to be made or grown when the writer is idle
        self._reserve_wanted = reserve_bytes > 0
        self.reader = reader if reader is not None else LogReader(
            self._wal_dir, self._fs, max_record_bytes=max_record_bytes
        )

        # LSN bookkeeping. Buffered records are exactly LSNs _buffered_first.._last_lsn.
        self._last_lsn = next_lsn - 1
        self._buffered_first = next_lsn
        self._chunks: list[bytes] = []
        self._frame_sizes: list[int] = []  # of the buffered records, for the reader
        # [start, end) index ranges of buffered records to write in one group (a commit)
        self._together: list[tuple[int, int]] = []
        self._buffered_bytes = 0
        # Some buffered record is not lazy: under "always" the next batch is fsynced.
        self._buffer_wants_sync = False
        self._good_lsn = next_lsn - 1  # last LSN written whole (and synced under "always")
        self._synced_lsn = next_lsn - 1
        self._durable_lsn = next_lsn - 1  # last LSN reported through on_durable

        # First LSNs of the segment files on disk, sorted. Mutated by the IO thread (new
        # segments) and by release_through, hence the (threading) lock.
        self._segments: list[int] = []
        self._segments_lock = threading.Lock()
        # an empty segment named by next_lsn, found at start: appended to (if it is in
        # the current format) or made again with the same void marker
        self._reuse_segment: SegmentHeader | None = None
        self._scan_existing_segments(next_lsn)
        self._active: _Segment | None = None
        self._dirty = False  # bytes written to the active segment since its last fsync
        self._dirty_since = math.inf  # when _dirty last became true
        self._last_sync_time = -math.inf

        self._failed = False
        self._failure: OSError | None = None
        self._retry_at = math.inf
        self._closing = False
        self._closed = False
        self._serving = False
        self._wakeup = trio.Event()
        self._io_lock = trio.Lock()
        # One IO thread at a time: writes, fsyncs and probes are strictly ordered, and the
        # WAL never waits behind unrelated work in trio's shared default thread pool.
        self._limiter = trio.CapacityLimiter(1)

        self._bytes_written = 0
        self._records_written = 0
        self._fsyncs = 0

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
            preallocate_bytes=preallocate_bytes,
            reserve_bytes=reserve_bytes,
            fs=recovery.fs,
            reader=recovery.reader,
        )

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

    # ------------------------------------------------------------------ public API

    @property
    def policy(self) -> FsyncPolicy:
        """The fsync policy in force."""
        return self._policy

    @property
    def last_lsn(self) -> int:
        """LSN of the last record appended (0 if none ever was)."""
        return self._last_lsn

    @property
    def active_first_lsn(self) -> int | None:
        """First LSN of the segment being appended to (None before the first write)."""
        active = self._active
        return active.first_lsn if active is not None else None

    @property
    def failed(self) -> bool:
        """True while the WAL is in its failed state."""
        return self._failed

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
        if self._closing:
            raise WALClosed("the write-ahead log is closed")
        data, count = encode_records(records, max_record_bytes=self._max_record_bytes)
        if count:
            if together and count > 1:
                start = len(self._frame_sizes)
                self._together.append((start, start + count))
            self._chunks.append(data)
            self._frame_sizes.extend([len(payload) + FRAME_OVERHEAD_BYTES for _t, payload in records])
            self._buffered_bytes += len(data)
            self._last_lsn += count
            if not lazy:
                self._buffer_wants_sync = True
            self._wakeup.set()
        return self._last_lsn

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The group-commit writer task. Runs until :meth:`aclose` or cancellation.

        Raises:
            RuntimeError: already serving.
            WALClosed: the WAL was closed.
            Whatever ``on_durable``/``on_failure``/``on_recovered``/``on_fsync`` raise
            (a bug in the caller). ``OSError`` never escapes: it becomes the failed state.
        """
        if self._serving:
            raise RuntimeError("WriteAheadLog.serve() is already running")
        if self._closing:
            raise WALClosed("the write-ahead log is closed")
        self._serving = True
        try:
            task_status.started()
            while not self._closing:
                await self._serve_once()
        finally:
            self._serving = False

    async def sync(self) -> int:
        """Write everything buffered and fsync it now, whatever the policy.

        Use it before taking a checkpoint under the ``never`` policy, or whenever a
        caller needs everything so far on disk. Returns the highest fsynced LSN.

        Raises:
            WALClosed: the WAL is closed.
            WALFailed: the WAL is (or just became) failed; the buffered records were
                reported through ``on_failure``.
        """
        async with self._io_lock:
            if self._closed:
                raise WALClosed("the write-ahead log is closed")
            if self._failed and self._failure is not None and is_disk_full(self._failure):
                # A full disk: the caller is most likely a checkpoint that just made
                # room (its own file, or the space reserve it released). Waiting for the
                # next probe would keep it from releasing segments until the next one.
                await self._probe()
            if not self._failed and self._chunks:
                await self._commit(force_sync=True)
            if not self._failed and self._dirty:
                await self._sync_active()
            if self._failed:
                self._fail_buffered()
                raise WALFailed(f"the write-ahead log is failed: {self._failure}")
            return self._synced_lsn

    def release_through(self, lsn: int, keep: Container[int] = ()) -> list[str]:
        """Delete segment files all of whose records have LSN <= ``lsn``, except those
        whose first LSN is in ``keep`` (they hold bodies of messages still queued).

        Call it once a checkpoint covering ``lsn`` is safely written. The last segment
        (the active one) is never deleted. Returns the paths deleted. It blocks for the
        unlink calls only (a handful of files per checkpoint). A deletion that fails is
        logged and retried by a later call; it does not raise.
        """
        active = self._active
        active_first = active.first_lsn if active is not None else None
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
            self.reader.drop(first)
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
                self._reserve_wanted = True
                self._wakeup.set()
        return removed

    async def aclose(self) -> None:
        """Write and fsync whatever is buffered, close the files, stop :meth:`serve`.

        Runs shielded from cancellation (it is the shutdown path and only waits for the
        disk). Idempotent. IO errors are reported through ``on_failure`` and logged.
        """
        if self._closed:
            return
        self._closing = True
        self._wakeup.set()
        with trio.CancelScope(shield=True):
            async with self._io_lock:
                if self._closed:
                    return
                try:
                    if self._failed:
                        self._fail_buffered()
                    else:
                        if self._chunks:
                            await self._commit(force_sync=True)
                        if not self._failed and self._dirty:
                            await self._sync_active()
                        if self._failed:
                            self._fail_buffered()
                finally:
                    await trio.to_thread.run_sync(self._io_close_active, limiter=self._limiter)
                    self.reader.close()
                    self._closed = True

    def statistics(self) -> WALStatistics:
        """Counters and state, cheap to call."""
        active = self._active
        return WALStatistics(
            bytes_written=self._bytes_written,
            records_written=self._records_written,
            fsyncs=self._fsyncs,
            segments=len(self._segments),
            failed=self._failed,
            last_durable_lsn=self._durable_lsn,
            last_synced_lsn=self._synced_lsn,
            last_lsn=self._last_lsn,
            buffered_records=self._last_lsn - self._buffered_first + 1,
            buffered_bytes=self._buffered_bytes,
            active_segment=active.path if active is not None else None,
        )

    # ------------------------------------------------------------------ writer loop

    async def _serve_once(self) -> None:
        if self._failed:
            deadline = self._retry_at
        elif self._dirty and self._policy.mode == "interval":
            deadline = self._last_sync_time + self._policy.interval_s
        elif self._dirty and self._policy.mode == "always":
            deadline = self._dirty_since + self._lazy_sync_s  # lazily written records
        else:
            deadline = math.inf
        if not self._chunks:
            with trio.move_on_at(deadline):
                while not self._chunks and not self._closing and not self._reserve_due():
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
        # Acquiring the lock is a schedule point (as every trio primitive's is): the
        # tasks woken together with this one run first, so a delivery made by the same
        # publish goes out before a (possibly inline) fsync holds the thread, and the
        # records they append join this batch.
        async with self._io_lock:
            if self._closing:
                return  # aclose() flushes what is left
            if self._failed:
                self._fail_buffered()
                if trio.current_time() >= self._retry_at:
                    await self._probe()
            elif self._chunks:
                await self._commit(force_sync=False)
            elif self._dirty and trio.current_time() >= deadline:
                await self._sync_active()
            elif self._reserve_due():
                self._reserve_wanted = False
                in_place = await trio.to_thread.run_sync(self._io_ensure_reserve, limiter=self._limiter)
                if self._on_reserve is not None:
                    self._on_reserve(in_place)

    def _reserve_due(self) -> bool:
        return self._reserve_wanted and not self._failed

    async def _commit(self, *, force_sync: bool) -> None:
        """Write (and maybe fsync) every buffered record as one batch. Holds _io_lock."""
        chunks = self._chunks
        first = self._buffered_first
        last = self._last_lsn
        nbytes = self._buffered_bytes
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        sizes = self._frame_sizes
        together = self._together
        wants_sync = self._buffer_wants_sync
        self._chunks = []
        self._frame_sizes = []
        self._together = []
        self._buffered_bytes = 0
        self._buffered_first = last + 1
        self._buffer_wants_sync = False
        policy = self._policy
        now = trio.current_time()
        do_sync = (
            force_sync
            or (policy.mode == "always" and wants_sync)
            or (policy.mode == "interval" and now - self._last_sync_time >= policy.interval_s)
        )
        active = self._active
        inline = (
            last - first < self._inline_max_records
            and active is not None
            and active.size + GROUP_HEADER_BYTES + len(data) <= self._segment_max_bytes
            and len(data) <= GROUP_SPLIT_BYTES
            and (self._inline_allowed is None or self._inline_allowed())
        )
        synced = self._synced_lsn
        try:
            if inline:
                # A small batch (a lone publisher's one record): write and fsync on
                # this thread. Handing it to a worker thread and back costs more than
                # the fsync itself (measured: ~150 us vs ~200 us here), and with so
                # few records there is nothing to overlap the fsync with anyway.
                result = self._io_write(data, first, do_sync, sizes, synced, together)
            else:
                result = await trio.to_thread.run_sync(
                    self._io_write, data, first, do_sync, sizes, synced, together, limiter=self._limiter
                )
        except trio.Cancelled:
            # Raised only before the thread started: nothing was written. Put it back.
            self._chunks.insert(0, data)
            shift = len(sizes)
            self._together = together + [(lo + shift, hi + shift) for lo, hi in self._together]
            self._frame_sizes[:0] = sizes
            self._buffered_bytes += nbytes
            self._buffered_first = first
            self._buffer_wants_sync = self._buffer_wants_sync or wants_sync
            raise
        except OSError as exc:
            await self._enter_failed(exc, first, last)
            return
        self._bytes_written += result.nbytes
        self._records_written += last - first + 1
        self._good_lsn = last
        if result.retired_sync_s is not None:
            # the segment moved past was fsynced: everything before this batch is on disk
            self._synced_lsn = max(self._synced_lsn, first - 1)
            self._note_fsync(result.retired_sync_s)
        if result.fsync_s is not None:
            self._synced_lsn = last
            self._dirty = False
            self._last_sync_time = trio.current_time()
            self._note_fsync(result.fsync_s)
        elif not self._dirty:
            self._dirty = True
            self._dirty_since = trio.current_time()
        self._durable_lsn = last
        self._on_durable(last)

    async def _sync_active(self) -> None:
        """fsync the active segment (interval tick, sync(), close). Holds _io_lock."""
        target = self._good_lsn
        try:
            duration = await trio.to_thread.run_sync(self._io_sync, limiter=self._limiter)
        except OSError as exc:
            logger.error(
                "fsync of the write-ahead log failed: %s; LSNs %d..%d were reported durable "
                "under fsync policy %s but may not be on disk",
                exc,
                self._synced_lsn + 1,
                target,
                self._policy,
            )
            await self._enter_failed(exc, None, None)
            return
        if duration is not None:
            self._note_fsync(duration)
        self._synced_lsn = target
        self._dirty = False
        self._last_sync_time = trio.current_time()

    def _note_fsync(self, duration_s: float) -> None:
        self._fsyncs += 1
        if self._on_fsync is not None:
            self._on_fsync(duration_s)

    async def _enter_failed(self, exc: OSError, first: int | None, last: int | None) -> None:
        """Switch to the failed state after an IO error. Holds _io_lock."""
        self._failed = True
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
            await trio.to_thread.run_sync(self._io_abandon_active, limiter=self._limiter)
        if first is not None and last is not None and self._on_failure is not None:
            self._on_failure(first, last, exc)

    def _fail_buffered(self) -> None:
        """Report every buffered record as failed without writing it (failed state)."""
        if not self._chunks:
            return
        first, last = self._buffered_first, self._last_lsn
        self._chunks = []
        self._frame_sizes = []
        self._together = []
        self._buffered_bytes = 0
        self._buffered_first = last + 1
        self._buffer_wants_sync = False
        assert self._failure is not None
        if self._on_failure is not None:
            self._on_failure(first, last, self._failure)

    async def _probe(self) -> None:
        """Try to leave the failed state by starting a fresh segment. Holds _io_lock."""
        next_lsn = self._last_lsn + 1
        header = SegmentHeader(next_lsn, void_from_lsn=self._good_lsn + 1)
        try:
            await trio.to_thread.run_sync(self._io_probe, header, limiter=self._limiter)
        except OSError as exc:
            self._failure = exc
            self._retry_at = trio.current_time() + self._retry_interval_s
            logger.warning(
                "write-ahead log still failing (%s); next probe in %.3g s",
                exc,
                self._retry_interval_s,
            )
            return
        self._failed = False
        self._failure = None
        self._retry_at = math.inf
        self._dirty = False
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
        retired_sync_s: float | None = None
        spans = group_spans(sizes, together) if len(data) > GROUP_SPLIT_BYTES else None
        nbytes = len(data) + GROUP_HEADER_BYTES * (1 if spans is None else len(spans))
        segment = self._active
        if segment is None or (
            segment.has_records and segment.size + nbytes > self._segment_max_bytes
        ):
            if segment is not None:
                retired_sync_s = self._io_retire_active()
            segment = self._io_open_segment(first_lsn)
            # every earlier segment was fsynced before this one was started
            synced_lsn = max(synced_lsn, first_lsn - 1)
        base = segment.size
        if spans is None:
            parts: Sequence[bytes | memoryview] = (
                encode_group_header(first_lsn, len(sizes), synced_lsn, len(data)),
                data,
            )
        else:
            parts = self._group_parts(data, first_lsn, sizes, spans, synced_lsn)
        try:
            faults.hit("wal.write_error")
            faults.hit("wal.write_enospc")
        except OSError:
            half = b"".join(parts)[: nbytes // 2]
            segment.file.write(half)
            segment.size += len(half)
            raise
        if base + nbytes > segment.allocated:
            self._io_preallocate(segment, base + nbytes)
        segment.file.write_parts(parts)
        segment.size += nbytes
        segment.has_records = True
        faults.hit("wal.after_write")
        fsync_s = self._io_fsync(segment) if do_sync else None
        segment.good_size = segment.size
        reader = self.reader
        if spans is None:
            reader.note_written(segment.first_lsn, segment.path, base + GROUP_HEADER_BYTES, sizes)
        else:
            pos = base
            for start, end, frame_bytes in spans:
                pos += GROUP_HEADER_BYTES
                reader.note_written(segment.first_lsn, segment.path, pos, sizes[start:end])
                pos += frame_bytes
        return _WriteResult(nbytes, fsync_s, retired_sync_s)

    @staticmethod
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

    def _io_fsync(self, segment: _Segment) -> float:
        faults.hit("wal.before_fsync")
        faults.hit("wal.fsync_error")
        faults.hit("wal.fsync_enospc")
        started = time.perf_counter()
        segment.file.sync()
        duration = time.perf_counter() - started
        faults.hit("wal.after_fsync")
        return duration

    def _io_sync(self) -> float | None:
        segment = self._active
        if segment is None:
            return None
        return self._io_fsync(segment)

    def _io_preallocate(self, segment: _Segment, need: int) -> None:
        """Reserve space for at least ``need`` bytes and a step beyond, within the
        segment's size limit (best effort: a refusal only costs the fsync saving)."""
        step = self._preallocate_bytes
        if not step:
            return
        target = max(need, min(need + step, self._segment_max_bytes))
        try:
            faults.hit("wal.preallocate_enospc")
            segment.file.preallocate(target)
        except OSError as exc:
            logger.info("could not preallocate %s to %d bytes: %s", segment.path, target, exc)
            target = self._segment_max_bytes  # do not ask again for this segment
        segment.allocated = max(segment.allocated, target)

    def _io_cut_preallocated(self, segment: _Segment) -> bool:
        """Cut the segment's preallocated space off (a finished segment ends at its
        last record); True if the file changed and needs an fsync."""
        if segment.allocated <= segment.size:
            return False
        segment.file.truncate(segment.size)
        segment.allocated = segment.size
        return True

    def _io_retire_active(self) -> float | None:
        """Cut, fsync (if needed) and close the active segment before starting the next."""
        segment = self._active
        assert segment is not None
        cut = self._io_cut_preallocated(segment)
        duration = self._io_fsync(segment) if self._dirty or cut else None
        self._dirty = False
        self._active = None
        segment.file.close()
        return duration

    def _io_open_segment(self, first_lsn: int) -> _Segment:
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
                self._active = _Segment(first_lsn, path, file, size, size, False, size)
                return self._active
        return self._io_create_segment(SegmentHeader(first_lsn))

    def _io_create_segment(self, header: SegmentHeader) -> _Segment:
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
                allocated = min(len(data) + self._preallocate_bytes, max(self._segment_max_bytes, len(data)))
                try:
                    faults.hit("wal.preallocate_enospc")
                    file.preallocate(allocated)
                except OSError as exc:
                    logger.info("could not preallocate %s: %s", tmp, exc)
                    allocated = self._segment_max_bytes  # do not ask again for it
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
        self._active = _Segment(header.first_lsn, path, file, len(data), len(data), False, allocated)
        return self._active

    def _io_ensure_reserve(self) -> bool:
        """Make or grow the space reserve (best effort: a full disk just has to wait);
        whether it is in place."""
        size = wanted_reserve_bytes(self._reserve_bytes, newest_checkpoint_bytes(self._data_dir, self._fs))
        return ensure_reserve(self._data_dir, size, self._fs)

    def want_reserve(self) -> None:
        """The space reserve was used (a checkpoint on a full disk took it): make it
        again when the writer is idle and there is room (reported by ``on_reserve``)."""
        if self._reserve_bytes:
            self._reserve_wanted = True
            self._wakeup.set()

    def _io_abandon_active(self) -> None:
        """After a failure: truncate the active segment to its last good offset, close it."""
        segment = self._active
        if segment is None:
            return
        self._active = None
        self._dirty = False
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

    def _io_probe(self, header: SegmentHeader) -> None:
        self._reuse_segment = None
        self._io_create_segment(header)

    def _io_close_active(self) -> None:
        segment = self._active
        self._active = None
        if segment is None:
            return
        try:
            if not self._failed and self._io_cut_preallocated(segment):
                segment.file.sync()
        except OSError as exc:
            logger.warning(
                "could not cut the preallocated space off %s on close (%s); recovery will",
                segment.path,
                exc,
            )
        finally:
            segment.file.close()


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

"""ackbus storage: write-ahead log segments, checkpoints and recovery.

This layer knows bytes and files, not HTTP and not the broker's data model. A record is
``(rtype: int 0..255, payload: bytes)``; the core decides what types and payloads mean.
Records are numbered by LSN 1, 2, 3... across the log; the WAL assigns them in append
order and reports, through a callback, the highest LSN that is durable.

Typical use (the broker's runtime does this, see ``broker.runtime``)::

    recovery = recover(data_dir)                      # read phase
    core.begin_recovery()
    for rtype, payload in recovery.checkpoint_records:
        core.replay(rtype, payload, 0)                # checkpoint state: no LSN
    for lsn, rtype, payload in recovery.wal_records:
        core.replay(rtype, payload, lsn)
    core.finish_recovery(recovery.last_lsn)           # == recovery.next_lsn - 1
    wal = WriteAheadLog.open(recovery, fsync_policy=parse_fsync_policy("always"),
                             reserve_bytes=DEFAULT_RESERVE_BYTES,
                             on_durable=..., on_failure=..., on_recovered=...)
    async with trio.open_nursery() as nursery:       # append phase
        await nursery.start(wal.serve)
        last_lsn = wal.append_nowait([(rtype, payload), ...])
        ...
        keep = SegmentsToKeep(wal.reader)             # segments the checkpoint refers to
        await trio.to_thread.run_sync(write_checkpoint, data_dir, lsn, records)
        await wal.sync()                              # (probes at once after ENOSPC)
        wal.release_through(keep.release_limit(lsn), keep.counts)
        ...
        await wal.aclose()

Records read back by LSN (``wal.reader.read``) are ``(rtype, payload)`` or a
:class:`ReadFailure` saying why not, and whether that is ``transient``. On a full disk,
``write_checkpoint`` uses the space reserve the WAL keeps (``reserve_bytes``).

See ``docs/durability.md`` for the on-disk format, the fsync policies and recovery.
"""

from .checkpoint import (
    CheckpointInfo,
    LoadedCheckpoint,
    read_latest_checkpoint,
    write_checkpoint,
)
from .errors import (
    CorruptCheckpoint,
    CorruptLog,
    InvalidConfiguration,
    RecordTooLarge,
    RecoveryNotFinished,
    StorageError,
    WALClosed,
    WALFailed,
)
from .faults import FaultsNotAllowed
from .faults import check_environment as check_fault_environment
from .framing import (
    DEFAULT_MAX_RECORD_BYTES,
    NEED_DATA,
    FrameProblem,
    NeedData,
    ProblemKind,
    RecordDecoder,
    encode_record,
    encode_records,
)
from .fs import FileSystem, OsFileSystem, WritableFile
from .lock import LOCK_FILENAME, DataDirInUse, DataDirLock
from .reader import LogReader, ReadFailure, ReadResult, SegmentsToKeep
from .recovery import Recovery, RecoveryReport, TruncatedTail, VoidedRecords, recover
from .reserve import DEFAULT_RESERVE_BYTES, reserve_present
from .wal import (
    DEFAULT_RETRY_INTERVAL_S,
    DEFAULT_SEGMENT_MAX_BYTES,
    FsyncPolicy,
    WALStatistics,
    WriteAheadLog,
    open_wal,
    parse_fsync_policy,
)

__all__ = [
    # framing
    "DEFAULT_MAX_RECORD_BYTES",
    "NEED_DATA",
    "NeedData",
    "FrameProblem",
    "ProblemKind",
    "RecordDecoder",
    "encode_record",
    "encode_records",
    # write-ahead log
    "DEFAULT_SEGMENT_MAX_BYTES",
    "DEFAULT_RETRY_INTERVAL_S",
    "FsyncPolicy",
    "parse_fsync_policy",
    "WALStatistics",
    "WriteAheadLog",
    "SegmentsToKeep",
    "LogReader",
    "ReadFailure",
    "ReadResult",
    "open_wal",
    # disk full
    "DEFAULT_RESERVE_BYTES",
    "reserve_present",
    # checkpoints
    "CheckpointInfo",
    "LoadedCheckpoint",
    "write_checkpoint",
    "read_latest_checkpoint",
    # recovery
    "recover",
    "Recovery",
    "RecoveryReport",
    "TruncatedTail",
    "VoidedRecords",
    # file system seam
    "FileSystem",
    "WritableFile",
    "OsFileSystem",
    # one process per data directory
    "DataDirLock",
    "DataDirInUse",
    "LOCK_FILENAME",
    # test-only fault points
    "FaultsNotAllowed",
    "check_fault_environment",
    # errors
    "StorageError",
    "CorruptLog",
    "CorruptCheckpoint",
    "RecordTooLarge",
    "InvalidConfiguration",
    "WALClosed",
    "WALFailed",
    "RecoveryNotFinished",
]

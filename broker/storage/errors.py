"""The storage layer's error hierarchy.

Every error ``broker.storage`` raises on purpose is a :class:`StorageError`. Errors about
bad data on disk carry the file and byte offset, because an operator has to find and
inspect the bytes before deciding what to do; errors about bad arguments are also
``ValueError`` so that ordinary argument checking catches them.

``OSError`` from the operating system is not wrapped: the write-ahead log turns IO
failures into its failed state (see ``wal.py``) and never lets them escape its writer
task; the synchronous helpers (checkpoints, recovery) let them propagate unchanged.
"""

from __future__ import annotations

__all__ = [
    "StorageError",
    "CorruptLog",
    "CorruptCheckpoint",
    "RecordTooLarge",
    "InvalidConfiguration",
    "WALClosed",
    "WALFailed",
    "RecoveryNotFinished",
]


class StorageError(Exception):
    """Base of every error raised on purpose by ``broker.storage``."""


class CorruptLog(StorageError):
    """The write-ahead log is damaged somewhere other than a torn tail.

    Recovery never skips such damage silently: the records after it may be needed. The
    message names the file and byte offset and explains how to salvage with
    ``repair=True``.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"corrupt write-ahead log: {path} at byte offset {offset}: {reason}. "
            "This is not a torn tail (it had been fsynced, valid data follows it, or it "
            "is not in the last segment), so recovery stopped instead of skipping it. "
            "To start anyway, "
            "restart with repair enabled (the broker's --repair flag, i.e. "
            "recover(..., repair=True)): it keeps every record before offset "
            f"{offset}, moves the rest aside to *.dropped files and loses whatever "
            "those held."
        )


class CorruptCheckpoint(StorageError):
    """A checkpoint file is incomplete or damaged, and no older one could stand in."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"unreadable checkpoint {path}: {reason}")


class RecordTooLarge(StorageError, ValueError):
    """A record's payload exceeds the configured maximum record size."""

    def __init__(self, size: int, max_record_bytes: int) -> None:
        self.size = size
        self.max_record_bytes = max_record_bytes
        super().__init__(
            f"record of {size} bytes (type byte + payload) exceeds the maximum record "
            f"size of {max_record_bytes} bytes"
        )


class InvalidConfiguration(StorageError, ValueError):
    """A storage setting (fsync policy, sizes, intervals) is not acceptable."""


class WALClosed(StorageError):
    """The write-ahead log was closed; it accepts no more records."""


class WALFailed(StorageError):
    """The write-ahead log is in its failed state (an IO error it has not recovered from).

    Raised only by calls that must answer synchronously, such as ``sync()``; records
    appended while failed are reported through the ``on_failure`` callback instead.
    """


class RecoveryNotFinished(StorageError):
    """A recovery result was used before its WAL records were all read."""

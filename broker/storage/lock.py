"""One process per data directory: an exclusive ``flock`` on ``<data_dir>/lock``.

The broker holds it while it serves; the offline tools (``python -m broker users``)
take it too, so they refuse to write to a log a running broker appends to (two
writers would interleave records and corrupt it). ``flock`` locks belong to the open
file and die with the process, so a ``kill -9`` leaves no stale lock behind -- unlike
a PID file. Linux and the BSDs; on a network file system ``flock`` may not be
honoured (the log needs a local disk anyway, for fsync).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from .errors import StorageError

__all__ = ["DataDirInUse", "DataDirLock", "LOCK_FILENAME"]

LOCK_FILENAME = "lock"


class DataDirInUse(StorageError):
    """Another process (a running broker) holds the data directory."""


class DataDirLock:
    """``with DataDirLock(path):`` holds the data directory (creating it if needed).

    Raises (on entry): ``DataDirInUse`` when another process holds it, ``OSError``
    when it cannot be created or opened.
    """

    def __init__(self, data_dir: Path | str) -> None:
        self.path = Path(data_dir) / LOCK_FILENAME
        self._fd: int | None = None

    def acquire(self) -> None:
        os.makedirs(self.path.parent, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirInUse(
                f"data directory {self.path.parent} is in use by another process (a running broker?)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file releases the flock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

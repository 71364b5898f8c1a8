"""The file operations storage needs, behind one small interface.

One job: give the WAL, checkpoints and recovery every file operation they use through
:class:`FileSystem`, so that tests can substitute a double (``broker.storage.testing``)
that records what was fsynced and can "lose power".

Rules:

* Methods are blocking; async callers run them in a worker thread.
* ``WritableFile.write`` writes everything or raises ``OSError`` (a short write is
  retried; the OS returning an error mid-way leaves a partial write on disk, which is the
  case the WAL's failure path handles).
* ``WritableFile.sync`` makes the file's data durable (``fdatasync``: the data and the
  metadata needed to read it back, such as its size). ``sync_dir`` makes a directory's
  entries durable: creations, renames and deletions in it.
* ``WritableFile.preallocate`` reserves blocks past the end of what was written: the file
  then reads as zeros there, and writes still go on at the end of what was written.
  Overwriting reserved blocks changes no file size and allocates nothing, so the
  ``fdatasync`` after it has less metadata to commit (measured here: about 130 instead
  of 185 us).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import BinaryIO, Protocol

__all__ = ["FileSystem", "WritableFile", "OsFileSystem", "OS_FILE_SYSTEM"]

_HAVE_FDATASYNC = hasattr(os, "fdatasync")
_HAVE_FALLOCATE = hasattr(os, "posix_fallocate")
_HAVE_WRITEV = hasattr(os, "writev")
# at most this many buffers per writev call (POSIX guarantees 16, Linux takes 1024)
_IOV_MAX = 512


class WritableFile(Protocol):
    """An open file that the storage layer appends to."""

    @property
    def path(self) -> str:
        """The path the file was opened as."""
        ...

    def write(self, data: bytes) -> None:
        """Append all of ``data`` (raises ``OSError``, possibly after a partial write)."""
        ...

    def write_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        """Append all of ``parts``, in order, as one write where the system allows
        (``writev``): a header and the data it describes, without joining them first."""
        ...

    def sync(self) -> None:
        """Make the written data durable (fdatasync)."""
        ...

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes; later writes append at the new end."""
        ...

    def preallocate(self, size: int) -> None:
        """Make the file at least ``size`` bytes long, zeros past what was written,
        without moving where the next write goes (raises ``OSError``)."""
        ...

    def close(self) -> None:
        """Close the file; idempotent."""
        ...


class FileSystem(Protocol):
    """The directory and file operations of the storage layer."""

    def create(self, path: str) -> WritableFile:
        """Create (or truncate) ``path`` and open it for appending."""
        ...

    def open_append(self, path: str) -> WritableFile:
        """Open an existing file for appending at its end."""
        ...

    def open_read(self, path: str) -> BinaryIO:
        """Open a file for reading (unbuffered binary)."""
        ...

    def listdir(self, path: str) -> list[str]:
        """Names in a directory (empty if it does not exist)."""
        ...

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        ...

    def getsize(self, path: str) -> int:
        """Size of a file in bytes."""
        ...

    def makedirs(self, path: str) -> None:
        """Create a directory and missing parents, each made durable in its parent."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically rename ``src`` to ``dst``, replacing ``dst`` (not yet durable)."""
        ...

    def remove(self, path: str) -> None:
        """Delete a file (not yet durable)."""
        ...

    def truncate(self, path: str, size: int) -> None:
        """Cut a file to ``size`` bytes and make that durable."""
        ...

    def sync_dir(self, path: str) -> None:
        """Make a directory's entries durable."""
        ...


class _OsFile:
    """A file descriptor opened for appending: writes go on at the end of what was
    written (not at the file's size, which preallocation may have moved past it)."""

    __slots__ = ("_fd", "_path")

    def __init__(self, path: str, flags: int) -> None:
        self._path = path
        self._fd = os.open(path, flags | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o644)
        os.lseek(self._fd, 0, os.SEEK_END)

    @property
    def path(self) -> str:
        return self._path

    def write(self, data: bytes) -> None:
        with memoryview(data) as view:
            written = os.write(self._fd, view)
            while written < len(view):
                written += os.write(self._fd, view[written:])

    def write_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        if not _HAVE_WRITEV:  # pragma: no cover - Windows
            self.write(b"".join(parts))
            return
        if len(parts) <= _IOV_MAX:
            written = os.writev(self._fd, parts)
            if written == sum(map(len, parts)):
                return  # the common case: everything in one call
        else:
            written = 0
        # A short write (a signal, a full disk, more than _IOV_MAX parts): go on from
        # where it stopped.
        pending = [memoryview(part) for part in parts if len(part)]
        while True:
            while pending and written >= len(pending[0]):
                written -= len(pending[0])
                pending.pop(0)
            if not pending:
                return
            if written:
                pending[0] = pending[0][written:]
            written = os.writev(self._fd, pending[:_IOV_MAX])

    def sync(self) -> None:
        if _HAVE_FDATASYNC:
            os.fdatasync(self._fd)
        else:  # pragma: no cover - macOS and Windows
            os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        os.lseek(self._fd, size, os.SEEK_SET)

    def preallocate(self, size: int) -> None:
        if _HAVE_FALLOCATE:
            os.posix_fallocate(self._fd, 0, size)
        else:  # pragma: no cover - macOS and Windows: nothing to gain, nothing to do
            pass

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


class OsFileSystem:
    """The real thing: POSIX calls on the local file system."""

    def create(self, path: str) -> WritableFile:
        return _OsFile(path, os.O_CREAT | os.O_TRUNC)

    def open_append(self, path: str) -> WritableFile:
        return _OsFile(path, 0)

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb", buffering=0)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def getsize(self, path: str) -> int:
        return os.path.getsize(path)

    def makedirs(self, path: str) -> None:
        path = os.path.abspath(path)
        if os.path.isdir(path):
            return
        parent = os.path.dirname(path)
        self.makedirs(parent)
        try:
            os.mkdir(path)
        except FileExistsError:
            return
        self.sync_dir(parent)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.remove(path)

    def truncate(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: The shared real file system.
OS_FILE_SYSTEM: FileSystem = OsFileSystem()

"""The space reserve: disk space held back for the day the disk is full.

One job: keep a preallocated file, ``<data_dir>/reserve``, whose space a checkpoint can
use when nothing else is left. On a full disk the WAL fails its writes, and the only
way out - deleting log segments - needs a checkpoint first, which needs space: without
a reserve the broker would be wedged until an operator freed some.

* :func:`write_checkpoint` (``checkpoint.py``) calls :func:`release_reserve` when a step
  of writing the checkpoint fails with ``ENOSPC``, and tries that step once more.
* The WAL (``wal_segments.py``, ``reserve_bytes``) makes it with :func:`ensure_reserve`
  when it starts and again after it released segments, in its IO thread; when the disk
  has no room for it, it tries again after the next release.
* Its size: :func:`wanted_reserve_bytes`, twice the newest checkpoint (a checkpoint is
  mostly a list of queued messages, 16 bytes each, so the next one is rarely much
  larger) and at least the configured minimum.

The reserve is ordinary file space: it counts in the data directory's disk use.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Final

from .fs import FileSystem

__all__ = [
    "RESERVE_NAME",
    "DEFAULT_RESERVE_BYTES",
    "ensure_reserve",
    "release_reserve",
    "reserve_present",
    "wanted_reserve_bytes",
    "is_disk_full",
]

logger = logging.getLogger("ackbus.storage")

#: File name of the reserve in the data directory.
RESERVE_NAME: Final = "reserve"
#: A sensible minimum size for the reserve (a setting's default).
DEFAULT_RESERVE_BYTES: Final = 8 * 1024 * 1024
_TMP_SUFFIX: Final = ".tmp"
_ZEROS: Final = bytes(1 << 20)


def is_disk_full(exc: OSError) -> bool:
    """Whether an IO error means the file system is out of space."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _path(data_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(data_dir), RESERVE_NAME)


def wanted_reserve_bytes(minimum: int, checkpoint_bytes: int) -> int:
    """The size the reserve should have: twice the newest checkpoint's
    (``checkpoint_bytes``), at least ``minimum``."""
    return max(minimum, 2 * checkpoint_bytes)


def ensure_reserve(data_dir: str | os.PathLike[str], size_bytes: int, fs: FileSystem) -> bool:
    """Make the reserve at least ``size_bytes`` large; True if it is (now) in place.

    Blocking. Made as ``reserve.tmp``, space allocated (or zeros written where the file
    system cannot preallocate), fsynced, renamed into place, directory fsynced. A disk
    without room for it is no error: the attempt is undone, logged, and False returned.
    """
    path = _path(data_dir)
    try:
        if fs.exists(path) and fs.getsize(path) >= size_bytes:
            return True
    except OSError:
        pass
    tmp = path + _TMP_SUFFIX
    try:
        fs.makedirs(os.fspath(data_dir))
        file = fs.create(tmp)
        try:
            file.preallocate(size_bytes)
            written = fs.getsize(tmp)
            while written < size_bytes:  # no fallocate here: really write the space
                chunk = _ZEROS[: min(len(_ZEROS), size_bytes - written)]
                file.write(chunk)
                written += len(chunk)
            file.sync()
        finally:
            file.close()
        fs.rename(tmp, path)
        fs.sync_dir(os.fspath(data_dir))
    except OSError as exc:
        try:
            fs.remove(tmp)
        except OSError:
            pass
        logger.info("could not make the space reserve %s of %d bytes: %s", path, size_bytes, exc)
        return False
    logger.info("space reserve %s in place: %d bytes", path, size_bytes)
    return True


def reserve_present(data_dir: str | os.PathLike[str]) -> bool:
    """Whether the reserve file is in place (a checkpoint on a full disk deletes it)."""
    return os.path.exists(_path(data_dir))


def release_reserve(data_dir: str | os.PathLike[str], fs: FileSystem) -> bool:
    """Delete the reserve to free its space; True if there was one. Blocking.

    Raises:
        OSError: the reserve exists and cannot be deleted.
    """
    path = _path(data_dir)
    if not fs.exists(path):
        return False
    size = fs.getsize(path)
    fs.remove(path)
    try:
        fs.sync_dir(os.fspath(data_dir))  # some file systems free the blocks at commit
    except OSError:
        pass
    logger.warning(
        "disk full: released the space reserve %s (%d bytes) to write a checkpoint; it is "
        "made again once log segments are released",
        path,
        size,
    )
    return True

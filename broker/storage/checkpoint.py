"""Checkpoints: the broker's live state as of one LSN, in one self-checking file.

One job: write a snapshot of records so that the WAL before its LSN can be deleted, and
read back the newest snapshot that is whole.

File ``<data_dir>/checkpoint/<lsn in 16 hex>.ckpt``::

    header   24 bytes: magic b"ACKBUSCP" | version u32 (1) | lsn u64 | crc32 u32 of the 20 before
    records  frames exactly as in the WAL (framing.py), in the order given
    trailer  20 bytes: 0xFFFFFFFF u32 | record count u64 | crc32 of all frame bytes u32
             | crc32 u32 of the 16 before

The trailer starts with a length field no frame can have (it exceeds every maximum record
size), so it cannot be mistaken for a record; a file without a valid trailer was not
completely written and is never used.

Rules:

* Every file replacement is temp -> fsync -> rename -> fsync directory: the checkpoint is
  written as ``<name>.ckpt.tmp``, fsynced, renamed to ``<name>.ckpt``, the directory
  fsynced; only then are older checkpoints deleted. A crash at any step leaves either
  the old checkpoint or the new one readable, never neither.
* Leftover ``.tmp`` files are removed when the checkpoint directory is read at start.
* Reading verifies the header, the trailer and the CRC of the whole body before it
  returns anything, so a damaged newest checkpoint is detected before a single record is
  applied, and an older one (which exists only if a crash interrupted the deletion) is
  used instead - loudly.
* A full disk is not the end: if writing fails with ``ENOSPC``, the space reserve
  (``reserve.py``) is released and the step tried once more, so that a checkpoint - the
  only way to free log segments - can still be written.
* :func:`write_checkpoint` is synchronous and blocking: the broker runs it in a worker
  thread while it keeps serving. Only one checkpoint may be written at a time.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final, NamedTuple

from . import faults
from .errors import CorruptCheckpoint
from .framing import DEFAULT_MAX_RECORD_BYTES, RecordDecoder, encode_records
from .fs import OS_FILE_SYSTEM, FileSystem, WritableFile
from .reserve import is_disk_full, release_reserve

__all__ = [
    "CHECKPOINT_DIRNAME",
    "CheckpointInfo",
    "LoadedCheckpoint",
    "write_checkpoint",
    "read_latest_checkpoint",
    "checkpoint_name",
    "newest_checkpoint_bytes",
]

logger = logging.getLogger("ackbus.storage")

CHECKPOINT_DIRNAME: Final = "checkpoint"
_SUFFIX: Final = ".ckpt"
_TMP_SUFFIX: Final = ".tmp"
_CORRUPT_SUFFIX: Final = ".corrupt"
_NAME_RE: Final = re.compile(r"^([0-9a-f]{16})\.ckpt$")
_MAGIC: Final = b"ACKBUSCP"
_VERSION: Final = 1
_HEADER: Final = struct.Struct("<8sIQ")
_CRC: Final = struct.Struct("<I")
_TRAILER: Final = struct.Struct("<IQI")
_TRAILER_MARKER: Final = 0xFFFFFFFF
HEADER_BYTES: Final = _HEADER.size + _CRC.size
TRAILER_BYTES: Final = _TRAILER.size + _CRC.size
_CHUNK_BYTES: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """What :func:`write_checkpoint` wrote."""

    lsn: int
    path: str
    records: int
    size_bytes: int
    #: older checkpoint files deleted after this one was in place
    deleted: tuple[str, ...] = ()


class _CheckpointPair(NamedTuple):
    lsn: int
    records: Iterator[tuple[int, bytes]]


class LoadedCheckpoint(_CheckpointPair):
    """A verified checkpoint: ``(lsn, records)`` with a single-use records iterator.

    It is a pair, so ``lsn, records = read_latest_checkpoint(data_dir)`` works; ``path``
    names the file and ``skipped`` the newer, unreadable checkpoints set aside.
    """

    path: str
    skipped: tuple[str, ...]

    def __new__(
        cls,
        lsn: int,
        records: Iterator[tuple[int, bytes]],
        path: str = "",
        skipped: tuple[str, ...] = (),
    ) -> LoadedCheckpoint:
        self = super().__new__(cls, lsn, records)
        self.path = path
        self.skipped = skipped
        return self


def checkpoint_name(lsn: int) -> str:
    """File name of the checkpoint at ``lsn``."""
    if lsn < 0:
        raise ValueError(f"checkpoint LSN must be >= 0, got {lsn}")
    return f"{lsn:016x}{_SUFFIX}"


def _checkpoint_dir(data_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(data_dir), CHECKPOINT_DIRNAME)


def _list_checkpoints(fs: FileSystem, directory: str) -> list[int]:
    found = []
    for name in fs.listdir(directory):
        match = _NAME_RE.match(name)
        if match:
            found.append(int(match.group(1), 16))
    return sorted(found)


def newest_checkpoint_bytes(data_dir: str | os.PathLike[str], fs: FileSystem | None = None) -> int:
    """Size of the newest checkpoint file (0 if there is none)."""
    fs = fs if fs is not None else OS_FILE_SYSTEM
    directory = _checkpoint_dir(data_dir)
    existing = _list_checkpoints(fs, directory)
    if not existing:
        return 0
    try:
        return fs.getsize(os.path.join(directory, checkpoint_name(existing[-1])))
    except OSError:
        return 0


def write_checkpoint(
    data_dir: str | os.PathLike[str],
    lsn: int,
    records: Iterable[tuple[int, bytes]],
    *,
    fs: FileSystem | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    before_rename: Callable[[], None] | None = None,
) -> CheckpointInfo:
    """Write a checkpoint of ``records`` covering every WAL record up to ``lsn``.

    ``before_rename`` is called once the temporary file is written and fsynced, before
    it is renamed into place: the caller makes the log durable through ``lsn`` there
    (a checkpoint must never refer to a record a power loss can still take; see
    docs/durability.md). If it raises, the temporary file is removed and the exception
    propagates; the previous checkpoint stays in place.

    Blocking; run it in a worker thread. Records are streamed to disk in ~1 MiB writes,
    so ``records`` may be a generator over a large state. After it returns, the WAL may
    be released through ``lsn`` (``WriteAheadLog.release_through``).

    If the disk is full (``ENOSPC``) and the data directory holds a space reserve
    (``reserve.py``), the reserve is deleted to make room and the step that failed is
    tried once more (creating, writing or renaming the file; a failed fsync is never
    retried, but the reserve is released for the next attempt).

    Raises:
        ValueError: ``lsn`` is older than an existing checkpoint, or a record is invalid
            (type outside 0..255, ``RecordTooLarge``); the temporary file is removed.
        OSError: from the file system; the temporary file is removed if possible and the
            previous checkpoint stays in place.
    """
    fs = fs if fs is not None else OS_FILE_SYSTEM
    directory = _checkpoint_dir(data_dir)
    fs.makedirs(directory)
    existing = _list_checkpoints(fs, directory)
    if existing and existing[-1] > lsn:
        raise ValueError(
            f"checkpoint LSN {lsn} is older than the existing checkpoint at LSN {existing[-1]}"
        )
    path = os.path.join(directory, checkpoint_name(lsn))
    tmp = path + _TMP_SUFFIX
    header = _HEADER.pack(_MAGIC, _VERSION, lsn)
    header += _CRC.pack(zlib.crc32(header))
    reserve = _Reserve(data_dir, fs)
    try:
        file = fs.create(tmp)
    except OSError as exc:
        if not reserve.freed_for(exc):
            raise
        file = fs.create(tmp)
    count = 0
    body_crc = 0
    size = 0
    try:
        try:
            size = _write(file, header, size, reserve)
            batch: list[tuple[int, bytes]] = []
            batch_bytes = 0
            for record in records:
                batch.append(record)
                batch_bytes += len(record[1]) + 9
                if batch_bytes >= _CHUNK_BYTES:
                    data, n = encode_records(batch, max_record_bytes=max_record_bytes)
                    size = _write(file, data, size, reserve)
                    body_crc = zlib.crc32(data, body_crc)
                    count += n
                    batch = []
                    batch_bytes = 0
            if batch:
                data, n = encode_records(batch, max_record_bytes=max_record_bytes)
                size = _write(file, data, size, reserve)
                body_crc = zlib.crc32(data, body_crc)
                count += n
            trailer = _TRAILER.pack(_TRAILER_MARKER, count, body_crc)
            trailer += _CRC.pack(zlib.crc32(trailer))
            size = _write(file, trailer, size, reserve)
            faults.hit("checkpoint.after_tmp_write")
            try:
                faults.hit("checkpoint.fsync_error")
                faults.hit("checkpoint.fsync_enospc")
                file.sync()
            except OSError as exc:
                # Never retried: after a failed fsync the kernel may have dropped the
                # pages it could not write, and a second fsync would then "succeed".
                # The space is freed for the next attempt all the same.
                reserve.freed_for(exc)
                raise
        finally:
            file.close()
        faults.hit("checkpoint.before_log_sync")
        if before_rename is not None:
            before_rename()
    except Exception:
        try:
            fs.remove(tmp)
        except OSError:
            pass
        raise
    faults.hit("checkpoint.before_rename")
    try:
        try:
            faults.hit("checkpoint.rename_error")
            faults.hit("checkpoint.rename_enospc")
            fs.rename(tmp, path)
        except OSError as exc:
            if not reserve.freed_for(exc):
                raise
            fs.rename(tmp, path)
    except OSError:
        try:
            fs.remove(tmp)
        except OSError:
            pass
        raise
    faults.hit("checkpoint.after_rename")
    try:
        faults.hit("checkpoint.dir_fsync_error")
        faults.hit("checkpoint.dir_fsync_enospc")
        fs.sync_dir(directory)
    except OSError as exc:
        # not retried either (as a file's fsync); the older checkpoints stay
        reserve.freed_for(exc)
        raise
    faults.hit("checkpoint.after_dir_fsync")
    deleted = []
    for old in existing:
        if old >= lsn:
            continue
        old_path = os.path.join(directory, checkpoint_name(old))
        try:
            fs.remove(old_path)
        except OSError as exc:
            logger.warning("could not delete old checkpoint %s: %s", old_path, exc)
        else:
            deleted.append(old_path)
    if deleted:
        try:
            fs.sync_dir(directory)
        except OSError as exc:  # the new checkpoint is durable; this is housekeeping
            logger.warning("could not fsync %s after deleting old checkpoints: %s", directory, exc)
    logger.info("checkpoint written: %s (%d records, %d bytes)", path, count, size)
    return CheckpointInfo(lsn, path, count, size, tuple(deleted))


class _Reserve:
    """The space reserve (``reserve.py``) as one checkpoint uses it: released at most
    once, when a step fails for lack of space."""

    def __init__(self, data_dir: str | os.PathLike[str], fs: FileSystem) -> None:
        self._data_dir = data_dir
        self._fs = fs
        self._used = False

    def freed_for(self, exc: OSError) -> bool:
        """After ``exc``: True if it means the disk is full and releasing the reserve
        just made room, so that the failed step is worth one more try."""
        if self._used or not is_disk_full(exc):
            return False
        self._used = True
        try:
            return release_reserve(self._data_dir, self._fs)
        except OSError as err:
            logger.warning("could not release the space reserve: %s", err)
            return False


def _write(file: WritableFile, data: bytes, size: int, reserve: _Reserve) -> int:
    """Append ``data`` at ``size`` (the bytes written so far); return the new size. A
    write that fails for lack of space is redone once the reserve made room, over
    whatever part of it was written."""
    try:
        faults.hit("checkpoint.write_error")
        faults.hit("checkpoint.write_enospc")
        file.write(data)
    except OSError as exc:
        if not reserve.freed_for(exc):
            raise
        file.truncate(size)
        faults.hit("checkpoint.write_error")
        faults.hit("checkpoint.write_enospc")
        file.write(data)
    return size + len(data)


def _verify(fs: FileSystem, path: str, lsn: int) -> tuple[int, int]:
    """Check header, trailer and body CRC; return ``(body_bytes, record_count)``.

    Raises:
        CorruptCheckpoint: the file is incomplete or damaged.
    """
    size = fs.getsize(path)
    if size < HEADER_BYTES + TRAILER_BYTES:
        raise CorruptCheckpoint(path, f"only {size} bytes: incomplete")
    with fs.open_read(path) as file:
        header = file.read(HEADER_BYTES)
        magic, version, stored_lsn = _HEADER.unpack_from(header)
        (crc,) = _CRC.unpack_from(header, _HEADER.size)
        if magic != _MAGIC:
            raise CorruptCheckpoint(path, f"bad magic {magic!r}")
        if zlib.crc32(header[: _HEADER.size]) != crc:
            raise CorruptCheckpoint(path, "header crc mismatch")
        if version != _VERSION:
            raise CorruptCheckpoint(path, f"unsupported checkpoint format version {version}")
        if stored_lsn != lsn:
            raise CorruptCheckpoint(path, f"header says LSN {stored_lsn}, file name says {lsn}")
        file.seek(size - TRAILER_BYTES)
        trailer = file.read(TRAILER_BYTES)
        marker, count, body_crc = _TRAILER.unpack_from(trailer)
        (crc,) = _CRC.unpack_from(trailer, _TRAILER.size)
        if marker != _TRAILER_MARKER or zlib.crc32(trailer[: _TRAILER.size]) != crc:
            raise CorruptCheckpoint(path, "no valid trailer: the file was not completely written")
        body_bytes = size - HEADER_BYTES - TRAILER_BYTES
        file.seek(HEADER_BYTES)
        remaining = body_bytes
        actual = 0
        while remaining:
            chunk = file.read(min(_CHUNK_BYTES, remaining))
            if not chunk:
                raise CorruptCheckpoint(path, "file shrank while being read")
            actual = zlib.crc32(chunk, actual)
            remaining -= len(chunk)
        if actual != body_crc:
            raise CorruptCheckpoint(path, "body crc mismatch")
    return body_bytes, count


def _iter_records(
    fs: FileSystem, path: str, body_bytes: int, count: int, max_record_bytes: int
) -> Iterator[tuple[int, bytes]]:
    file = fs.open_read(path)
    try:
        file.seek(HEADER_BYTES)
        decoder = RecordDecoder(max_record_bytes=max_record_bytes, offset=HEADER_BYTES)
        remaining = body_bytes
        seen = 0
        while True:
            for record in decoder.iter_records():
                seen += 1
                yield record
            if decoder.problem is not None:
                raise CorruptCheckpoint(path, str(decoder.problem))
            if decoder.at_eof:
                break
            if remaining:
                chunk = file.read(min(_CHUNK_BYTES, remaining))
                if not chunk:
                    raise CorruptCheckpoint(path, "file shrank while being read")
                remaining -= len(chunk)
                decoder.feed(chunk)
            else:
                decoder.feed_eof()
        if seen != count:
            raise CorruptCheckpoint(path, f"trailer promises {count} records, found {seen}")
    finally:
        file.close()


def read_latest_checkpoint(
    data_dir: str | os.PathLike[str],
    *,
    fs: FileSystem | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> LoadedCheckpoint | None:
    """Return the newest whole checkpoint, or None if there is none.

    Removes leftover ``.tmp`` files first. If the newest checkpoint is unreadable and an
    older one exists, logs an error, renames the unreadable one to ``*.corrupt`` and uses
    the older one. The records iterator is lazy (one pass over the file) and raises
    ``CorruptCheckpoint`` if the file changes under it.

    Raises:
        CorruptCheckpoint: the newest checkpoint is unreadable and no older one is whole.
        OSError: from the file system.
    """
    fs = fs if fs is not None else OS_FILE_SYSTEM
    directory = _checkpoint_dir(data_dir)
    for name in fs.listdir(directory):
        if name.endswith(_TMP_SUFFIX):
            leftover = os.path.join(directory, name)
            logger.info("removing leftover temporary checkpoint %s", leftover)
            fs.remove(leftover)
    candidates = list(reversed(_list_checkpoints(fs, directory)))
    failures: list[CorruptCheckpoint] = []
    for lsn in candidates:
        path = os.path.join(directory, checkpoint_name(lsn))
        try:
            body_bytes, count = _verify(fs, path, lsn)
        except CorruptCheckpoint as exc:
            failures.append(exc)
            continue
        skipped = []
        for failure in failures:
            aside = failure.path + _CORRUPT_SUFFIX
            logger.error(
                "%s; falling back to the older checkpoint %s (the WAL must still hold every "
                "record after LSN %d, or recovery will report the gap); the unreadable file "
                "is kept as %s",
                failure,
                path,
                lsn,
                aside,
            )
            fs.rename(failure.path, aside)
            skipped.append(aside)
        return LoadedCheckpoint(
            lsn,
            _iter_records(fs, path, body_bytes, count, max_record_bytes),
            path,
            tuple(skipped),
        )
    if failures:
        first = failures[0]
        raise CorruptCheckpoint(first.path, f"{first.reason}; and no older checkpoint is readable")
    return None

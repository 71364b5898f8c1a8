"""WAL segment files: names and headers.

One job: the on-disk identity of a segment, shared by the writer (``wal_segments.py``) and
the readers (``recovery.py``, ``reader.py``).

A segment is ``<data_dir>/wal/<first LSN, 16 lowercase hex digits>.wal``, so a directory
listing sorted by name is log order (etcd's scheme). It starts with a 32-byte header::

    magic          8 bytes  b"ACKBUSWL"
    version        u32      2 (1: the previous format, still read)
    first_lsn      u64      LSN of the segment's first record (matches the file name)
    void_from_lsn  u64      0, or: records with LSN >= this in EARLIER segments were
                            never reported durable (a failed batch); recovery drops them
    crc32          u32      over the 28 bytes above

What follows the header depends on the version. Version 2: write groups (``group.py``),
one or more per write of the WAL, each holding the record frames (``framing.py``) of
LSNs first_lsn, first_lsn + 1, ... in order. Version 1 (written before groups existed):
the record frames themselves, one after the other. A data directory may hold both: the
WAL only writes version 2, and old segments are read until a checkpoint releases them.

``void_from_lsn`` is written only in the segment the WAL starts after an IO failure. It
makes the failure path safe even when truncating the failed segment back to its last good
offset did not work (the disk was failing, after all): whatever the failed batch left
behind is discarded on recovery instead of being replayed or mistaken for corruption.

A new segment is created as ``<name>.tmp``, header written and fsynced, renamed into
place and the directory fsynced, so a segment file never has a torn header.

The groups (or frames) may be followed by zero bytes up to the end of the file: space
the writer preallocated and had not used yet (a segment is cut back to its records when
retired or closed, so only a crash leaves such a tail). :func:`zero_filled` tells it from
damage. A zero-filled tail can hide no record the log needs: a lost record in a finished
segment shows as missing LSNs before the next one, and recovery reports those.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Final

from .errors import StorageError

__all__ = [
    "WAL_DIRNAME",
    "SEGMENT_SUFFIX",
    "TMP_SUFFIX",
    "DROPPED_SUFFIX",
    "MAX_LSN",
    "BadSegmentHeader",
    "SEGMENT_HEADER_BYTES",
    "SEGMENT_VERSION",
    "LEGACY_SEGMENT_VERSION",
    "SegmentHeader",
    "segment_name",
    "parse_segment_name",
    "encode_segment_header",
    "decode_segment_header",
    "zero_filled",
]

WAL_DIRNAME: Final = "wal"
SEGMENT_SUFFIX: Final = ".wal"
TMP_SUFFIX: Final = ".tmp"
DROPPED_SUFFIX: Final = ".dropped"
_MAGIC: Final = b"ACKBUSWL"
#: The format the WAL writes: write groups (``group.py``).
SEGMENT_VERSION: Final = 2
#: The format before write groups: bare record frames. Read, never written.
LEGACY_SEGMENT_VERSION: Final = 1
_VERSIONS: Final = frozenset({LEGACY_SEGMENT_VERSION, SEGMENT_VERSION})
_HEADER: Final = struct.Struct("<8sIQQ")
_CRC: Final = struct.Struct("<I")
SEGMENT_HEADER_BYTES: Final = _HEADER.size + _CRC.size
_NAME_RE: Final = re.compile(r"^([0-9a-f]{16})\.wal$")
MAX_LSN: Final = 2**64 - 1


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """The decoded header of a segment."""

    first_lsn: int
    void_from_lsn: int = 0
    version: int = SEGMENT_VERSION


def segment_name(first_lsn: int) -> str:
    """File name of the segment whose first record has LSN ``first_lsn``."""
    if not 1 <= first_lsn <= MAX_LSN:
        raise ValueError(f"LSN out of range: {first_lsn}")
    return f"{first_lsn:016x}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """First LSN encoded in a segment file name, or None if ``name`` is not a segment."""
    match = _NAME_RE.match(name)
    return int(match.group(1), 16) if match else None


def encode_segment_header(header: SegmentHeader) -> bytes:
    """The 32 header bytes of a segment."""
    body = _HEADER.pack(_MAGIC, header.version, header.first_lsn, header.void_from_lsn)
    return body + _CRC.pack(zlib.crc32(body))


class BadSegmentHeader(StorageError):
    """A segment header that cannot be decoded (the reason says why)."""


def decode_segment_header(data: bytes) -> SegmentHeader:
    """Decode a segment header.

    Raises:
        BadSegmentHeader: too short, wrong magic, unknown version, or CRC mismatch.
    """
    if len(data) < SEGMENT_HEADER_BYTES:
        raise BadSegmentHeader(
            f"segment header is {len(data)} bytes, expected {SEGMENT_HEADER_BYTES}"
        )
    magic, version, first_lsn, void_from = _HEADER.unpack_from(data)
    (crc,) = _CRC.unpack_from(data, _HEADER.size)
    if magic != _MAGIC:
        raise BadSegmentHeader(f"bad segment magic {magic!r}")
    if zlib.crc32(data[: _HEADER.size]) != crc:
        raise BadSegmentHeader("segment header crc mismatch")
    if version not in _VERSIONS:
        raise BadSegmentHeader(f"unsupported segment format version {version}")
    return SegmentHeader(first_lsn, void_from, version)


_ZERO_CHECK_BYTES: Final = 1 << 20
_ZEROS: Final = bytes(_ZERO_CHECK_BYTES)


def zero_filled(file: BinaryIO, offset: int) -> bool:
    """Whether ``file`` holds only zero bytes from ``offset`` to its end (an unused
    preallocated tail). Reads the tail in 1 MiB pieces; moves the file position."""
    file.seek(offset)
    while True:
        chunk = file.read(_ZERO_CHECK_BYTES)
        if not chunk:
            return True
        if chunk != _ZEROS[: len(chunk)]:
            return False

"""Record framing: bytes in, records out, and back. Pure: no IO, no clocks.

One job: turn ``(rtype, payload)`` records into self-checking frames and frames back into
records, telling a clean end of data from a torn or corrupt one.

Frame layout (little-endian), as in etcd's WAL::

    length  u32   1 + len(payload): the bytes that follow the 8-byte header
    crc32   u32   zlib.crc32 over the rtype byte followed by the payload
    rtype   u8    record type, 0..255 (its meaning belongs to the broker core)
    payload       length - 1 bytes

Rules:

* A length of 0 is never valid (every frame carries at least its type byte), so a header
  of zero bytes - a preallocated or never-written region - is recognised as "zeroed".
* The length is checked against ``max_record_bytes`` (default 128 MiB) before anything
  is read or allocated for the record, so a corrupt length cannot make the reader
  allocate gigabytes. The decoder only ever holds bytes it was actually fed.
* The decoder is sans-IO in the h11 manner: :meth:`RecordDecoder.feed` bytes, then ask
  :meth:`RecordDecoder.next_record` for a record, :data:`NEED_DATA`, or a
  :class:`FrameProblem` with its byte offset. Once it reports a problem it stays there:
  what follows a bad frame cannot be trusted to be aligned.
* :meth:`RecordDecoder.iter_records` is the fast path recovery uses: it avoids per-record
  objects other than the ``(rtype, payload)`` tuple and the payload bytes themselves.
"""

from __future__ import annotations

import enum
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar, Final

from .errors import RecordTooLarge, StorageError

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "FRAME_HEADER_BYTES",
    "FRAME_OVERHEAD_BYTES",
    "NEED_DATA",
    "NeedData",
    "ProblemKind",
    "FrameProblem",
    "RecordDecoder",
    "encode_record",
    "encode_records",
    "find_valid_frame",
    "ScanGaveUp",
    "DEFAULT_SCAN_BUDGET_BYTES",
]

#: Default upper bound for ``1 + len(payload)``. Same order as etcd's per-entry guard; a
#: broker message is far smaller, so anything above this is a corrupt length field.
DEFAULT_MAX_RECORD_BYTES: Final = 128 * 1024 * 1024

_HEADER: Final = struct.Struct("<II")
#: Bytes before the type byte: length u32 + crc32 u32.
FRAME_HEADER_BYTES: Final = _HEADER.size
#: Bytes a frame adds to its payload: header + type byte.
FRAME_OVERHEAD_BYTES: Final = FRAME_HEADER_BYTES + 1
# header and type byte in one pack (what a frame puts before its payload)
_HEADER_AND_TYPE: Final = struct.Struct("<IIB")

# crc32 of the single type byte, used as the starting value for the payload's crc32:
# zlib.crc32(payload, _RTYPE_CRC[t]) == zlib.crc32(bytes([t]) + payload) without a copy.
_RTYPE_BYTE: Final = tuple(bytes((t,)) for t in range(256))
_RTYPE_CRC: Final = tuple(zlib.crc32(b) for b in _RTYPE_BYTE)
_ZERO_HEADER: Final = bytes(FRAME_HEADER_BYTES)


def _check_rtype(rtype: int) -> None:
    if not 0 <= rtype <= 255:
        raise ValueError(f"record type must be in 0..255, got {rtype!r}")


def encode_record(
    rtype: int, payload: bytes, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> bytes:
    """Frame one record.

    Raises:
        ValueError: ``rtype`` is not in 0..255.
        RecordTooLarge: ``1 + len(payload)`` exceeds ``max_record_bytes``.
    """
    _check_rtype(rtype)
    length = len(payload) + 1
    if length > max_record_bytes:
        raise RecordTooLarge(length, max_record_bytes)
    header = _HEADER.pack(length, zlib.crc32(payload, _RTYPE_CRC[rtype]))
    return b"".join((header, _RTYPE_BYTE[rtype], payload))


def encode_records(
    records: Iterable[tuple[int, bytes]], *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> tuple[bytes, int]:
    """Frame many records into one buffer (one allocation for the whole batch).

    Returns ``(frames, count)``. Every record is checked before anything is returned, so
    a bad record leaves nothing half-encoded.

    Raises:
        ValueError: a record type is not in 0..255.
        RecordTooLarge: a record exceeds ``max_record_bytes``.
    """
    parts: list[bytes] = []
    append = parts.append
    pack = _HEADER_AND_TYPE.pack
    crc32 = zlib.crc32
    count = 0
    for rtype, payload in records:
        if not 0 <= rtype <= 255:
            _check_rtype(rtype)
        length = len(payload) + 1
        if length > max_record_bytes:
            raise RecordTooLarge(length, max_record_bytes)
        append(pack(length, crc32(payload, _RTYPE_CRC[rtype]), rtype))
        append(payload)
        count += 1
    return b"".join(parts), count


class NeedData:
    """Type of :data:`NEED_DATA`: the decoder needs more bytes before it can answer."""

    _instance: ClassVar[NeedData | None] = None

    def __new__(cls) -> NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Answer of :meth:`RecordDecoder.next_record` when it needs more bytes.
NEED_DATA: Final = NeedData()


class ProblemKind(enum.Enum):
    """Why a frame could not be decoded."""

    #: Input ended inside a frame (header or body incomplete).
    SHORT = "short"
    #: The header is all zero bytes (never-written or preallocated space).
    ZEROED = "zeroed"
    #: Length field of 0 in a header that is not all zeros.
    BAD_LENGTH = "bad-length"
    #: Length field larger than the maximum record size.
    TOO_LARGE = "too-large"
    #: The frame is complete but its CRC does not match.
    CRC_MISMATCH = "crc-mismatch"
    #: A write group (``group.py``) whose header or record count does not fit.
    BAD_GROUP = "bad-group"


@dataclass(frozen=True, slots=True)
class FrameProblem:
    """A frame that cannot be decoded, at ``offset`` (absolute, from the decoder's start)."""

    offset: int
    kind: ProblemKind
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.value} frame at offset {self.offset}: {self.detail}"


Record = tuple[int, bytes]


class RecordDecoder:
    """Incremental frame decoder (sans-IO).

    Feed it bytes in any split; ask for records. Offsets it reports are absolute: the
    ``offset`` given at construction plus bytes consumed, so a caller that starts after a
    file header gets file offsets.

    Do not call :meth:`feed` while an :meth:`iter_records` generator is suspended
    mid-iteration; it raises ``RuntimeError`` if you do.
    """

    __slots__ = (
        "_buf",
        "_pos",
        "_base",
        "_pending",
        "_pending_bytes",
        "_eof",
        "_problem",
        "_max",
        "_iterating",
    )

    def __init__(
        self, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, offset: int = 0
    ) -> None:
        if max_record_bytes < 1:
            raise ValueError("max_record_bytes must be at least 1")
        # Undecoded input lives in an immutable bytes object: slicing a payload out of
        # it is the one copy a record costs, and no memoryview export ever pins it.
        self._buf = b""
        self._pos = 0
        self._base = offset  # absolute offset of self._buf[0]
        self._pending: list[bytes] = []  # fed, not yet joined into _buf
        self._pending_bytes = 0
        self._eof = False
        self._problem: FrameProblem | None = None
        self._max = max_record_bytes
        self._iterating = False

    @property
    def offset(self) -> int:
        """Absolute offset just past the last record decoded: where a truncation would cut."""
        return self._base + self._pos

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet decoded."""
        return len(self._buf) - self._pos + self._pending_bytes

    @property
    def problem(self) -> FrameProblem | None:
        """The problem that stopped decoding, if any."""
        return self._problem

    @property
    def at_eof(self) -> bool:
        """True once :meth:`feed_eof` was called."""
        return self._eof

    def feed(self, data: bytes) -> None:
        """Add bytes to decode.

        Raises:
            RuntimeError: after :meth:`feed_eof`, or while :meth:`iter_records` is suspended.
        """
        if self._eof:
            raise RuntimeError("feed() after feed_eof()")
        if self._iterating:
            raise RuntimeError("feed() while an iter_records() generator is running")
        if data:
            self._pending.append(bytes(data))
            self._pending_bytes += len(data)

    def _consolidate(self) -> None:
        """Move pending chunks into the decode buffer once they can complete a frame.

        Joining lazily keeps assembling a large record linear: a 100 MiB record fed in
        1 MiB pieces is copied once, not once per piece.
        """
        if not self._pending:
            return
        avail = len(self._buf) - self._pos
        if not self._eof and avail >= FRAME_HEADER_BYTES:
            length = _HEADER.unpack_from(self._buf, self._pos)[0]
            if 0 < length <= self._max and avail + self._pending_bytes < (
                FRAME_HEADER_BYTES + length
            ):
                return
        # Drop consumed bytes; copies at most one partial frame plus the new data.
        self._base += self._pos
        if avail:
            self._pending.insert(0, self._buf[self._pos :])
        self._buf = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pos = 0
        self._pending = []
        self._pending_bytes = 0

    def feed_eof(self) -> None:
        """Declare the input complete: leftover partial bytes become a SHORT/ZEROED problem."""
        self._eof = True

    def next_record(self) -> Record | NeedData | FrameProblem:
        """Decode one record: ``(rtype, payload)``, :data:`NEED_DATA`, or the problem."""
        if self._problem is not None:
            return self._problem
        self._consolidate()
        buf = self._buf
        pos = self._pos
        n = len(buf)
        if n - pos >= FRAME_HEADER_BYTES:
            length, crc = _HEADER.unpack_from(buf, pos)
            if 0 < length <= self._max:
                end = pos + FRAME_HEADER_BYTES + length
                if end <= n:
                    rtype = buf[pos + FRAME_HEADER_BYTES]
                    payload = buf[pos + FRAME_OVERHEAD_BYTES : end]
                    if zlib.crc32(payload, _RTYPE_CRC[rtype]) == crc:
                        self._pos = end
                        return rtype, payload
        return self._stop_or_need_data()

    def iter_records(self) -> Iterator[Record]:
        """Yield every complete, valid record currently buffered, then stop.

        After it stops, :attr:`problem` tells whether it hit a bad frame; otherwise it
        needs more data (or, after :meth:`feed_eof`, the input ended cleanly).
        """
        if self._problem is not None:
            return
        self._consolidate()
        unpack = _HEADER.unpack_from
        crc32 = zlib.crc32
        tbl = _RTYPE_CRC
        maxlen = self._max
        hdr = FRAME_HEADER_BYTES
        ovh = FRAME_OVERHEAD_BYTES
        buf = self._buf
        n = len(buf)
        pos = self._pos
        self._iterating = True
        try:
            while n - pos >= hdr:
                length, crc = unpack(buf, pos)
                if length == 0 or length > maxlen:
                    break
                end = pos + hdr + length
                if end > n:
                    break
                rtype = buf[pos + hdr]
                payload = buf[pos + ovh : end]
                if crc32(payload, tbl[rtype]) != crc:
                    break
                pos = end
                self._pos = end
                yield rtype, payload
        finally:
            self._iterating = False
        self._stop_or_need_data()

    def _stop_or_need_data(self) -> NeedData | FrameProblem:
        """Classify why the frame at the current position cannot be returned yet."""
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        offset = self._base + pos
        if avail >= FRAME_HEADER_BYTES:
            length, crc = _HEADER.unpack_from(buf, pos)
            if length == 0:
                if buf[pos : pos + FRAME_HEADER_BYTES] == _ZERO_HEADER:
                    return self._fail(offset, ProblemKind.ZEROED, "zeroed frame header")
                return self._fail(offset, ProblemKind.BAD_LENGTH, "frame length 0")
            if length > self._max:
                return self._fail(
                    offset,
                    ProblemKind.TOO_LARGE,
                    f"frame length {length} exceeds the maximum record size {self._max}",
                )
            end = pos + FRAME_HEADER_BYTES + length
            if end <= len(buf):
                rtype = buf[pos + FRAME_HEADER_BYTES]
                actual = zlib.crc32(buf[pos + FRAME_OVERHEAD_BYTES : end], _RTYPE_CRC[rtype])
                if actual != crc:
                    return self._fail(
                        offset,
                        ProblemKind.CRC_MISMATCH,
                        f"crc32 {actual:#010x} != stored {crc:#010x} (length {length})",
                    )
                # A valid frame: the caller simply has not asked for it yet.
                return NEED_DATA  # pragma: no cover - only reached through misuse
            if self._eof:
                return self._fail(
                    offset,
                    ProblemKind.SHORT,
                    f"frame of length {length} needs {FRAME_HEADER_BYTES + length} bytes, "
                    f"only {avail} remain",
                )
            return NEED_DATA
        if not self._eof:
            return NEED_DATA
        if avail == 0:
            return NEED_DATA  # clean end of input
        if buf[pos:].count(0) == avail:
            return self._fail(offset, ProblemKind.ZEROED, f"{avail} trailing zero bytes")
        return self._fail(
            offset, ProblemKind.SHORT, f"{avail} bytes left, less than a frame header"
        )

    def _fail(self, offset: int, kind: ProblemKind, detail: str) -> FrameProblem:
        self._problem = FrameProblem(offset, kind, detail)
        return self._problem


def _candidate_pattern(bound: int) -> re.Pattern[bytes]:
    """Positions where a u32 LE length in 1..bound can start.

    The regex engine finds them at C speed; only candidates reach Python. ``bound``
    is tightened to the data actually present, so a large region of small binary values
    still yields few candidates.
    """
    wide = bound >= 1 << 24
    top = min(bound >> 24, 255) if wide else bound >> 16
    pattern = _PATTERNS.get((wide, top))
    if pattern is not None:
        return pattern
    if wide:
        length = b"[\\x00-\\xff]{3}[\\x00-" + b"\\x%02x" % top + b"]"
    else:
        length = b"[\\x00-\\xff]{2}[\\x00-" + b"\\x%02x" % top + b"]\\x00"
    pattern = re.compile(b"(?=(?!\\x00\\x00\\x00\\x00)" + length + b")", re.DOTALL)
    _PATTERNS[(wide, top)] = pattern
    return pattern


_PATTERNS: dict[tuple[bool, int], re.Pattern[bytes]] = {}

#: Default bound on the bytes :func:`find_valid_frame` checksums before giving up.
DEFAULT_SCAN_BUDGET_BYTES: Final = 256 * 1024 * 1024


class ScanGaveUp(StorageError):
    """:func:`find_valid_frame` spent its budget without an answer (pathological data)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        super().__init__(f"frame scan gave up at offset {offset}: checksum budget spent")


def _could_follow_a_frame(data: bytes, pos: int, max_record_bytes: int) -> bool:
    """Whether what is at ``pos`` could come after a frame: the end of the data, a torn
    bit of header, zeros, or a plausible next header."""
    if len(data) - pos < FRAME_HEADER_BYTES:
        return True
    length: int = _HEADER.unpack_from(data, pos)[0]
    if length == 0:
        return data[pos : pos + FRAME_HEADER_BYTES] == _ZERO_HEADER
    return length <= max_record_bytes


def find_valid_frame(
    data: bytes,
    start: int = 0,
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    budget_bytes: int = DEFAULT_SCAN_BUDGET_BYTES,
) -> int | None:
    """Return the first offset >= ``start`` in ``data`` where a complete, CRC-valid frame
    begins that is followed by something a frame can be followed by (the end of the
    data, a plausible header, zeros), or None.

    Recovery uses it to tell a torn tail (nothing valid after the bad frame) from
    corruption (valid frames follow). Checking what follows a candidate before its CRC
    keeps the scan fast on large binary tails. A payload that itself contains a
    well-formed frame can produce a false "valid frame follows"; that errs toward
    reporting corruption, never toward silently dropping good records.

    Raises:
        ScanGaveUp: more than ``budget_bytes`` were checksummed without an answer, which
            takes a large region of adversarial binary data; callers treat that as "a
            valid frame may follow" (the safe side).
    """
    n = len(data)
    last_start = n - FRAME_OVERHEAD_BYTES
    if start > last_start or data.count(0, start) == n - start:
        return None  # nothing, or only zeros (preallocated / never written)
    bound = min(max_record_bytes, n - start - FRAME_HEADER_BYTES)
    unpack = _HEADER.unpack_from
    with memoryview(data) as view:
        # No endpos: it would hide the bytes the lookahead needs.
        for match in _candidate_pattern(bound).finditer(data, start):
            pos = match.start()
            if pos > last_start:
                break
            length, crc = unpack(data, pos)
            end = pos + FRAME_HEADER_BYTES + length
            if end > n or not _could_follow_a_frame(data, end, max_record_bytes):
                continue
            budget_bytes -= length
            if budget_bytes < 0:
                raise ScanGaveUp(pos)
            rtype = data[pos + FRAME_HEADER_BYTES]
            if zlib.crc32(view[pos + FRAME_OVERHEAD_BYTES : end], _RTYPE_CRC[rtype]) == crc:
                return pos
    return None

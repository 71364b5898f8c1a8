"""Write groups: how a batch of records is laid down in a segment, and read back.

One job: frame each write of the WAL (a batch of record frames, ``framing.py``) as one
self-describing *group*, decode groups back, and find the evidence recovery needs to tell
a torn tail from corruption. Pure: no IO, no clocks.

Group layout (little-endian), a 32-byte header followed by the batch's record frames::

    length      u32  bytes after the first 8 (the rest of the header and the frames),
                     counted as a record frame counts its length: a tool that walks
                     frames skips a whole group as one frame
    magic       4    b"AKGR"
    count       u32  records in the group, at least 1
    first_lsn   u64  LSN of its first record (the next ones follow without gaps)
    synced_lsn  u64  every record of the log with an LSN up to this one had been
                     fsynced before the group was written
    crc32       u32  zlib.crc32 of the 28 header bytes before it

The records keep their own frames and CRCs, so that one record can be read back by
its offset (``reader.py``); a group is valid when its header checks out and its frames
exactly fill its length, each with a valid CRC, ``count`` of them. A group is all or
nothing: recovery never keeps part of one.

Why ``synced_lsn``: a power cut may persist any part of what was written after the
last fsync (the disk writes sectors in any order), so a damaged group followed by valid
ones is what such a cut leaves as well as what corruption leaves. The difference is
whether the damaged bytes had been fsynced. A group written after an fsync that covered
LSN ``f`` says so (``synced_lsn >= f``); so a damaged group whose first LSN is ``f``
is corruption if a later group in the same file says ``synced_lsn >= f`` (an fsync of
the file covered it, and the bytes changed since), and a torn write otherwise (no fsync
covered it, so nothing from it on was acknowledged under ``fsync=always``).
:func:`find_sync_evidence` finds that evidence.

A batch larger than :data:`GROUP_SPLIT_BYTES` is written as several groups (one write):
it keeps the memory recovery needs for one group bounded.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

from .framing import (
    DEFAULT_MAX_RECORD_BYTES,
    FRAME_HEADER_BYTES,
    FRAME_OVERHEAD_BYTES,
    NEED_DATA,
    FrameProblem,
    NeedData,
    ProblemKind,
    ScanGaveUp,
)

__all__ = [
    "GROUP_HEADER_BYTES",
    "GROUP_SPLIT_BYTES",
    "Group",
    "GroupHeader",
    "GroupDecoder",
    "encode_group_header",
    "decode_group_header",
    "group_spans",
    "find_sync_evidence",
    "SyncEvidence",
    "count_group_records",
    "DEFAULT_SCAN_CANDIDATES",
]

GROUP_MAGIC: Final = b"AKGR"
_HEADER: Final = struct.Struct("<I4sIQQ")
_CRC: Final = struct.Struct("<I")
_WHOLE_HEADER: Final = struct.Struct("<I4sIQQI")
_FRAME: Final = struct.Struct("<II")
#: Bytes of a group header.
GROUP_HEADER_BYTES: Final = _HEADER.size + _CRC.size
# the length field counts from here (as a frame's does)
_LENGTH_FROM: Final = FRAME_HEADER_BYTES
_MIN_LENGTH: Final = GROUP_HEADER_BYTES - _LENGTH_FROM + FRAME_OVERHEAD_BYTES
_MAGIC_AT: Final = 4  # offset of the magic in the header
#: The writer starts a new group once a group holds this many bytes of frames (a batch
#: is then several groups, written at once); one record larger than this gets a group
#: of its own.
GROUP_SPLIT_BYTES: Final = 16 * 1024 * 1024
#: Default bound on the candidate headers :func:`max_synced_after` checks.
DEFAULT_SCAN_CANDIDATES: Final = 1 << 20

_RTYPE_CRC: Final = tuple(zlib.crc32(bytes((t,))) for t in range(256))


class GroupHeader(NamedTuple):
    """A decoded group header (its CRC checked)."""

    length: int
    record_count: int
    first_lsn: int
    synced_lsn: int

    @property
    def size(self) -> int:
        """Bytes of the whole group, header included."""
        return _LENGTH_FROM + self.length


#: A valid group as :meth:`GroupDecoder.iter_groups` yields it:
#: ``(first_lsn, synced_lsn, [(rtype, payload), ...])`` (a plain tuple: recovery makes
#: one per write of the log).
Group = tuple[int, int, list[tuple[int, bytes]]]


def max_group_length(max_record_bytes: int) -> int:
    """The largest length field a reader accepts (bounds what it buffers for a group)."""
    return GROUP_HEADER_BYTES - _LENGTH_FROM + max(
        GROUP_SPLIT_BYTES, max_record_bytes + FRAME_OVERHEAD_BYTES
    )


def encode_group_header(first_lsn: int, count: int, synced_lsn: int, frame_bytes: int) -> bytes:
    """The header of a group of ``count`` records whose frames take ``frame_bytes``."""
    body = _HEADER.pack(
        GROUP_HEADER_BYTES - _LENGTH_FROM + frame_bytes, GROUP_MAGIC, count, first_lsn, synced_lsn
    )
    return body + _CRC.pack(zlib.crc32(body))


def decode_group_header(data: bytes, pos: int = 0) -> GroupHeader | None:
    """The group header at ``pos`` if one is there (magic, length range and CRC check
    out), else None. Does not look at the frames."""
    if len(data) - pos < GROUP_HEADER_BYTES:
        return None
    length, magic, count, first_lsn, synced_lsn = _HEADER.unpack_from(data, pos)
    if magic != GROUP_MAGIC or length < _MIN_LENGTH or count < 1:
        return None
    if zlib.crc32(data[pos : pos + _HEADER.size]) != _CRC.unpack_from(data, pos + _HEADER.size)[0]:
        return None
    return GroupHeader(length, count, first_lsn, synced_lsn)


def group_spans(
    frame_sizes: Sequence[int], keep_together: Sequence[tuple[int, int]] = ()
) -> list[tuple[int, int, int]]:
    """Split a batch into groups: ``(first record index, end index, frame bytes)`` each,
    at most :data:`GROUP_SPLIT_BYTES` of frames a group unless one record is larger,
    or a ``keep_together`` range of record indexes (``[start, end)``: a transaction,
    all or nothing) would be cut: such a range is never split."""
    inside: set[int] = set()
    for lo, hi in keep_together:
        inside.update(range(lo + 1, hi))  # no group may start within a range
    spans: list[tuple[int, int, int]] = []
    start = 0
    nbytes = 0
    for index, size in enumerate(frame_sizes):
        if nbytes and nbytes + size > GROUP_SPLIT_BYTES and index not in inside:
            spans.append((start, index, nbytes))
            start, nbytes = index, 0
        nbytes += size
    if start < len(frame_sizes):
        spans.append((start, len(frame_sizes), nbytes))
    return spans


class GroupDecoder:
    """Incremental group decoder (sans-IO), the group counterpart of ``RecordDecoder``.

    Feed it the bytes of a segment after its header; :meth:`iter_groups` yields each
    valid group in order and stops at the end of the data or at the first group that
    does not check out (then :attr:`problem` says what and where: always the offset
    where that group starts, since a group is kept whole or not at all). Offsets are
    absolute (``offset`` at construction plus bytes consumed). If ``offsets`` is given,
    the file offset of every record of every group yielded is appended to it.
    """

    __slots__ = (
        "_buf",
        "_pos",
        "_base",
        "_pending",
        "_pending_bytes",
        "_eof",
        "_problem",
        "_lsn",
        "_max_record",
        "_max_length",
        "_offsets",
    )

    def __init__(
        self,
        *,
        first_lsn: int,
        offset: int,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        offsets: array[int] | None = None,
    ) -> None:
        self._buf = b""
        self._pos = 0
        self._base = offset
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._eof = False
        self._problem: FrameProblem | None = None
        self._lsn = first_lsn
        self._max_record = max_record_bytes
        self._max_length = max_group_length(max_record_bytes)
        self._offsets = offsets if offsets is not None else array("Q")

    @property
    def offset(self) -> int:
        """Absolute offset just past the last group decoded."""
        return self._base + self._pos

    @property
    def next_lsn(self) -> int:
        """The LSN the next group must start with."""
        return self._lsn

    @property
    def problem(self) -> FrameProblem | None:
        """The problem that stopped decoding, if any."""
        return self._problem

    def feed(self, data: bytes) -> None:
        """Add bytes to decode.

        Raises:
            RuntimeError: after :meth:`feed_eof`.
        """
        if self._eof:
            raise RuntimeError("feed() after feed_eof()")
        if data:
            self._pending.append(bytes(data))
            self._pending_bytes += len(data)

    def feed_eof(self) -> None:
        """Declare the input complete: leftover bytes become a problem (or zeros)."""
        self._eof = True

    def _consolidate(self) -> None:
        """Join pending chunks into the buffer once they can complete a group."""
        if not self._pending:
            return
        avail = len(self._buf) - self._pos
        if not self._eof and avail >= _LENGTH_FROM:
            length = _FRAME.unpack_from(self._buf, self._pos)[0]
            if _MIN_LENGTH <= length <= self._max_length and (
                avail + self._pending_bytes < _LENGTH_FROM + length
            ):
                return
        self._base += self._pos
        if avail:
            self._pending.insert(0, self._buf[self._pos :])
        self._buf = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pos = 0
        self._pending = []
        self._pending_bytes = 0

    def iter_groups(self) -> Iterator[Group]:
        """Yield every complete, valid group buffered, then stop (see the class doc)."""
        if self._problem is not None:
            return
        self._consolidate()
        buf = self._buf
        n = len(buf)
        pos = self._pos
        base = self._base
        unpack_header = _WHOLE_HEADER.unpack_from
        unpack_frame = _FRAME.unpack_from
        crc32 = zlib.crc32
        tbl = _RTYPE_CRC
        max_length = self._max_length
        max_record = self._max_record
        offsets = self._offsets
        add_offset = offsets.append
        header_bytes = GROUP_HEADER_BYTES
        crc_at = _HEADER.size
        fhdr = FRAME_HEADER_BYTES
        fovh = FRAME_OVERHEAD_BYTES
        lsn = self._lsn
        while n - pos >= header_bytes:
            length, magic, count, first_lsn, synced_lsn, crc = unpack_header(buf, pos)
            end = pos + _LENGTH_FROM + length
            if (
                magic != GROUP_MAGIC
                or first_lsn != lsn
                or not _MIN_LENGTH <= length <= max_length
                or end > n
                or crc32(buf[pos : pos + crc_at]) != crc
            ):
                break
            records: list[tuple[int, bytes]] = []
            append = records.append
            marker = len(offsets)
            rpos = pos + header_bytes
            while rpos < end:
                if end - rpos < fovh:
                    break
                rlen, rcrc = unpack_frame(buf, rpos)
                rend = rpos + fhdr + rlen
                if rlen == 0 or rlen > max_record or rend > end:
                    break
                rtype = buf[rpos + fhdr]
                payload = buf[rpos + fovh : rend]
                if crc32(payload, tbl[rtype]) != rcrc:
                    break
                append((rtype, payload))
                add_offset(base + rpos)
                rpos = rend
            if rpos != end or len(records) != count:
                del offsets[marker:]
                break
            pos = end
            lsn = first_lsn + count
            self._pos = end
            self._lsn = lsn
            yield first_lsn, synced_lsn, records
        self._stop_or_need_data()

    def _stop_or_need_data(self) -> NeedData | FrameProblem:
        """Classify why the group at the current position cannot be returned yet."""
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        offset = self._base + pos
        if avail < _LENGTH_FROM or (avail < GROUP_HEADER_BYTES and not self._eof):
            if not self._eof or avail == 0:
                return NEED_DATA
            if buf.count(0, pos) == avail:
                return self._fail(offset, ProblemKind.ZEROED, f"{avail} trailing zero bytes")
            return self._fail(offset, ProblemKind.SHORT, f"{avail} bytes left, less than a group header")
        length = _FRAME.unpack_from(buf, pos)[0]
        if length == 0:
            head = buf[pos : pos + GROUP_HEADER_BYTES]
            if head.count(0) == len(head):
                return self._fail(offset, ProblemKind.ZEROED, "zeroed group header")
            return self._fail(offset, ProblemKind.BAD_LENGTH, "group length 0")
        if length > self._max_length:
            return self._fail(
                offset,
                ProblemKind.TOO_LARGE,
                f"group length {length} exceeds the maximum group size {self._max_length}",
            )
        if length < _MIN_LENGTH:
            return self._fail(offset, ProblemKind.BAD_LENGTH, f"group length {length} is too small")
        if avail < GROUP_HEADER_BYTES:
            return self._fail(
                offset, ProblemKind.SHORT, f"{avail} bytes left, less than a group header"
            )
        header = decode_group_header(buf, pos)
        if header is None:
            magic = buf[pos + _MAGIC_AT : pos + _MAGIC_AT + 4]
            if magic != GROUP_MAGIC:
                return self._fail(offset, ProblemKind.BAD_GROUP, f"bad group magic {magic!r}")
            return self._fail(offset, ProblemKind.CRC_MISMATCH, "group header crc mismatch")
        if header.first_lsn != self._lsn:
            return self._fail(
                offset,
                ProblemKind.BAD_GROUP,
                f"group says its first LSN is {header.first_lsn}, expected {self._lsn}",
            )
        end = pos + header.size
        if end > len(buf):
            if not self._eof:
                return NEED_DATA
            return self._fail(
                offset,
                ProblemKind.SHORT,
                f"group of {header.size} bytes ({header.record_count} records), only {avail} remain",
            )
        return self._fail(offset, *self._frame_problem(pos, end, header.record_count))

    def _frame_problem(self, pos: int, end: int, count: int) -> tuple[ProblemKind, str]:
        """What is wrong inside the complete group ``buf[pos:end]`` whose header is valid."""
        buf = self._buf
        rpos = pos + GROUP_HEADER_BYTES
        seen = 0
        while rpos < end:
            where = f"record {seen + 1} of the group at offset {self._base + rpos}"
            if end - rpos < FRAME_OVERHEAD_BYTES:
                return ProblemKind.SHORT, f"{where}: {end - rpos} bytes, less than a frame"
            rlen, rcrc = _FRAME.unpack_from(buf, rpos)
            if rlen == 0:
                zero = buf[rpos : rpos + FRAME_HEADER_BYTES] == bytes(FRAME_HEADER_BYTES)
                return (ProblemKind.ZEROED if zero else ProblemKind.BAD_LENGTH), f"{where}: frame length 0"
            rend = rpos + FRAME_HEADER_BYTES + rlen
            if rlen > self._max_record or rend > end:
                return ProblemKind.BAD_LENGTH, f"{where}: frame length {rlen} overruns the group"
            rtype = buf[rpos + FRAME_HEADER_BYTES]
            actual = zlib.crc32(buf[rpos + FRAME_OVERHEAD_BYTES : rend], _RTYPE_CRC[rtype])
            if actual != rcrc:
                return ProblemKind.CRC_MISMATCH, f"{where}: crc32 {actual:#010x} != stored {rcrc:#010x}"
            seen += 1
            rpos = rend
        return ProblemKind.BAD_GROUP, f"group header promises {count} records, its frames hold {seen}"

    def _fail(self, offset: int, kind: ProblemKind, detail: str) -> FrameProblem:
        self._problem = FrameProblem(offset, kind, detail)
        return self._problem


class SyncEvidence(NamedTuple):
    """A group header found by :func:`find_sync_evidence`."""

    offset: int  # in the data scanned
    synced_lsn: int


def find_sync_evidence(
    data: bytes, start: int, lsn: int, *, budget: int = DEFAULT_SCAN_CANDIDATES
) -> SyncEvidence | None:
    """The first valid group header at or after ``start`` in ``data`` that says LSN
    ``lsn`` had been fsynced before it was written (``synced_lsn >= lsn``), or None.

    Only headers are checked (magic, length, CRC): a header that checks out was written
    by the WAL whatever happened to the frames after it, and its ``synced_lsn`` is
    evidence about what came before it. A payload that happens to contain a well-formed
    group header can only add such evidence, so it errs toward reporting corruption,
    never toward dropping records silently.

    Raises:
        ScanGaveUp: more than ``budget`` candidate headers (occurrences of the magic)
            were checked: a large region of adversarial data.
    """
    find = data.find
    hit = find(GROUP_MAGIC, start + _MAGIC_AT)
    while hit != -1:
        budget -= 1
        if budget < 0:
            raise ScanGaveUp(hit - _MAGIC_AT)
        pos = hit - _MAGIC_AT
        header = decode_group_header(data, pos)
        if header is not None and header.synced_lsn >= lsn:
            return SyncEvidence(pos, header.synced_lsn)
        hit = find(GROUP_MAGIC, hit + 1)
    return None


def count_group_records(data: bytes, *, budget: int = DEFAULT_SCAN_CANDIDATES) -> int:
    """How many records the valid group headers in ``data`` announce (what a repair or
    a torn tail throws away; a lower bound: a group whose header is damaged counts 0)."""
    count = 0
    hit = data.find(GROUP_MAGIC, _MAGIC_AT)
    while hit != -1 and budget > 0:
        budget -= 1
        header = decode_group_header(data, hit - _MAGIC_AT)
        if header is not None:
            count += header.record_count
        hit = data.find(GROUP_MAGIC, hit + 1)
    return count

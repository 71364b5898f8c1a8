"""Write groups (broker/storage/group.py): the layout, the decoder, large batches split
into several groups, and data directories written before groups existed."""

from __future__ import annotations

import random
import struct
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.storage import WriteAheadLog, recover
from broker.storage import group as group_module
from broker.storage import wal_commit as wal_module
from broker.storage.framing import NEED_DATA, ProblemKind, encode_records
from broker.storage.group import (
    GROUP_HEADER_BYTES,
    GroupDecoder,
    decode_group_header,
    encode_group_header,
    find_sync_evidence,
    group_spans,
)
from broker.storage.segment import (
    LEGACY_SEGMENT_VERSION,
    SEGMENT_VERSION,
    SegmentHeader,
    decode_segment_header,
    encode_segment_header,
    segment_name,
)

RecoverAll = Callable[..., Any]


def group(first_lsn: int, records: list[tuple[int, bytes]], synced_lsn: int = 0) -> bytes:
    frames, count = encode_records(records)
    return encode_group_header(first_lsn, count, synced_lsn, len(frames)) + frames


def decode_all(data: bytes, first_lsn: int = 1, *, pieces: int = 1) -> tuple[list[Any], GroupDecoder]:
    decoder = GroupDecoder(first_lsn=first_lsn, offset=0)
    out: list[Any] = []
    step = max(1, len(data) // pieces)
    for start in range(0, len(data), step):
        decoder.feed(data[start : start + step])
        out.extend(decoder.iter_groups())
    decoder.feed_eof()
    out.extend(decoder.iter_groups())
    return out, decoder


# --------------------------------------------------------------------------- layout


def test_the_header_layout_is_the_documented_one() -> None:
    frames, _ = encode_records([(5, b"abc"), (6, b"")])
    header = encode_group_header(10, 2, 7, len(frames))
    assert len(header) == GROUP_HEADER_BYTES == 32
    length, magic, count, first, synced, crc = struct.unpack("<I4sIQQI", header)
    assert (magic, count, first, synced) == (b"AKGR", 2, 10, 7)
    assert length == 24 + len(frames)  # counted after the first 8 bytes, as a frame's
    assert crc == zlib.crc32(header[:28])
    assert decode_group_header(header + frames) == (length, 2, 10, 7)


def test_a_header_that_does_not_check_out_is_not_a_header() -> None:
    good = group(1, [(1, b"x")])
    for offset in range(GROUP_HEADER_BYTES):
        damaged = bytearray(good)
        damaged[offset] ^= 0x01
        assert decode_group_header(bytes(damaged)) is None, offset


@pytest.mark.parametrize("pieces", [1, 3, 17, 1000])
def test_groups_decode_in_any_split(pieces: int) -> None:
    data = group(1, [(1, b"a" * 100), (2, b"b")]) + group(3, [(3, b"c" * 5000)], 2) + group(4, [(4, b"")], 3)
    groups, decoder = decode_all(data, pieces=pieces)
    assert groups == [
        (1, 0, [(1, b"a" * 100), (2, b"b")]),
        (3, 2, [(3, b"c" * 5000)]),
        (4, 3, [(4, b"")]),
    ]
    assert decoder.problem is None and decoder.offset == len(data) and decoder.next_lsn == 5


def test_record_offsets_are_appended_for_whole_groups_only() -> None:
    good = group(1, [(1, b"one"), (1, b"two")])
    bad = bytearray(group(3, [(1, b"three"), (1, b"four")]))
    bad[-1] ^= 0xFF  # the second record of the second group
    offsets = array("Q")
    decoder = GroupDecoder(first_lsn=1, offset=100, offsets=offsets)
    decoder.feed(good + bytes(bad))
    decoder.feed_eof()
    assert len(list(decoder.iter_groups())) == 1
    assert list(offsets) == [100 + 32, 100 + 32 + 12]
    problem = decoder.problem
    assert problem is not None
    assert (problem.offset, problem.kind) == (100 + len(good), ProblemKind.CRC_MISMATCH)
    assert "record 2 of the group" in problem.detail


@pytest.mark.parametrize(
    "mutate, kind",
    [
        (lambda g: g[: len(g) - 3], ProblemKind.SHORT),
        (lambda g: g[:20], ProblemKind.SHORT),
        (lambda g: bytes(32) + g[32:], ProblemKind.ZEROED),
        (lambda g: bytes(len(g)), ProblemKind.ZEROED),
        (lambda g: g[:4] + b"XXXX" + g[8:], ProblemKind.BAD_GROUP),
        (lambda g: g[:10] + bytes([g[10] ^ 1]) + g[11:], ProblemKind.CRC_MISMATCH),
        (lambda g: b"\xff\xff\xff\x7f" + g[4:], ProblemKind.TOO_LARGE),
        (lambda g: g[:-1] + bytes([g[-1] ^ 1]), ProblemKind.CRC_MISMATCH),
    ],
)
def test_problems_are_classified(mutate: Callable[[bytes], bytes], kind: ProblemKind) -> None:
    good = group(1, [(1, b"first")])
    data = good + mutate(group(2, [(1, b"second record")]))
    groups, decoder = decode_all(data)
    assert len(groups) == 1
    assert decoder.problem is not None
    assert (decoder.problem.offset, decoder.problem.kind) == (len(good), kind), decoder.problem


def test_a_group_with_the_wrong_first_lsn_is_damage() -> None:
    _, decoder = decode_all(group(1, [(1, b"x")]) + group(7, [(1, b"y")]))
    assert decoder.problem is not None and decoder.problem.kind is ProblemKind.BAD_GROUP
    assert "expected 2" in decoder.problem.detail


def test_a_header_promising_more_records_than_it_holds_is_damage() -> None:
    frames, _ = encode_records([(1, b"x")])
    data = encode_group_header(1, 2, 0, len(frames)) + frames
    _, decoder = decode_all(data)
    assert decoder.problem is not None and decoder.problem.kind is ProblemKind.BAD_GROUP


def test_the_decoder_waits_for_a_whole_group() -> None:
    data = group(1, [(1, b"z" * 1000)])
    decoder = GroupDecoder(first_lsn=1, offset=0)
    decoder.feed(data[:500])
    assert list(decoder.iter_groups()) == []
    assert decoder.problem is None and decoder._stop_or_need_data() is NEED_DATA
    decoder.feed(data[500:])
    assert len(list(decoder.iter_groups())) == 1


def test_sync_evidence_is_the_first_header_that_covers_the_lsn() -> None:
    data = b"junk" + group(5, [(1, b"a")], 3) + group(6, [(1, b"b")], 5) + group(7, [(1, b"c")], 6)
    evidence = find_sync_evidence(data, 0, 4)
    assert evidence is not None and evidence.synced_lsn == 5
    assert decode_group_header(data, evidence.offset) is not None
    assert find_sync_evidence(data, 0, 7) is None


# --------------------------------------------------------------------------- large batches


async def test_a_batch_larger_than_a_group_is_split_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recover_all: RecoverAll
) -> None:
    monkeypatch.setattr(group_module, "GROUP_SPLIT_BYTES", 200)
    monkeypatch.setattr(wal_module, "GROUP_SPLIT_BYTES", 200)
    rng = random.Random(3)
    records = [(n % 256, bytes([n % 251]) * rng.randint(0, 120)) for n in range(1, 60)]
    wal = WriteAheadLog(tmp_path)
    assert wal.append_nowait(records) == 59
    await wal.sync()
    # the writer's index spans the group headers between them
    assert wal.reader.read(list(range(1, 60))) == records
    await wal.aclose()
    segment = tmp_path / "wal" / segment_name(1)
    data = segment.read_bytes()
    headers = [pos for pos in range(len(data)) if decode_group_header(data, pos) is not None]
    assert len(headers) > 10
    assert all(
        decode_group_header(data, pos).length <= 200 + 24 + 9 + 120  # type: ignore[union-attr]
        for pos in headers
    )
    recovery, got = recover_all(tmp_path)
    assert [(t, p) for _, t, p in got] == records
    # the recovery's index too
    assert recovery.reader.read([1, 30, 59]) == [records[0], records[29], records[58]]
    recovery.reader.close()


# --------------------------------------------------------------------------- the previous format


def write_legacy_segment(data_dir: Path, first_lsn: int, count: int) -> Path:
    """A segment as ackbus wrote it before write groups: header (version 1) + frames."""
    (data_dir / "wal").mkdir(parents=True, exist_ok=True)
    path = data_dir / "wal" / segment_name(first_lsn)
    frames, _ = encode_records([(1, b"old-%d" % lsn) for lsn in range(first_lsn, first_lsn + count)])
    header = SegmentHeader(first_lsn, version=LEGACY_SEGMENT_VERSION)
    path.write_bytes(encode_segment_header(header) + frames)
    return path


async def test_a_data_directory_of_the_previous_format_is_read_and_continued(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    old_first = write_legacy_segment(tmp_path, 1, 5)
    old_second = write_legacy_segment(tmp_path, 6, 4)
    recovery, records = recover_all(tmp_path)
    assert [(lsn, p) for lsn, _, p in records] == [(n, b"old-%d" % n) for n in range(1, 10)]
    assert recovery.reader.read([2, 9]) == [(1, b"old-2"), (1, b"old-9")]
    wal = WriteAheadLog.open(recovery)
    wal.append_nowait([(2, b"new-10"), (2, b"new-11")])
    await wal.aclose()
    segments = sorted((tmp_path / "wal").glob("*.wal"))
    assert segments[:2] == [old_first, old_second]
    versions = [decode_segment_header(p.read_bytes()).version for p in segments]
    assert versions == [LEGACY_SEGMENT_VERSION, LEGACY_SEGMENT_VERSION, SEGMENT_VERSION]
    recovery, records = recover_all(tmp_path)
    assert [lsn for lsn, _, _ in records] == list(range(1, 12))
    assert recovery.reader.read([5, 11]) == [(1, b"old-5"), (2, b"new-11")]
    recovery.reader.close()


async def test_an_empty_segment_of_the_previous_format_is_made_again(tmp_path: Path, recover_all: RecoverAll) -> None:
    write_legacy_segment(tmp_path, 1, 2)
    empty = tmp_path / "wal" / segment_name(3)
    empty.write_bytes(encode_segment_header(SegmentHeader(3, version=LEGACY_SEGMENT_VERSION)))
    wal = WriteAheadLog(tmp_path, next_lsn=3)
    wal.append_nowait([(1, b"new")])
    await wal.aclose()
    assert decode_segment_header(empty.read_bytes()).version == SEGMENT_VERSION
    _, records = recover_all(tmp_path)
    assert [p for _, _, p in records] == [b"old-1", b"old-2", b"new"]


def test_an_unknown_segment_version_is_a_clear_error(tmp_path: Path) -> None:
    from broker.storage import CorruptLog

    path = write_legacy_segment(tmp_path, 1, 2)
    write_legacy_segment(tmp_path, 3, 2)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, 9)
    struct.pack_into("<I", data, 28, zlib.crc32(bytes(data[:28])))
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLog, match="unsupported segment format version 9"):
        list(recover(tmp_path).wal_records)


def test_a_batch_is_split_into_groups_but_never_inside_a_range_kept_together() -> None:
    mib = 1024 * 1024
    sizes = [4 * mib] * 10  # 40 MiB: groups of at most 16 MiB
    assert [(lo, hi) for lo, hi, _n in group_spans(sizes)] == [(0, 4), (4, 8), (8, 10)]
    # records 2..6 are one committed transaction: no group starts inside it
    spans = group_spans(sizes, keep_together=[(2, 7)])
    assert [(lo, hi) for lo, hi, _n in spans] == [(0, 7), (7, 10)]
    assert [n for _lo, _hi, n in spans] == [28 * mib, 12 * mib]

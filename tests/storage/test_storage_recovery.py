"""Recovery: torn tails are cut, corruption is reported, repair salvages a prefix."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.storage import CorruptLog, WriteAheadLog, recover, write_checkpoint
from broker.storage.framing import FRAME_OVERHEAD_BYTES, encode_record
from broker.storage.segment import (
    LEGACY_SEGMENT_VERSION,
    SEGMENT_HEADER_BYTES,
    SegmentHeader,
    encode_segment_header,
    segment_name,
)

RecoverAll = Callable[..., Any]


def payload_for(lsn: int) -> bytes:
    return b"payload-%d" % lsn


def write_segment(data_dir: Path, first_lsn: int, count: int, *, void_from: int = 0) -> Path:
    """Write a segment file by hand: header + records first_lsn .. first_lsn + count - 1,
    in the format before write groups (version 1, still read; write groups have tests of
    their own in test_storage_torn.py)."""
    directory = data_dir / "wal"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / segment_name(first_lsn)
    body = b"".join(
        encode_record(lsn % 256, payload_for(lsn)) for lsn in range(first_lsn, first_lsn + count)
    )
    header = SegmentHeader(first_lsn, void_from, version=LEGACY_SEGMENT_VERSION)
    path.write_bytes(encode_segment_header(header) + body)
    return path


def record_offsets(first_lsn: int, count: int) -> list[int]:
    """File offsets at which each record of a hand-written segment starts (+ the end)."""
    offsets = [SEGMENT_HEADER_BYTES]
    for lsn in range(first_lsn, first_lsn + count):
        offsets.append(offsets[-1] + FRAME_OVERHEAD_BYTES + len(payload_for(lsn)))
    return offsets


def lsns(records: list[tuple[int, int, bytes]]) -> list[int]:
    return [lsn for lsn, _, _ in records]


def check_payloads(records: list[tuple[int, int, bytes]]) -> None:
    for lsn, rtype, payload in records:
        assert (rtype, payload) == (lsn % 256, payload_for(lsn))


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- clean


def test_empty_data_directory(tmp_path: Path, recover_all: RecoverAll) -> None:
    recovery, records = recover_all(tmp_path / "fresh")
    assert records == []
    assert recovery.checkpoint is None
    assert (recovery.last_lsn, recovery.next_lsn) == (0, 1)


def test_records_come_back_in_order_with_their_lsns(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    write_segment(tmp_path, 1, 10)
    write_segment(tmp_path, 11, 5)
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == list(range(1, 16))
    check_payloads(records)
    report = recovery.report
    assert (report.segments_read, report.records_replayed, report.next_lsn) == (2, 15, 16)
    assert report.truncated == ()


def test_report_before_the_records_are_read_is_an_error(tmp_path: Path) -> None:
    from broker.storage import RecoveryNotFinished

    write_segment(tmp_path, 1, 3)
    recovery = recover(tmp_path)
    assert not recovery.finished
    with pytest.raises(RecoveryNotFinished):
        _ = recovery.next_lsn
    assert len(list(recovery.wal_records)) == 3
    assert recovery.next_lsn == 4


def test_leftover_temporary_files_are_removed(tmp_path: Path, recover_all: RecoverAll) -> None:
    write_segment(tmp_path, 1, 2)
    leftover = tmp_path / "wal" / (segment_name(3) + ".tmp")
    leftover.write_bytes(b"half a header")
    recovery, records = recover_all(tmp_path)
    assert not leftover.exists()
    assert str(leftover) in recovery.report.removed_files
    assert lsns(records) == [1, 2]


# --------------------------------------------------------------------------- torn tails


def test_a_torn_last_record_is_truncated_at_every_cut_point(
    tmp_path: Path, recover_all: RecoverAll, caplog: pytest.LogCaptureFixture
) -> None:
    template = tmp_path / "template"
    write_segment(template, 1, 4)
    path = write_segment(template, 5, 6)
    offsets = record_offsets(5, 6)
    last_start, end = offsets[-2], offsets[-1]
    assert path.stat().st_size == end
    for cut in range(last_start + 1, end):
        case = tmp_path / f"cut-{cut}"
        shutil.copytree(template, case)
        segment = case / "wal" / path.name
        with open(segment, "r+b") as file:
            file.truncate(cut)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ackbus.storage"):
            recovery, records = recover_all(case)
        assert lsns(records) == list(range(1, 10)), cut
        check_payloads(records)
        (tail,) = recovery.report.truncated
        assert (tail.path, tail.offset, tail.bytes_dropped) == (
            str(segment),
            last_start,
            cut - last_start,
        )
        assert tail.records_dropped == 1
        assert segment.stat().st_size == last_start
        assert "torn tail" in caplog.text and str(segment) in caplog.text
        assert recovery.next_lsn == 10
        # The truncation is final: a second recovery finds a clean log.
        recovery, records = recover_all(case)
        assert recovery.report.truncated == () and lsns(records) == list(range(1, 10))


def test_a_zero_filled_tail_is_unused_preallocated_space_and_is_cut_quietly(
    tmp_path: Path, recover_all: RecoverAll, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_segment(tmp_path, 1, 5)
    size = path.stat().st_size
    with open(path, "ab") as file:
        file.write(bytes(3 << 20))  # more than one 1 MiB piece of the zero check
    with caplog.at_level(logging.INFO, logger="ackbus.storage"):
        recovery, records = recover_all(tmp_path)
    assert lsns(records) == [1, 2, 3, 4, 5]
    assert recovery.report.truncated == ()  # not a torn tail: nothing was lost
    assert path.stat().st_size == size
    assert "preallocated" in caplog.text and "torn" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_torn_record_inside_preallocated_space_is_a_torn_tail(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    # A crash in the middle of writing record 6 into preallocated space: its header and
    # the start of its payload made it, the rest still reads as zeros.
    path = write_segment(tmp_path, 1, 5)
    size = path.stat().st_size
    frame = encode_record(6, b"z" * 2000)
    with open(path, "ab") as file:
        file.write(frame[:100] + bytes(1 << 20))
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == [1, 2, 3, 4, 5]
    (tail,) = recovery.report.truncated
    assert (tail.offset, tail.records_dropped) == (size, 1)
    assert path.stat().st_size == size


def test_a_zero_filled_tail_in_an_earlier_segment_is_not_corruption(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    # A retired segment whose cut did not reach the disk before a power loss.
    first = write_segment(tmp_path, 1, 5)
    size = first.stat().st_size
    with open(first, "ab") as file:
        file.write(bytes(8192))
    write_segment(tmp_path, 6, 3)
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == list(range(1, 9))
    check_payloads(records)
    assert first.stat().st_size == size


def test_zeros_hiding_records_of_an_earlier_segment_are_reported_as_missing_lsns(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    # The same zeros, but where records 4 and 5 were: the next segment starts at 6.
    first = write_segment(tmp_path, 1, 5)
    offsets = record_offsets(1, 5)
    data = first.read_bytes()
    first.write_bytes(data[: offsets[3]] + bytes(len(data) - offsets[3] + 4096))
    write_segment(tmp_path, 6, 3)
    with pytest.raises(CorruptLog, match="LSN 4..5 are missing"):
        recover_all(tmp_path)


def test_a_crc_failure_in_the_last_record_is_a_torn_tail(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    path = write_segment(tmp_path, 1, 5)
    offsets = record_offsets(1, 5)
    flip_byte(path, offsets[-1] - 1)
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == [1, 2, 3, 4]
    (tail,) = recovery.report.truncated
    assert tail.offset == offsets[-2]
    assert "crc" in tail.reason


# --------------------------------------------------------------------------- corruption


def test_damage_in_an_earlier_segment_is_corruption(tmp_path: Path) -> None:
    first = write_segment(tmp_path, 1, 10)
    write_segment(tmp_path, 11, 10)
    offsets = record_offsets(1, 10)
    flip_byte(first, offsets[4] + 12)  # inside record 5's payload
    recovery = recover(tmp_path)
    with pytest.raises(CorruptLog) as info:
        for _ in recovery.wal_records:
            pass
    error = info.value
    assert (error.path, error.offset) == (str(first), offsets[4])
    message = str(error)
    assert str(first) in message
    assert f"offset {offsets[4]}" in message
    assert "repair" in message
    assert not recovery.finished


def test_a_torn_end_of_an_earlier_segment_is_corruption_too(tmp_path: Path) -> None:
    first = write_segment(tmp_path, 1, 10)
    write_segment(tmp_path, 11, 10)
    with open(first, "r+b") as file:
        file.truncate(first.stat().st_size - 3)
    with pytest.raises(CorruptLog, match="not the last"):
        list(recover(tmp_path).wal_records)


def test_damage_followed_by_valid_records_in_the_last_segment_is_corruption(tmp_path: Path) -> None:
    path = write_segment(tmp_path, 1, 10)
    offsets = record_offsets(1, 10)
    flip_byte(path, offsets[3] + 2)  # record 4's length field
    with pytest.raises(CorruptLog, match="followed by a valid record") as info:
        list(recover(tmp_path).wal_records)
    assert info.value.offset == offsets[3]
    assert path.stat().st_size == offsets[-1]  # nothing was truncated


@pytest.fixture
def scan_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the 'anything valid after it?' scan give up, as on a huge binary tail."""
    from broker.storage import damage
    from broker.storage.framing import ScanGaveUp

    def give_up(data: bytes, start: int = 0, **options: object) -> int | None:
        raise ScanGaveUp(start)

    monkeypatch.setattr(damage, "find_valid_frame", give_up)


def test_an_undecidable_damaged_tail_is_reported(tmp_path: Path, scan_gives_up: None) -> None:
    path = write_segment(tmp_path, 1, 5)
    with open(path, "ab") as file:
        file.write(b"\xff\xff\xff\x7f not a length anyone could have written")
    with pytest.raises(CorruptLog, match="could not rule out"):
        list(recover(tmp_path).wal_records)


def test_an_undecidable_short_tail_falls_back_to_the_etcd_rule(
    tmp_path: Path, scan_gives_up: None, recover_all: RecoverAll, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_segment(tmp_path, 1, 5)
    size = path.stat().st_size
    with open(path, "ab") as file:
        file.write(encode_record(1, b"x" * 5000)[:3000])  # torn mid-write
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == [1, 2, 3, 4, 5]
    assert recovery.report.truncated[0].offset == size
    assert "could not rule out" in caplog.text


def test_an_undecidable_crc_failure_with_a_zeroed_sector_is_torn(
    tmp_path: Path, scan_gives_up: None, recover_all: RecoverAll
) -> None:
    path = write_segment(tmp_path, 1, 5)
    frame = bytearray(encode_record(1, bytes(range(256)) * 20))
    frame[2000:3100] = bytes(1100)  # a page that never reached the disk
    with open(path, "ab") as file:
        file.write(bytes(frame))
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == [1, 2, 3, 4, 5]
    assert len(recovery.report.truncated) == 1


def test_a_missing_segment_is_corruption(tmp_path: Path) -> None:
    write_segment(tmp_path, 1, 5)
    middle = write_segment(tmp_path, 6, 5)
    write_segment(tmp_path, 11, 5)
    middle.unlink()
    with pytest.raises(CorruptLog, match="LSN 6..10 are missing"):
        list(recover(tmp_path).wal_records)


def test_overlapping_segments_are_corruption(tmp_path: Path) -> None:
    write_segment(tmp_path, 1, 5)
    write_segment(tmp_path, 4, 5)
    with pytest.raises(CorruptLog, match="previous segment already holds records up to LSN 5"):
        list(recover(tmp_path).wal_records)


def test_a_gap_explained_by_a_void_marker_is_accepted(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    write_segment(tmp_path, 1, 5)
    write_segment(tmp_path, 9, 2, void_from=6)  # LSNs 6..8 were a failed batch
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == [1, 2, 3, 4, 5, 9, 10]
    assert recovery.next_lsn == 11


def test_records_behind_a_void_marker_are_dropped(tmp_path: Path, recover_all: RecoverAll) -> None:
    path = write_segment(tmp_path, 1, 8)  # 6..8 belong to a failed batch
    write_segment(tmp_path, 9, 2, void_from=6)
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == [1, 2, 3, 4, 5, 9, 10]
    (voided,) = recovery.report.voided
    assert (voided.first_lsn, voided.offset) == (6, record_offsets(1, 8)[5])
    assert path.stat().st_size == voided.offset


def test_segments_covered_by_the_checkpoint_are_not_read(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    first = write_segment(tmp_path, 1, 10)
    write_segment(tmp_path, 11, 10)
    first.write_bytes(b"garbage: never read")
    write_checkpoint(tmp_path, 15, [(1, b"state")])
    recovery, records = recover_all(tmp_path)
    assert recovery.checkpoint_lsn == 15
    assert lsns(records) == [16, 17, 18, 19, 20]
    assert recovery.report.segments_read == 1


def test_a_checkpoint_ahead_of_the_log_sets_the_next_lsn(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    write_segment(tmp_path, 1, 3)
    write_checkpoint(tmp_path, 10, [])
    recovery, records = recover_all(tmp_path)
    assert records == []
    assert recovery.next_lsn == 11


def test_last_segment_with_unreadable_header_and_no_records_is_removed(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    write_segment(tmp_path, 1, 3)
    broken = tmp_path / "wal" / segment_name(4)
    broken.write_bytes(b"\x00" * 20)
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == [1, 2, 3]
    assert not broken.exists()
    assert str(broken) in recovery.report.removed_files


def test_an_unreadable_header_before_the_end_is_corruption(tmp_path: Path) -> None:
    write_segment(tmp_path, 1, 3)
    middle = write_segment(tmp_path, 4, 3)
    write_segment(tmp_path, 7, 3)
    flip_byte(middle, 2)
    with pytest.raises(CorruptLog, match="bad segment header") as info:
        list(recover(tmp_path).wal_records)
    assert info.value.offset == 0


# --------------------------------------------------------------------------- repair


async def test_repair_salvages_the_records_before_the_corruption(
    tmp_path: Path, recover_all: RecoverAll, caplog: pytest.LogCaptureFixture
) -> None:
    first = write_segment(tmp_path, 1, 10)
    second = write_segment(tmp_path, 11, 10)
    offsets = record_offsets(1, 10)
    flip_byte(first, offsets[6] + 10)  # record 7
    original = first.read_bytes()
    with caplog.at_level(logging.ERROR, logger="ackbus.storage"):
        recovery, records = recover_all(tmp_path, repair=True)
    assert lsns(records) == [1, 2, 3, 4, 5, 6]
    check_payloads(records)
    report = recovery.report
    (tail,) = report.truncated
    assert tail.repaired and tail.offset == offsets[6]
    assert tail.records_dropped == 3  # 8, 9, 10 were still readable; 7 is damaged
    assert tail.saved_to is not None
    assert Path(tail.saved_to).read_bytes() == original[offsets[6] :]
    assert not second.exists()
    assert Path(str(second) + ".dropped").exists()
    assert str(second) + ".dropped" in report.dropped_files
    assert first.stat().st_size == offsets[6]
    assert "REPAIR" in caplog.text
    assert recovery.next_lsn == 7

    # The broker carries on from there, and the next start is clean.
    wal = WriteAheadLog.open(recovery)
    assert wal.append_nowait([(7, payload_for(7))]) == 7
    await wal.aclose()
    recovery, records = recover_all(tmp_path)
    assert lsns(records) == list(range(1, 8))
    assert recovery.report.truncated == ()


def test_repair_of_a_damaged_header_moves_the_segment_aside(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    write_segment(tmp_path, 1, 3)
    middle = write_segment(tmp_path, 4, 3)
    last = write_segment(tmp_path, 7, 3)
    flip_byte(middle, 2)
    recovery, records = recover_all(tmp_path, repair=True)
    assert lsns(records) == [1, 2, 3]
    assert not middle.exists() and not last.exists()
    assert recovery.next_lsn == 4
    assert sorted(os.listdir(tmp_path / "wal")) == sorted(
        [segment_name(1), segment_name(4) + ".dropped", segment_name(7) + ".dropped"]
    )


def test_repair_of_a_missing_segment_ends_the_log_before_the_gap(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    write_segment(tmp_path, 1, 5)
    write_segment(tmp_path, 6, 5).unlink()
    write_segment(tmp_path, 11, 5)
    recovery, records = recover_all(tmp_path, repair=True)
    assert lsns(records) == [1, 2, 3, 4, 5]
    assert recovery.next_lsn == 6

"""Reading records back by LSN (broker/storage/reader.py): the index the WAL writer
builds, the one recovery builds, the scan of segments a checkpoint covers, damage."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from broker.storage import (
    CorruptLog,
    SegmentsToKeep,
    open_wal,
    recover,
    write_checkpoint,
)
from broker.storage.group import GROUP_HEADER_BYTES
from broker.storage.segment import SEGMENT_HEADER_BYTES

RTYPE = 7


def payload(lsn: int) -> bytes:
    return b"record-%06d|" % lsn + b"p" * (lsn % 50)


def recovered(data_dir: Path) -> object:
    rec = recover(data_dir)
    for _ in rec.wal_records:
        pass
    return rec


async def write(data_dir: Path, first: int, count: int, *, segment_max_bytes: int = 2048) -> object:
    """Append records first..first+count-1 (one batch per 7 records); return the reader."""
    rec = recovered(data_dir)
    async with open_wal(rec, fsync_policy="never", segment_max_bytes=segment_max_bytes) as wal:
        lsn = first
        while lsn < first + count:
            n = min(7, first + count - lsn)
            wal.append_nowait([(RTYPE, payload(x)) for x in range(lsn, lsn + n)])
            lsn += n
            await wal.sync()
        # reads work while the WAL is open (the writer's index)
        got = wal.reader.read([first, first + count - 1, first + count // 2])
        assert got == [(RTYPE, payload(x)) for x in (first, first + count - 1, first + count // 2)]
        return wal.reader


def segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "wal").glob("*.wal"))


async def test_reads_back_every_record_across_segments(tmp_path: Path) -> None:
    reader = await write(tmp_path, 1, 300)
    assert len(segments(tmp_path)) > 5
    lsns = [5, 1, 300, 150, 2, 299, 77, 77]
    # the WAL closed its read handles; the reader reopens them on demand
    assert reader.read(lsns) == [(RTYPE, payload(x)) for x in lsns]  # type: ignore[attr-defined]
    missing = reader.read([301, 0])  # type: ignore[attr-defined]
    assert all(isinstance(m, str) and "no WAL segment" in m for m in missing)
    reader.close()  # type: ignore[attr-defined]


async def test_recovery_index_matches_the_writers(tmp_path: Path) -> None:
    await write(tmp_path, 1, 200)
    rec = recovered(tmp_path)
    lsns = list(range(1, 201))
    assert rec.reader.read(lsns) == [(RTYPE, payload(x)) for x in lsns]  # type: ignore[attr-defined]
    rec.reader.close()  # type: ignore[attr-defined]


async def test_segments_covered_by_a_checkpoint_are_scanned(tmp_path: Path) -> None:
    await write(tmp_path, 1, 200)
    # a checkpoint covering everything: recovery replays no segment, yet reads work
    write_checkpoint(tmp_path, 200, iter([(1, b"{}")]))
    rec = recovered(tmp_path)
    assert rec.report.records_replayed == 0  # type: ignore[attr-defined]
    assert rec.reader.read([1, 100, 200]) == [(RTYPE, payload(x)) for x in (1, 100, 200)]  # type: ignore[attr-defined]
    rec.reader.close()  # type: ignore[attr-defined]


async def test_damaged_record_is_reported_not_returned(tmp_path: Path) -> None:
    reader = await write(tmp_path, 1, 100)
    reader.close()  # type: ignore[attr-defined]
    first = segments(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[SEGMENT_HEADER_BYTES + GROUP_HEADER_BYTES + 20] ^= 0xFF  # inside the first record's payload
    first.write_bytes(bytes(data))
    (bad, good) = reader.read([1, 2])  # type: ignore[attr-defined]
    assert isinstance(bad, str) and "CRC" in bad and str(first) in bad
    assert good == (RTYPE, payload(2))
    reader.close()  # type: ignore[attr-defined]


async def test_released_segment_is_forgotten(tmp_path: Path) -> None:
    rec = recovered(tmp_path)
    async with open_wal(rec, fsync_policy="never", segment_max_bytes=2048) as wal:
        for lsn in range(1, 301, 5):
            wal.append_nowait([(RTYPE, payload(x)) for x in range(lsn, lsn + 5)])
            await wal.sync()
        firsts = sorted(int(p.name.split(".")[0], 16) for p in segments(tmp_path))
        keep = {firsts[1]}
        removed = wal.release_through(firsts[3] - 1, keep)
        assert len(removed) == 2  # the first and third: the second is kept
        assert [p.exists() for p in map(Path, removed)] == [False, False]
        assert isinstance(wal.reader.read([1])[0], str)
        assert wal.reader.read([firsts[1]]) == [(RTYPE, payload(firsts[1]))]
        assert len(firsts) >= 5
        assert wal.reader.segments_holding([1, firsts[1], firsts[1] + 1, 300, firsts[1] + 2]) == (
            {firsts[1]: 3, firsts[-1]: 1},
            [1],  # its segment was deleted
        )
        assert wal.reader.record_count(firsts[1]) == firsts[2] - firsts[1]
        assert wal.reader.record_count(1) == 0  # released
    # a restart after that: the kept segment, now before a gap, is still readable
    write_checkpoint(tmp_path, firsts[3] - 1, iter([(1, b"{}")]))
    rec2 = recovered(tmp_path)
    assert rec2.reader.read([firsts[1], 300]) == [(RTYPE, payload(firsts[1])), (RTYPE, payload(300))]  # type: ignore[attr-defined]
    rec2.reader.close()  # type: ignore[attr-defined]


def test_scan_stops_at_damage_and_reports_the_rest(tmp_path: Path) -> None:
    trio.run(write, tmp_path, 1, 100)
    write_checkpoint(tmp_path, 100, iter([(1, b"{}")]))
    first = segments(tmp_path)[0]
    size = os.path.getsize(first)
    with open(first, "r+b") as f:
        f.seek(size - 5)
        f.write(b"\xff\xff\xff\xff\xff")  # the segment's last record
    # a kept segment is as precious as the rest of the log: damage stops the start...
    with pytest.raises(CorruptLog) as info:
        recovered(tmp_path)
    assert info.value.path == str(first) and "kept for the bodies" in str(info.value)
    # ...unless repairing: what precedes the damage is readable, the rest says why not
    rec = recover(tmp_path, repair=True)
    for _ in rec.wal_records:
        pass
    n_first = int(segments(tmp_path)[1].name.split(".")[0], 16) - 1
    got = rec.reader.read([1, n_first])
    assert got[0] == (RTYPE, payload(1))
    assert isinstance(got[1], str)
    rec.reader.close()  # type: ignore[attr-defined]


async def test_a_write_during_a_read_does_not_change_what_is_read(tmp_path: Path) -> None:
    """The WAL writer appends to the active segment (and moves its end) while the loop
    thread reads from it: the extents of what is read are fixed before the read.
    (Regression: the last indexed record came back "cut short" under load.)"""
    rec = recovered(tmp_path)
    async with open_wal(rec, fsync_policy="never") as wal:
        wal.append_nowait([(RTYPE, payload(x)) for x in range(1, 6)])
        await wal.sync()
        reader = wal.reader
        found, _ = reader.segments_holding([5])
        (first,) = found
        real_file = reader._file  # type: ignore[attr-defined]

        class Racing:
            def __init__(self, f: object) -> None:
                self.f = f

            def seek(self, pos: int) -> None:
                self.f.seek(pos)  # type: ignore[attr-defined]

            def read(self, n: int) -> bytes:
                data = self.f.read(n)  # type: ignore[attr-defined]
                # the writer lands a batch meanwhile: two more records indexed
                seg = reader._segments[first]  # type: ignore[attr-defined]
                reader.note_written(first, seg.path, seg.end, [100, 100])
                return data

        reader._file = lambda seg: Racing(real_file(seg))  # type: ignore[attr-defined]
        assert reader.read([4, 5]) == [(RTYPE, payload(4)), (RTYPE, payload(5))]


async def test_read_handles_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backlog spread over many segments does not keep a descriptor open for each."""
    from broker.storage import reader as reader_module

    monkeypatch.setattr(reader_module, "_MAX_OPEN_FILES", 2)
    reader = await write(tmp_path, 1, 300)
    firsts = sorted(int(p.name.split(".")[0], 16) for p in segments(tmp_path))
    assert len(firsts) > 4
    assert reader.read(firsts) == [(RTYPE, payload(x)) for x in firsts]  # type: ignore[attr-defined]
    assert len(reader._files) <= 2  # type: ignore[attr-defined]
    reader.close()  # type: ignore[attr-defined]


async def test_records_not_written_yet_are_not_placed_in_any_segment(tmp_path: Path) -> None:
    """A record the WAL still buffers may go to a segment that does not exist yet: the
    reader must not guess it is in the last one it knows. (Regression: a checkpoint
    kept the wrong segment for such records and the right one was deleted, losing
    confirmed messages under kill -9 with small segments.)"""
    rec = recovered(tmp_path)
    async with open_wal(rec, fsync_policy="never", segment_max_bytes=400) as wal:
        wal.append_nowait([(RTYPE, payload(x)) for x in range(1, 6)])
        await wal.sync()
        reader = wal.reader
        wal.append_nowait([(RTYPE, payload(x)) for x in range(6, 40)])  # buffered
        found, unindexed = reader.segments_holding([2, 3, 6, 7, 39])
        assert found == {1: 2} and unindexed == [6, 7, 39]
        await wal.sync()
        found, unindexed = reader.segments_holding([6, 7, 39])
        assert unindexed == [] and sum(found.values()) == 3
        assert 1 not in found  # they went to a new segment: too big for the first


async def test_segments_to_keep_places_records_once_written_and_caps_the_release(tmp_path: Path) -> None:
    """What a checkpoint keeps: records buffered while it is written are placed after
    the sync; a record in no segment even then stops the release before it."""
    rec = recovered(tmp_path)
    async with open_wal(rec, fsync_policy="never", segment_max_bytes=400) as wal:
        wal.append_nowait([(RTYPE, payload(x)) for x in range(1, 6)])
        await wal.sync()
        keep = SegmentsToKeep(wal.reader)
        keep.add([2, 3])
        wal.append_nowait([(RTYPE, payload(x)) for x in range(6, 40)])  # buffered
        keep.add([7, 39])
        assert keep.counts == {1: 2}
        await wal.sync()
        assert keep.release_limit(39) == 39
        assert keep.counts[1] == 2 and sum(keep.counts.values()) == 4
        # a referred-to record that no segment holds (lost): keep everything from it on
        lost = SegmentsToKeep(wal.reader)
        lost.add([3, 1000])
        assert lost.release_limit(39) == 39  # 1000 is beyond the checkpoint anyway
        gone = SegmentsToKeep(wal.reader)
        wal.reader.drop(1)  # as if segment 1 had been deleted
        gone.add([3, 7])
        assert gone.release_limit(39) == 2


def test_scan_takes_a_zero_filled_tail_for_unused_preallocated_space(tmp_path: Path) -> None:
    """A covered segment whose cut did not reach the disk before a power loss ends in
    zeros: that is the end of its records, not damage (docs/durability.md)."""
    trio.run(write, tmp_path, 1, 100)
    write_checkpoint(tmp_path, 100, iter([(1, b"{}")]))
    first = segments(tmp_path)[0]
    with open(first, "ab") as f:
        f.write(bytes(8192))
    rec = recovered(tmp_path)
    n_first = int(segments(tmp_path)[1].name.split(".")[0], 16) - 1
    assert rec.reader.read([1, n_first]) == [(RTYPE, payload(1)), (RTYPE, payload(n_first))]  # type: ignore[attr-defined]
    rec.reader.close()  # type: ignore[attr-defined]

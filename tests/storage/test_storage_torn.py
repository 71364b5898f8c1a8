"""Torn writes: a power cut persists any subset of what was written since the last fsync.

A disk writes sectors in whatever order suits it, so after a power cut the unsynced end
of a segment may hold a hole followed by later bytes. None of that was acknowledged
under ``fsync=always``, so recovery must cut it off as a torn tail and never call it
corruption; damage to bytes that an fsync covered stays corruption, a clear stop naming
file and offset (docs/durability.md, "Recovery").

The cuts are made by ``SimulatedDisk``: every subset of the unsynced pieces for small
cases, seeded random subsets for larger ones.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.storage import CorruptLog, WriteAheadLog, faults, recover
from broker.storage.group import GROUP_HEADER_BYTES
from broker.storage.segment import SEGMENT_HEADER_BYTES
from broker.storage.testing import SimulatedCrash, SimulatedDisk

RecoverAll = Callable[..., Any]


def payload_for(lsn: int) -> bytes:
    return b"torn-%d-" % lsn + bytes([lsn % 251]) * (lsn % 23)


class Crashed:
    """The state a scenario left on a SimulatedDisk, before the power cut."""

    def __init__(self, data_dir: Path, disk: SimulatedDisk, synced_lsn: int, acked: int) -> None:
        self.data_dir = data_dir
        self.disk = disk
        #: every record up to this LSN had been fsynced: it must come back
        self.synced_lsn = synced_lsn
        #: the last LSN reported durable (under "always": only lazy ones may be lost)
        self.acked = acked


async def run_scenario(
    data_dir: Path,
    batches: list[tuple[int, bool]],
    *,
    policy: str = "always",
    crash_last: bool = True,
    segment_max_bytes: int = 1 << 20,
    preallocate_bytes: int = 4096,
    inline_max_records: int = 8,
) -> Crashed:
    """Append ``(size, lazy)`` batches one at a time (each reported before the next),
    then crash: at the fsync of the last batch if ``crash_last`` (it is written, not
    synced), else right after it was reported."""
    disk = SimulatedDisk()
    acked: list[int] = []
    progress = trio.Event()

    def on_durable(lsn: int) -> None:
        nonlocal progress
        acked.append(lsn)
        progress.set()
        progress = trio.Event()

    wal = WriteAheadLog(
        data_dir,
        fs=disk,
        fsync_policy=policy,
        on_durable=on_durable,
        lazy_sync_s=3600,
        segment_max_bytes=segment_max_bytes,
        preallocate_bytes=preallocate_bytes,
        inline_max_records=inline_max_records,
    )
    faults.set_kill_handler(disk.kill_handler)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(wal.serve)
            for index, (size, lazy) in enumerate(batches):
                if crash_last and index == len(batches) - 1:
                    faults.activate("wal.before_fsync", count=1)
                first = wal.last_lsn + 1
                last = wal.append_nowait(
                    [(lsn % 256, payload_for(lsn)) for lsn in range(first, first + size)], lazy=lazy
                )
                while not acked or acked[-1] < last:
                    await progress.wait()
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        rest = group.split(SimulatedCrash)[1]
        if rest is not None:
            raise
    finally:
        faults.set_kill_handler(None)
    stats = wal.statistics()
    return Crashed(data_dir, disk, stats.last_synced_lsn, max(acked, default=0))


def materialize(crashed: Crashed, keep: Callable[[str, int], bool], piece_bytes: int, case: Path) -> None:
    """Write what the files would hold after a torn power cut into ``case``."""
    for directory in ("wal", "checkpoint"):
        (case / directory).mkdir(parents=True, exist_ok=True)
    for path, content in crashed.disk.power_cut_images(keep, piece_bytes=piece_bytes).items():
        target = case / os.path.relpath(path, crashed.data_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def check_prefix(case: Path, crashed: Crashed, *, lazy_may_go: bool) -> int:
    """Recover ``case``: no corruption, a gap-free prefix of the right records, and
    every record that had been fsynced. Returns how many came back."""
    recovery = recover(case)
    records = list(recovery.wal_records)
    lsns = [lsn for lsn, _, _ in records]
    assert lsns == list(range(1, len(lsns) + 1)), "not a gap-free prefix"
    for lsn, rtype, payload in records:
        assert (rtype, payload) == (lsn % 256, payload_for(lsn))
    assert len(lsns) >= crashed.synced_lsn, "a record that had been fsynced was lost"
    if not lazy_may_go:
        assert len(lsns) >= crashed.acked
    # the cut is final: a second recovery finds a clean log
    again = recover(case)
    assert [lsn for lsn, _, _ in again.wal_records] == lsns
    assert again.report.truncated == ()
    return len(lsns)


def subsets(pieces: list[tuple[str, int]]) -> list[Collection[tuple[str, int]]]:
    return [
        set(chosen)
        for n in range(len(pieces) + 1)
        for chosen in itertools.combinations(pieces, n)
    ]


# --------------------------------------------------------------------------- exhaustive


SMALL_SCENARIOS = {
    # always: a synced batch, two lazy (acks) batches, then one whose fsync never returns
    "always-lazy": dict(batches=[(2, False), (1, True), (2, True), (1, False)], policy="always"),
    # never: three batches written, none synced (after the first sync at start)
    "never": dict(batches=[(1, False), (2, False), (1, False), (2, False)], policy="never", crash_last=False),
    # interval: batches between two fsyncs
    "interval": dict(
        batches=[(1, False), (2, False), (2, False)], policy="interval=100000", crash_last=False
    ),
    # without preallocation: the file grows, and kept pieces can leave holes of zeros
    "always-no-prealloc": dict(
        batches=[(2, False), (2, True), (1, False)], policy="always", preallocate_bytes=0
    ),
}


@pytest.mark.parametrize("name", list(SMALL_SCENARIOS))
async def test_every_subset_of_unsynced_pieces_is_a_torn_tail(tmp_path: Path, name: str) -> None:
    data_dir = tmp_path / "data"
    crashed = await run_scenario(data_dir, **SMALL_SCENARIOS[name])  # type: ignore[arg-type]
    piece_bytes = 48
    pieces = crashed.disk.unsynced_pieces(piece_bytes=piece_bytes)
    assert 3 <= len(pieces) <= 11, pieces  # small enough to try every subset
    counts = set()
    for index, chosen in enumerate(subsets(pieces)):
        case = tmp_path / f"case-{index}"
        materialize(crashed, lambda path, offset: (path, offset) in chosen, piece_bytes, case)
        counts.add(check_prefix(case, crashed, lazy_may_go=True))
    # the cuts kept different amounts: from the synced prefix to everything written
    assert min(counts) == crashed.synced_lsn
    assert max(counts) == sum(size for size, _ in SMALL_SCENARIOS[name]["batches"])  # type: ignore[attr-defined]


async def test_a_lost_first_sector_with_later_ones_kept_is_a_torn_tail(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    """The case a real power cut produced: a batch's first sector never reached the
    disk while its later ones did, so a zeroed header is followed by valid frames."""
    data_dir = tmp_path / "data"
    crashed = await run_scenario(data_dir, [(3, False), (40, False)], inline_max_records=0)
    pieces = crashed.disk.unsynced_pieces()  # 512-byte sectors
    assert len(pieces) >= 2
    first = pieces[0]
    crashed.disk.lose_power(lambda path, offset: (path, offset) != first)
    segment = data_dir / "wal" / f"{1:016x}.wal"
    start = SEGMENT_HEADER_BYTES + GROUP_HEADER_BYTES * 1 + sum(
        9 + len(payload_for(lsn)) for lsn in (1, 2, 3)
    )
    data = segment.read_bytes()
    assert data[start : start + 8] == bytes(8)  # the second batch's header is gone...
    assert payload_for(43) in data  # ...while its last records reached the disk
    recovery, records = recover_all(data_dir)
    assert [lsn for lsn, _, _ in records] == [1, 2, 3]
    (tail,) = recovery.report.truncated
    assert tail.path == str(segment) and not tail.repaired


# --------------------------------------------------------------------------- random, larger


@pytest.mark.parametrize("seed", range(12))
async def test_random_torn_power_cuts_over_many_batches_and_segments(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    policy = rng.choice(["always", "always", "never", "interval=100000"])
    batches = [(rng.randint(1, 12), policy == "always" and rng.random() < 0.3) for _ in range(rng.randint(5, 40))]
    if policy == "always":
        batches[-1] = (batches[-1][0], False)
    data_dir = tmp_path / "data"
    crashed = await run_scenario(
        data_dir,
        batches,
        policy=policy,
        crash_last=policy == "always" and rng.random() < 0.7,
        segment_max_bytes=rng.choice([600, 2000, 1 << 20]),
        preallocate_bytes=rng.choice([0, 512, 4096]),
        inline_max_records=rng.choice([0, 8]),
    )
    piece_bytes = rng.choice([16, 64, 512])
    pieces = crashed.disk.unsynced_pieces(piece_bytes=piece_bytes)
    for trial in range(40):
        keep_p = rng.random()
        chosen = {piece for piece in pieces if rng.random() < keep_p}
        case = tmp_path / f"case-{trial}"
        materialize(crashed, lambda path, offset: (path, offset) in chosen, piece_bytes, case)
        check_prefix(case, crashed, lazy_may_go=True)


async def test_torn_power_cut_in_place_then_the_log_goes_on(tmp_path: Path, recover_all: RecoverAll) -> None:
    """lose_power(keep) on the disk itself, then recovery, appending, a second crash."""
    data_dir = tmp_path / "data"
    crashed = await run_scenario(data_dir, [(2, False), (3, True), (4, True), (2, False)])
    rng = random.Random(7)
    crashed.disk.lose_power(lambda path, offset: rng.random() < 0.5, piece_bytes=32)
    recovery, records = recover_all(data_dir, fs=crashed.disk)
    assert len(records) >= crashed.synced_lsn
    wal = WriteAheadLog.open(recovery)
    next_lsn = recovery.next_lsn
    wal.append_nowait([(next_lsn % 256, payload_for(next_lsn))])
    await wal.aclose()
    _, records = recover_all(data_dir)
    assert [lsn for lsn, _, _ in records] == list(range(1, next_lsn + 1))


# --------------------------------------------------------------------------- corruption


async def written_log(data_dir: Path, batches: int, *, policy: str = "always") -> list[int]:
    """A log of ``batches`` batches of 3 records, each reported before the next; returns
    the offset where each batch's group starts in segment 1."""
    wal = WriteAheadLog(data_dir, fsync_policy=policy)
    starts = []
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        for _ in range(batches):
            starts.append(wal.statistics().bytes_written + SEGMENT_HEADER_BYTES)
            first = wal.last_lsn + 1
            wal.append_nowait([(lsn % 256, payload_for(lsn)) for lsn in range(first, first + 3)])
            await wal.sync()
        await wal.aclose()
    return starts


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x20
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["header", "payload"])
async def test_damage_to_an_fsynced_group_is_corruption_naming_file_and_offset(
    tmp_path: Path, where: str
) -> None:
    starts = await written_log(tmp_path, 8)
    segment = tmp_path / "wal" / f"{1:016x}.wal"
    victim = starts[4]
    flip(segment, victim + (12 if where == "header" else GROUP_HEADER_BYTES + 12))
    before = segment.read_bytes()
    with pytest.raises(CorruptLog) as info:
        list(recover(tmp_path).wal_records)
    error = info.value
    assert (error.path, error.offset) == (str(segment), victim)
    assert f"{segment} at byte offset {victim}" in str(error)
    assert "fsynced" in error.reason and f"offset {starts[5]}" in error.reason
    assert segment.read_bytes() == before  # a refused recovery changes nothing

    # repair keeps the four groups before it
    recovery = recover(tmp_path, repair=True)
    assert [lsn for lsn, _, _ in recovery.wal_records] == list(range(1, 13))
    (tail,) = recovery.report.truncated
    assert tail.repaired and tail.offset == victim
    # the records of the groups dropped whose headers are intact: 13..24, or 16..24
    assert tail.records_dropped == (9 if where == "header" else 12)


async def test_damage_to_the_last_group_with_nothing_after_it_is_a_torn_tail(tmp_path: Path) -> None:
    """Nothing after the last group can prove it was fsynced: the one case where bit rot
    and a torn write cannot be told apart (as before write groups)."""
    starts = await written_log(tmp_path, 4)
    segment = tmp_path / "wal" / f"{1:016x}.wal"
    flip(segment, starts[-1] + GROUP_HEADER_BYTES + 12)
    recovery = recover(tmp_path)
    assert [lsn for lsn, _, _ in recovery.wal_records] == list(range(1, 10))
    (tail,) = recovery.report.truncated
    assert tail.offset == starts[-1]


async def test_a_torn_unsynced_tail_after_corruption_of_synced_bytes_is_still_corruption(
    tmp_path: Path,
) -> None:
    """Damage to a synced group, then groups written without an fsync (never): the later
    groups carry the evidence of the fsync that covered the damaged one."""
    wal = WriteAheadLog(tmp_path, fsync_policy="never")
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        for _ in range(3):
            wal.append_nowait([(1, payload_for(1))] * 2)
            await wal.sync()
        synced_end = wal.statistics().bytes_written + SEGMENT_HEADER_BYTES
        for _ in range(3):
            last = wal.append_nowait([(1, payload_for(1))] * 2)
            while wal.statistics().last_durable_lsn < last:
                await trio.sleep(0)
        await wal.aclose()
    segment = tmp_path / "wal" / f"{1:016x}.wal"
    data = bytearray(segment.read_bytes())
    data[synced_end - 3] ^= 1  # inside the last synced group
    data[synced_end + 40 :] = bytes(len(data) - synced_end - 40)  # and a torn tail after it
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptLog, match="fsynced"):
        list(recover(tmp_path).wal_records)


async def test_damage_in_an_earlier_segment_is_corruption(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_max_bytes=300)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        for _ in range(12):
            wal.append_nowait([(1, b"x" * 30)])
            await wal.sync()
        await wal.aclose()
    first = sorted((tmp_path / "wal").glob("*.wal"))[0]
    size = first.stat().st_size
    with open(first, "r+b") as file:
        file.truncate(size - 5)
    with pytest.raises(CorruptLog, match="not the last") as info:
        list(recover(tmp_path).wal_records)
    assert info.value.path == str(first)

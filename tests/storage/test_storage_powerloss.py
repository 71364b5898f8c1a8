"""Power loss: every record reported durable is there after unsynced writes are dropped."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.storage import WriteAheadLog, faults, write_checkpoint
from broker.storage.testing import SimulatedCrash, SimulatedDisk

RecoverAll = Callable[..., Any]


def payload_for(lsn: int) -> bytes:
    return b"durable-%d-" % lsn + bytes(lsn % 37)


# --------------------------------------------------------------------------- the double


def test_simulated_disk_drops_unsynced_bytes(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    path = str(tmp_path / "f")
    file = disk.create(path)
    file.write(b"synced ")
    file.sync()
    file.write(b"not synced")
    disk.sync_dir(str(tmp_path))
    assert (tmp_path / "f").read_bytes() == b"synced not synced"
    disk.lose_power()
    assert (tmp_path / "f").read_bytes() == b"synced "
    with pytest.raises(OSError):
        file.write(b"dead handle")


def test_simulated_disk_drops_unsynced_directory_entries(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    old = disk.create(str(tmp_path / "old"))
    old.write(b"old")
    old.sync()
    old.close()
    disk.sync_dir(str(tmp_path))
    new = disk.create(str(tmp_path / "new.tmp"))
    new.write(b"new")
    new.sync()
    new.close()
    disk.rename(str(tmp_path / "new.tmp"), str(tmp_path / "old"))
    assert (tmp_path / "old").read_bytes() == b"new"
    disk.lose_power()  # the rename was never made durable
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    assert (tmp_path / "old").read_bytes() == b"old"


# --------------------------------------------------------------------------- the WAL


async def run_until_crash(
    data_dir: Path,
    disk: SimulatedDisk,
    durable: list[int],
    *,
    seed: int,
    batches: int = 60,
    segment_max_bytes: int = 400,
) -> bool:
    """Append random batches, sometimes waiting for them to be durable (so that there
    are many batches and segments), sometimes not (so that batches group). Returns True
    if a SimulatedCrash stopped the WAL."""
    rng = random.Random(seed)
    progress = trio.Event()

    def on_durable(lsn: int) -> None:
        nonlocal progress
        durable.append(lsn)
        progress.set()
        progress = trio.Event()

    wal = WriteAheadLog(
        data_dir, fs=disk, segment_max_bytes=segment_max_bytes, on_durable=on_durable
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(wal.serve)
            for _ in range(batches):
                first = wal.last_lsn + 1
                size = rng.randint(1, 6)
                last = wal.append_nowait(
                    [(lsn % 256, payload_for(lsn)) for lsn in range(first, first + size)]
                )
                if rng.random() < 0.6:
                    while not durable or durable[-1] < last:
                        await progress.wait()
                else:
                    for _ in range(rng.randint(0, 3)):
                        await trio.sleep(0)
            await wal.aclose()
    except BaseExceptionGroup as group:
        if group.split(SimulatedCrash)[1] is not None:
            raise
        return True
    return False


def check_recovered(records: list[tuple[int, int, bytes]], durable: list[int]) -> None:
    lsns = [lsn for lsn, _, _ in records]
    assert lsns == list(range(1, len(lsns) + 1)), "recovered log is not a gap-free prefix"
    assert max(durable, default=0) <= len(lsns), "a record reported durable was lost"
    for lsn, rtype, payload in records:
        assert (rtype, payload) == (lsn % 256, payload_for(lsn))


KILL_POINTS = ["wal.after_write", "wal.before_fsync", "wal.after_fsync", "wal.after_segment_create"]


@pytest.mark.parametrize("point", KILL_POINTS)
@pytest.mark.parametrize("skip", [0, 1, 4, 9])
async def test_power_loss_at_a_kill_point_keeps_every_durable_record(
    tmp_path: Path, point: str, skip: int, recover_all: RecoverAll
) -> None:
    disk = SimulatedDisk()
    faults.set_kill_handler(disk.kill_handler)
    durable: list[int] = []
    faults.activate(point, skip=skip, count=1)
    crashed = await run_until_crash(tmp_path, disk, durable, seed=skip)
    assert crashed
    disk.lose_power()
    recovery, records = recover_all(tmp_path, fs=disk)
    check_recovered(records, durable)
    # and the log continues cleanly from there
    wal = WriteAheadLog.open(recovery)
    next_lsn = recovery.next_lsn
    assert wal.append_nowait([(next_lsn % 256, payload_for(next_lsn))]) == next_lsn
    await wal.aclose()
    _, records = recover_all(tmp_path)
    check_recovered(records, [next_lsn])


@pytest.mark.parametrize("seed", range(8))
async def test_power_loss_at_a_random_moment(
    tmp_path: Path, seed: int, recover_all: RecoverAll
) -> None:
    """Cut the power while the writer is mid-flight (no fault point), then recover."""
    disk = SimulatedDisk()
    durable: list[int] = []
    rng = random.Random(seed)
    wal = WriteAheadLog(tmp_path, fs=disk, segment_max_bytes=300, on_durable=durable.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        for _ in range(rng.randint(5, 60)):
            first = wal.last_lsn + 1
            wal.append_nowait(
                [(lsn % 256, payload_for(lsn)) for lsn in range(first, first + rng.randint(1, 4))]
            )
            for _ in range(rng.randint(0, 3)):
                await trio.sleep(0)
        nursery.cancel_scope.cancel()  # the writer stops wherever it is; no aclose
    disk.lose_power()
    _, records = recover_all(tmp_path, fs=disk)
    check_recovered(records, durable)


async def test_power_loss_around_checkpoints_and_release(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    """The broker cycle: append, checkpoint, release, repeat; then cut the power."""
    disk = SimulatedDisk()
    durable: list[int] = []
    wal = WriteAheadLog(tmp_path, fs=disk, segment_max_bytes=250, on_durable=durable.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        for round_ in range(5):
            for _ in range(10):
                first = wal.last_lsn + 1
                wal.append_nowait(
                    [(lsn % 256, payload_for(lsn)) for lsn in range(first, first + 2)]
                )
                await trio.sleep(0)
            lsn = await wal.sync()
            # the "state" is simply every LSN so far
            await trio.to_thread.run_sync(
                lambda: write_checkpoint(
                    tmp_path, lsn, [(0, b"%d" % n) for n in range(1, lsn + 1)], fs=disk
                )
            )
            wal.release_through(lsn)
        first = wal.last_lsn + 1
        wal.append_nowait([(n % 256, payload_for(n)) for n in range(first, first + 3)])
        await wal.sync()
        nursery.cancel_scope.cancel()
    disk.lose_power()
    recovery, records = recover_all(tmp_path, fs=disk)
    assert recovery.checkpoint_lsn == 100
    assert [lsn for lsn, _, _ in records] == [101, 102, 103]
    assert durable[-1] == 103


@pytest.mark.parametrize("policy", ["interval=1000", "never"])
async def test_relaxed_policies_still_recover_a_clean_prefix_after_power_loss(
    tmp_path: Path, policy: str, mock_clock: trio.testing.MockClock, recover_all: RecoverAll
) -> None:
    """Unsynced records may be lost (that is the policy), but every segment the WAL moved
    past was fsynced first, so recovery never finds damage before the last segment."""
    disk = SimulatedDisk()
    durable: list[int] = []
    wal = WriteAheadLog(
        tmp_path, fs=disk, fsync_policy=policy, segment_max_bytes=200, on_durable=durable.append
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        for _ in range(40):
            first = wal.last_lsn + 1
            last = wal.append_nowait(
                [(lsn % 256, payload_for(lsn)) for lsn in range(first, first + 2)]
            )
            while not durable or durable[-1] < last:
                await trio.sleep(0)
        nursery.cancel_scope.cancel()
    disk.lose_power()
    recovery, records = recover_all(tmp_path, fs=disk)
    assert len(records) > 0  # the segments rolled past are whole
    check_recovered(records, [])
    assert recovery.report.truncated == () or recovery.report.truncated[0].path.endswith(
        max(p.name for p in (tmp_path / "wal").iterdir())
    )

"""A full disk does not wedge the broker: the space reserve (broker/storage/reserve.py)
lets a checkpoint be written when nothing else fits, the segments it covers are
released, and writing goes on (docs/durability.md, "When the disk fills up")."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.storage import WALFailed, WriteAheadLog, faults, recover, write_checkpoint
from broker.storage.fs import OS_FILE_SYSTEM, FileSystem
from broker.storage.reserve import (
    RESERVE_NAME,
    ensure_reserve,
    release_reserve,
    wanted_reserve_bytes,
)
from broker.storage.testing import SimulatedDisk
from tests.storage.walevents import Events, serving

RecoverAll = Callable[..., Any]




async def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(0.01)


# --------------------------------------------------------------------------- the file


def test_the_reserve_is_made_sized_and_released(tmp_path: Path) -> None:
    fs = OS_FILE_SYSTEM
    reserve = tmp_path / RESERVE_NAME
    assert ensure_reserve(tmp_path, 100_000, fs)
    assert reserve.stat().st_size == 100_000
    assert os.stat(reserve).st_blocks * 512 >= 100_000  # really allocated, not sparse
    assert ensure_reserve(tmp_path, 50_000, fs)  # large enough already
    assert reserve.stat().st_size == 100_000
    assert ensure_reserve(tmp_path, 200_000, fs)  # grown
    assert reserve.stat().st_size == 200_000
    assert sorted(os.listdir(tmp_path)) == [RESERVE_NAME]
    assert release_reserve(tmp_path, fs)
    assert not reserve.exists()
    assert not release_reserve(tmp_path, fs)
    assert wanted_reserve_bytes(8 << 20, 1 << 20) == 8 << 20
    assert wanted_reserve_bytes(8 << 20, 10 << 20) == 20 << 20


def test_no_room_for_the_reserve_is_no_error(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    disk.makedirs(str(tmp_path))
    disk.sync_dir(str(tmp_path))
    disk.capacity_bytes = 10_000
    assert not ensure_reserve(tmp_path, 20_000, disk)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- checkpoints


def state(n: int) -> list[tuple[int, bytes]]:
    return [(0, b"s" * 100)] * n


@pytest.mark.parametrize(
    "point, skip",
    [
        ("checkpoint.write_enospc", 0),  # the header
        ("checkpoint.write_enospc", 1),  # the records
        ("checkpoint.write_enospc", 2),  # the trailer
        ("checkpoint.rename_enospc", 0),
    ],
)
def test_a_checkpoint_that_runs_out_of_space_uses_the_reserve_and_goes_on(
    tmp_path: Path, point: str, skip: int
) -> None:
    assert ensure_reserve(tmp_path, 1 << 20, OS_FILE_SYSTEM)
    faults.activate(point, skip=skip, count=1)
    info = write_checkpoint(tmp_path, 7, state(20_000))
    assert not faults.active()
    assert not (tmp_path / RESERVE_NAME).exists()  # used
    loaded = recover(tmp_path).checkpoint
    assert loaded is not None and loaded.lsn == 7 and info.records == 20_000
    assert len(list(loaded.records)) == 20_000


def test_without_a_reserve_a_full_disk_fails_the_checkpoint(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 3, state(2))
    faults.activate("checkpoint.write_enospc", count=1)
    with pytest.raises(OSError) as info:
        write_checkpoint(tmp_path, 7, state(2))
    assert info.value.errno == errno.ENOSPC
    assert recover(tmp_path).checkpoint_lsn == 3


@pytest.mark.parametrize("point", ["checkpoint.fsync_enospc", "checkpoint.dir_fsync_enospc"])
def test_a_failed_fsync_is_not_retried_but_frees_the_reserve_for_the_next_try(
    tmp_path: Path, point: str
) -> None:
    write_checkpoint(tmp_path, 3, state(2))
    assert ensure_reserve(tmp_path, 1 << 20, OS_FILE_SYSTEM)
    faults.activate(point, count=1)
    with pytest.raises(OSError):
        write_checkpoint(tmp_path, 7, state(2))
    assert not (tmp_path / RESERVE_NAME).exists()
    assert (tmp_path / "checkpoint" / f"{3:016x}.ckpt").exists()  # the previous one stays
    write_checkpoint(tmp_path, 8, state(2))  # the next try
    assert recover(tmp_path).checkpoint_lsn == 8


# --------------------------------------------------------------------------- the WAL


async def test_the_wal_makes_the_reserve_and_makes_it_again_after_releasing_segments(
    tmp_path: Path,
) -> None:
    wal = WriteAheadLog(tmp_path, reserve_bytes=64 * 1024, segment_max_bytes=500)
    reserve = tmp_path / RESERVE_NAME
    async with serving(wal):
        await eventually(reserve.exists)
        assert reserve.stat().st_size == 64 * 1024
        for _ in range(10):
            wal.append_nowait([(1, b"x" * 100)] * 3)
            await wal.sync()
        release_reserve(tmp_path, OS_FILE_SYSTEM)
        # a checkpoint larger than half the minimum: the reserve grows to twice it
        write_checkpoint(tmp_path, wal.last_lsn, state(400))
        assert wal.release_through(wal.last_lsn)
        await eventually(reserve.exists)
        assert reserve.stat().st_size >= 2 * 400 * 100


async def test_no_reserve_unless_asked(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    async with serving(wal):
        wal.append_nowait([(1, b"x")])
        await wal.sync()
    assert RESERVE_NAME not in os.listdir(tmp_path)


async def test_sync_after_a_full_disk_probes_at_once(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, retry_interval_s=3600, **events.callbacks())
    async with serving(wal):
        wal.append_nowait([(1, b"a")])
        await wal.sync()
        disk.fail_writes(1, errno.ENOSPC)
        wal.append_nowait([(1, b"b")])
        await events.wait_for(lambda: bool(events.failures))
        assert wal.failed and events.recovered == 0
        with trio.fail_after(10):  # no waiting for the hour-long retry
            assert await wal.sync() == 1
        assert not wal.failed and events.recovered == 1
        # other errors still wait for the probe's timer
        disk.fail_syncs(1, errno.EIO)
        wal.append_nowait([(1, b"c")])
        await events.wait_for(lambda: len(events.failures) == 2)
        with pytest.raises(WALFailed):
            await wal.sync()


# --------------------------------------------------------------------------- the whole story


async def fill_checkpoint_release_and_go_on(
    data_dir: Path, fs: FileSystem, *, record_bytes: int, reserve_bytes: int, segment_max_bytes: int
) -> None:
    """The broker's way out of a full disk, driven as its runtime drives the storage:
    fill -> writes fail -> (records settled) -> checkpoint written using the reserve ->
    the log synced and its segments released -> writes succeed -> reserve made again."""
    events = Events()
    wal = WriteAheadLog(
        data_dir,
        fs=fs,
        reserve_bytes=reserve_bytes,
        segment_max_bytes=segment_max_bytes,
        preallocate_bytes=segment_max_bytes // 4,
        retry_interval_s=3600,  # only the checkpoint's sync probes, to keep this exact
        **events.callbacks(),
    )
    reserve = data_dir / RESERVE_NAME
    async with serving(wal):
        await eventually(reserve.exists)
        # 1. fill the disk until a write fails
        while not events.failures:
            last = wal.append_nowait([(1, b"r" * record_bytes)] * 4)
            await events.wait_for(lambda: bool(events.failures) or events.durable[-1:] == [last])
        (_first, _last, exc) = events.failures[0]
        assert exc.errno == errno.ENOSPC
        assert wal.failed
        durable = events.durable[-1]
        # 2. every record has been consumed and settled: the state is small, but a
        #    checkpoint still does not fit next to the full log without the reserve
        lsn = wal.last_lsn
        snapshot = [(0, b"state" * 1000)] * 20  # 100 kB
        info = await trio.to_thread.run_sync(lambda: write_checkpoint(data_dir, lsn, snapshot, fs=fs))
        assert info.lsn == lsn
        assert not reserve.exists()  # the checkpoint needed it
        # 3. the log is synced (probing at once) and the segments it covers go
        await wal.sync()
        assert not wal.failed
        removed = wal.release_through(lsn)
        assert len(removed) >= 2
        # 4. writing goes on, and the reserve is back
        after = wal.append_nowait([(1, b"after")])
        await events.wait_for(lambda: events.durable[-1] >= after)
        await eventually(reserve.exists)
        assert durable < after
    recovery = recover(data_dir, fs=fs)
    assert recovery.checkpoint_lsn == lsn
    records = list(recovery.wal_records)
    assert [(lsn, payload) for lsn, _, payload in records] == [(after, b"after")]


async def test_a_full_simulated_disk_is_survived(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    data_dir = tmp_path / "data"
    disk.makedirs(str(data_dir / "wal"))
    disk.sync_dir(str(data_dir))
    disk.capacity_bytes = 600 * 1024
    await fill_checkpoint_release_and_go_on(
        data_dir, disk, record_bytes=1000, reserve_bytes=128 * 1024, segment_max_bytes=32 * 1024
    )


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs (needs the right to mount: root in this environment)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (not permitted?): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def test_a_full_tmpfs_is_survived(small_tmpfs: Path) -> None:
    await fill_checkpoint_release_and_go_on(
        small_tmpfs / "data",
        OS_FILE_SYSTEM,
        record_bytes=4000,
        reserve_bytes=2 << 20,
        segment_max_bytes=1 << 20,
    )

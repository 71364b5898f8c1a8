"""Every storage write and read site fails on demand (broker/storage/faults.py), and each
failure is survived: the WAL never reports a failed record durable and recovers when the
fault clears; a failed checkpoint leaves the previous one and the WAL usable; a failed
read back is reported as transient, and tried again."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from broker.storage import (
    WriteAheadLog,
    faults,
    read_latest_checkpoint,
    recover,
    write_checkpoint,
)
from broker.storage.checkpoint import checkpoint_name
from broker.storage.reader import ReadFailure
from broker.storage.segment import segment_name
from broker.storage.testing import SimulatedDisk
from tests.storage.walevents import Events, serving

RecoverAll = Callable[..., Any]




def payload_for(lsn: int) -> bytes:
    return b"fault-%d" % lsn


def batch(wal: WriteAheadLog, count: int) -> list[tuple[int, bytes]]:
    first = wal.last_lsn + 1
    return [(1, payload_for(lsn)) for lsn in range(first, first + count)]


def test_every_error_point_is_known_and_raises_its_errno() -> None:
    for name, err in faults.ERROR_POINTS.items():
        faults.activate(name, count=1)
        with pytest.raises(OSError) as info:
            faults.hit(name)
        assert info.value.errno == err and name in str(info.value)
        faults.hit(name)  # count spent
    assert faults.parse_spec("wal.write_enospc@2:3,reader.open_emfile") == {
        "wal.write_enospc": (2, 3),
        "reader.open_emfile": (0, None),
    }


# --------------------------------------------------------------------------- the WAL


WAL_POINTS = [
    ("wal.write_error", errno.EIO),
    ("wal.write_enospc", errno.ENOSPC),
    ("wal.fsync_error", errno.EIO),
    ("wal.fsync_enospc", errno.ENOSPC),
    ("wal.segment_create_error", errno.EIO),
    ("wal.segment_create_enospc", errno.ENOSPC),
]


@pytest.mark.parametrize("inline_max_records", [0, 8])
@pytest.mark.parametrize("point, err", WAL_POINTS)
async def test_a_failed_wal_write_is_never_durable_and_the_wal_recovers(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    recover_all: RecoverAll,
    point: str,
    err: int,
    inline_max_records: int,
) -> None:
    events = Events()
    # small segments: the failing batch starts a new one, so segment creation is on
    # its path too
    wal = WriteAheadLog(
        tmp_path, segment_max_bytes=200, retry_interval_s=1.0,
        inline_max_records=inline_max_records, **events.callbacks(),
    )
    async with serving(wal):
        for _ in range(4):
            await events.wait_durable(wal.append_nowait(batch(wal, 2)))
        good = wal.last_lsn
        assert len(os.listdir(tmp_path / "wal")) >= 2
        # the fault fails the batch, and (segment creation) the first probe too
        faults.activate(point, count=2 if "segment_create" in point else 1)
        failed_first, failed_last = good + 1, wal.append_nowait(batch(wal, 30))
        await events.wait_for(lambda: bool(events.failures))
        first, last, exc = events.failures[0]
        assert (first, last) == (failed_first, failed_last)
        assert exc.errno == err
        assert events.durable[-1] == good
        assert wal.failed
        # while failed: failed at once, nothing written
        wal.append_nowait(batch(wal, 1))
        await events.wait_for(lambda: len(events.failures) == 2)
        started = trio.current_time()
        await events.wait_for(lambda: events.recovered == 1)
        if "segment_create" in point:
            assert trio.current_time() - started >= 1.0  # a probe failed, and was retried
        assert not wal.failed
        after = wal.append_nowait(batch(wal, 3))
        await events.wait_durable(after)
    durable = set(range(1, good + 1)) | set(range(after - 2, after + 1))
    assert all(lsn in durable for lsn in events.durable)
    recovery, records = recover_all(tmp_path)
    assert [lsn for lsn, _, _ in records] == sorted(durable)
    assert all(payload == payload_for(lsn) for lsn, _, payload in records)
    assert recovery.next_lsn == after + 1


async def test_a_failed_fsync_under_a_relaxed_policy_loses_nothing_written(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, recover_all: RecoverAll
) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, fsync_policy="interval=100", **events.callbacks())
    async with serving(wal):
        await events.wait_durable(wal.append_nowait(batch(wal, 2)))
        faults.activate("wal.fsync_enospc", count=1)
        last = wal.append_nowait(batch(wal, 2))
        await events.wait_durable(last)  # reported after the write
        await events.wait_for(lambda: events.recovered == 1)  # the tick's fsync failed
        assert events.failures == []
        more = wal.append_nowait(batch(wal, 2))
        await events.wait_durable(more)
    _, records = recover_all(tmp_path)
    assert [lsn for lsn, _, _ in records] == list(range(1, more + 1))


async def test_a_refused_preallocation_only_costs_the_saving(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, segment_max_bytes=400, **events.callbacks())
    faults.activate("wal.preallocate_enospc")  # every time
    async with serving(wal):
        for _ in range(10):
            await events.wait_durable(wal.append_nowait(batch(wal, 3)))
            active = wal.statistics().active_segment
            assert active is not None
            # no space reserved ahead: the file ends with its last record
            assert Path(active).read_bytes().endswith(payload_for(wal.last_lsn))
    assert events.failures == []
    assert "wal.preallocate_enospc" in faults.active()
    _, records = recover_all(tmp_path)
    assert [lsn for lsn, _, _ in records] == list(range(1, 31))


# --------------------------------------------------------------------------- checkpoints


CHECKPOINT_POINTS = [
    ("checkpoint.write_error", errno.EIO, 0),
    ("checkpoint.write_enospc", errno.ENOSPC, 0),  # the header
    ("checkpoint.write_enospc", errno.ENOSPC, 1),  # the records
    ("checkpoint.write_enospc", errno.ENOSPC, 2),  # the trailer
    ("checkpoint.fsync_error", errno.EIO, 0),
    ("checkpoint.fsync_enospc", errno.ENOSPC, 0),
    ("checkpoint.rename_error", errno.EIO, 0),
    ("checkpoint.rename_enospc", errno.ENOSPC, 0),
    ("checkpoint.dir_fsync_error", errno.EIO, 0),
    ("checkpoint.dir_fsync_enospc", errno.ENOSPC, 0),
]


def state(upto: int) -> list[tuple[int, bytes]]:
    return [(0, b"state-%d" % n) for n in range(1, upto + 1)]


@pytest.mark.parametrize("power_loss", [False, True])
@pytest.mark.parametrize("point, err, skip", CHECKPOINT_POINTS)
async def test_a_failed_checkpoint_leaves_the_previous_one_and_the_wal_usable(
    tmp_path: Path, recover_all: RecoverAll, point: str, err: int, skip: int, power_loss: bool
) -> None:
    disk = SimulatedDisk()
    wal = WriteAheadLog(tmp_path, fs=disk)
    async with serving(wal):
        wal.append_nowait(batch(wal, 10))
        await wal.sync()
        await trio.to_thread.run_sync(lambda: write_checkpoint(tmp_path, 5, state(5), fs=disk))
        wal.release_through(5)
        faults.activate(point, skip=skip, count=1)
        with pytest.raises(OSError) as info:
            await trio.to_thread.run_sync(lambda: write_checkpoint(tmp_path, 10, state(10), fs=disk))
        assert info.value.errno == err
        assert not faults.active()  # the point was reached
        names = sorted(os.listdir(tmp_path / "checkpoint"))
        assert not [name for name in names if name.endswith(".tmp")]
        assert checkpoint_name(5) in names  # the previous checkpoint is still there
        # the WAL goes on, and the broker would take the next checkpoint later
        wal.append_nowait(batch(wal, 3))
        await wal.sync()
    if power_loss:
        disk.lose_power()
    loaded = read_latest_checkpoint(tmp_path)
    assert loaded is not None and loaded.lsn in (5, 10)
    recovery, records = recover_all(tmp_path)
    checkpoint_lsn = recovery.checkpoint_lsn
    # every record after the checkpoint that was read is in the log: nothing is missing
    assert [lsn for lsn, _, _ in records] == list(range(checkpoint_lsn + 1, 14))
    wal = WriteAheadLog.open(recovery)
    wal.append_nowait([(1, payload_for(14))])
    await wal.aclose()
    write_checkpoint(tmp_path, 14, state(14))  # and checkpoints work again
    recovery, records = recover_all(tmp_path)
    assert recovery.checkpoint_lsn == 14 and records == []


# --------------------------------------------------------------------------- reading back


async def written(tmp_path: Path, count: int = 40) -> Any:
    """A log of ``count`` records in a few segments; the recovery that read it back."""
    async with trio.open_nursery() as nursery:
        wal = WriteAheadLog(tmp_path, segment_max_bytes=300)
        await nursery.start(wal.serve)
        for lsn in range(1, count + 1, 4):
            wal.append_nowait([(1, payload_for(n)) for n in range(lsn, lsn + 4)])
            await wal.sync()
        await wal.aclose()
    recovery = recover(tmp_path)
    for _ in recovery.wal_records:
        pass
    return recovery


@pytest.mark.parametrize("point, err", [("reader.open_emfile", errno.EMFILE), ("reader.read_error", errno.EIO)])
async def test_an_os_error_reading_back_is_transient_and_tried_again(
    tmp_path: Path, point: str, err: int
) -> None:
    recovery = await written(tmp_path)
    reader = recovery.reader
    if point == "reader.read_error":
        assert reader.read([1]) == [(1, payload_for(1))]  # the handle is open and cached
    faults.activate(point, count=1)
    first, second, other = reader.read([2, 3, 40])
    for failure in (first, second):
        assert isinstance(failure, ReadFailure) and failure.transient
        assert os.strerror(err) in failure.reason and segment_name(1) in failure
    assert other == (1, payload_for(40))  # another segment
    # nothing remembered: the next read opens (or reads) again
    assert reader.read([2, 3]) == [(1, payload_for(2)), (1, payload_for(3))]
    reader.close()


async def test_unreadable_content_is_not_transient(tmp_path: Path) -> None:
    recovery = await written(tmp_path)
    reader = recovery.reader
    segments = sorted((tmp_path / "wal").glob("*.wal"))
    # a damaged frame in the first segment, the second segment gone, a record in none
    data = bytearray(segments[0].read_bytes())
    data[-3] ^= 0xFF
    segments[0].write_bytes(bytes(data))
    first_of_second = int(segments[1].name.split(".")[0], 16)
    segments[1].unlink()
    last_of_first = first_of_second - 1
    damaged, gone, nowhere = reader.read([last_of_first, first_of_second, 999])
    for failure, words in ((damaged, "CRC"), (gone, "cannot be opened"), (nowhere, "no WAL segment")):
        assert isinstance(failure, ReadFailure) and not failure.transient, failure
        assert words in failure
    reader.close()


def test_a_read_failure_is_an_immutable_string_with_a_flag() -> None:
    failure = ReadFailure("the disk said no", transient=True)
    assert failure == "the disk said no" and failure.reason == "the disk said no"
    assert failure.transient and repr(failure) == "ReadFailure('the disk said no', transient=True)"
    with pytest.raises(AttributeError):
        failure.transient = False  # type: ignore[misc]

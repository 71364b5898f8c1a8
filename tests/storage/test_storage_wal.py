"""The write-ahead log: LSNs, group commit, fsync policies, segments, failures."""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from broker.storage import (
    FsyncPolicy,
    InvalidConfiguration,
    RecordTooLarge,
    RecoveryNotFinished,
    StorageError,
    WALClosed,
    WALFailed,
    WriteAheadLog,
    faults,
    open_wal,
    parse_fsync_policy,
    recover,
    write_checkpoint,
)
from broker.storage.framing import FRAME_OVERHEAD_BYTES
from broker.storage.group import GROUP_HEADER_BYTES
from broker.storage.segment import (
    SEGMENT_HEADER_BYTES,
    decode_segment_header,
    parse_segment_name,
)
from broker.storage.testing import SimulatedCrash, SimulatedDisk
from tests.storage.walevents import Events, serving

RecoverAll = Callable[..., Any]




def wal_dir(data_dir: Path) -> Path:
    return data_dir / "wal"


def payload_for(lsn: int) -> bytes:
    return b"record-%d" % lsn


async def append_numbered(wal: WriteAheadLog, count: int, rtype: int = 1) -> int:
    first = wal.last_lsn + 1
    return wal.append_nowait([(rtype, payload_for(lsn)) for lsn in range(first, first + count)])


# --------------------------------------------------------------------------- basics


# inline_max_records: 0 writes every batch in a worker thread; 8 writes these small
# batches on the event loop thread. Both must behave the same.
@pytest.mark.parametrize("inline_max_records", [0, 8])
async def test_append_assigns_consecutive_lsns_and_reports_them_durable(
    tmp_path: Path, recover_all: RecoverAll, inline_max_records: int
) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, inline_max_records=inline_max_records, **events.callbacks())
    async with serving(wal):
        assert wal.append_nowait([(1, b"a")]) == 1
        assert wal.append_nowait([(2, b"b"), (3, b"c")]) == 3
        assert wal.append_nowait([]) == 3
        await events.wait_durable(3)
        assert wal.append_nowait([(4, b"d")]) == 4
    assert events.durable[-1] == 4
    assert events.durable == sorted(events.durable)
    stats = wal.statistics()
    assert stats.records_written == 4
    assert stats.last_durable_lsn == stats.last_synced_lsn == 4
    assert stats.buffered_records == 0
    assert all(d >= 0 for d in events.fsync_durations)
    assert len(events.fsync_durations) == stats.fsyncs
    _, records = recover_all(tmp_path)
    assert records == [(1, 1, b"a"), (2, 2, b"b"), (3, 3, b"c"), (4, 4, b"d")]


def _record_io_threads(wal: WriteAheadLog) -> list[threading.Thread]:
    """The thread each batch's write (and fsync) ran on, in order, from now on."""
    threads: list[threading.Thread] = []
    io_write = wal._committer._io_write

    def recording_io_write(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return io_write(*args)

    wal._committer._io_write = recording_io_write  # type: ignore[method-assign]
    return threads


@pytest.mark.parametrize("allowed", [True, False])
async def test_inline_allowed_decides_whether_a_small_batch_stays_on_the_event_loop(
    tmp_path: Path, recover_all: RecoverAll, allowed: bool
) -> None:
    """A small batch is written on the event loop's thread only while the owner's
    ``inline_allowed()`` says yes (it is asked once a batch); else in a worker thread."""
    asked: list[bool] = []

    def inline_allowed() -> bool:
        asked.append(allowed)
        return allowed

    events = Events()
    wal = WriteAheadLog(tmp_path, inline_max_records=8, inline_allowed=inline_allowed, **events.callbacks())
    threads = _record_io_threads(wal)
    async with serving(wal):
        for lsn, payload in enumerate([b"a", b"b", b"c"], start=1):
            wal.append_nowait([(1, payload)])
            await events.wait_durable(lsn)
    # (the first batch opens the first segment, which is never done inline: not asked)
    assert asked == [allowed, allowed]
    on_loop = [t is threading.main_thread() for t in threads]
    assert on_loop == [False, allowed, allowed]
    _, records = recover_all(tmp_path)
    assert [r[2] for r in records] == [b"a", b"b", b"c"]


async def test_a_small_batch_that_is_not_fsynced_is_written_on_the_event_loop(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    """A batch of lazy records (nothing waits for its fsync) of at most
    ``inline_write_max_bytes`` is written on the event loop's thread even while
    ``inline_allowed()`` says no; a batch to be fsynced, or a bigger one, goes to a
    worker thread."""
    events = Events()
    wal = WriteAheadLog(
        tmp_path, inline_max_records=8, inline_allowed=lambda: False, inline_write_max_bytes=1024,
        **events.callbacks(),
    )
    threads = _record_io_threads(wal)
    async with serving(wal):
        wal.append_nowait([(1, b"first")])  # opens the first segment: never inline
        await events.wait_durable(1)
        wal.append_nowait([(1, b"lazy")], lazy=True)
        await events.wait_durable(2)
        wal.append_nowait([(1, b"x" * 2000)], lazy=True)  # over inline_write_max_bytes
        await events.wait_durable(3)
        wal.append_nowait([(1, b"synced")])
        await events.wait_durable(4)
    on_loop = [t is threading.main_thread() for t in threads[:4]]
    assert on_loop == [False, True, False, False]
    _, records = recover_all(tmp_path)
    assert [r[2] for r in records] == [b"first", b"lazy", b"x" * 2000, b"synced"]


async def test_bad_records_are_rejected_whole_and_assign_no_lsn(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, max_record_bytes=100)
    with pytest.raises(ValueError):
        wal.append_nowait([(1, b"ok"), (300, b"bad type")])
    with pytest.raises(RecordTooLarge):
        wal.append_nowait([(1, b"ok"), (1, b"x" * 100)])
    assert wal.last_lsn == 0
    assert wal.statistics().buffered_records == 0
    await wal.aclose()


async def test_aclose_flushes_without_a_writer_task_and_then_refuses_appends(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, **events.callbacks())
    wal.append_nowait([(1, b"buffered")])
    await wal.aclose()
    assert events.durable == [1]
    with pytest.raises(WALClosed):
        wal.append_nowait([(1, b"late")])
    with pytest.raises(WALClosed):
        await wal.serve()
    await wal.aclose()  # idempotent
    _, records = recover_all(tmp_path)
    assert records == [(1, 1, b"buffered")]


async def test_serve_twice_is_an_error(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    async with serving(wal):
        with pytest.raises(RuntimeError):
            await wal.serve()


async def test_cancelled_writer_loses_nothing(tmp_path: Path, recover_all: RecoverAll) -> None:
    wal = WriteAheadLog(tmp_path)
    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await wal.serve()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        # Hold the WAL's IO slot so the writer takes the batch, then blocks before its
        # worker thread starts: the cancellation lands exactly there.
        async with wal._committer.limiter:
            wal.append_nowait([(1, b"a"), (1, b"b")])
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
    assert wal.statistics().buffered_records == 2
    await wal.aclose()
    _, records = recover_all(tmp_path)
    assert [lsn for lsn, _, _ in records] == [1, 2]


async def test_open_wal_context_manager(tmp_path: Path, recover_all: RecoverAll) -> None:
    events = Events()
    recovery, _ = recover_all(tmp_path)
    async with open_wal(recovery, **events.callbacks()) as wal:
        wal.append_nowait([(9, b"x")])
        await events.wait_durable(1)
    _, records = recover_all(tmp_path)
    assert records == [(1, 9, b"x")]


# --------------------------------------------------------------------------- group commit


async def test_records_arriving_during_an_fsync_share_the_next_fsync(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    entered = threading.Event()
    release = threading.Event()

    def slow_fsync(path: str) -> None:
        if path.endswith(".wal") and not release.is_set():  # data fsyncs, not headers
            entered.set()
            release.wait()

    disk.sync_hook = slow_fsync
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, **events.callbacks())
    async with serving(wal):
        assert wal.append_nowait([(1, b"first")]) == 1
        assert await trio.to_thread.run_sync(entered.wait, 60.0)  # a hang guard only
        for n in range(100):
            assert wal.append_nowait([(1, b"during %d" % n)]) == n + 2
        assert wal.statistics().buffered_records == 100
        release.set()
        await events.wait_durable(101)
    assert events.durable == [1, 101]
    stats = wal.statistics()
    assert stats.fsyncs == 2
    assert stats.records_written == 101
    assert disk.stats.writes == 3  # segment header, then one write per batch


async def test_one_write_call_per_batch(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    wal = WriteAheadLog(tmp_path, fs=disk)
    async with trio.open_nursery() as nursery:
        for n in range(50):
            wal.append_nowait([(1, b"r%d" % n), (2, b"s%d" % n)])
        writes_before = disk.stats.writes
        await nursery.start(wal.serve)
        await wal.sync()
        # header of the new segment + one write for all 100 records
        assert disk.stats.writes - writes_before == 2
        await wal.aclose()
    assert wal.statistics().records_written == 100


# --------------------------------------------------------------------------- policies


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("always", FsyncPolicy.always()),
        ("never", FsyncPolicy.never()),
        (" Interval = 50 ", FsyncPolicy.every(50)),
        ("interval=1", FsyncPolicy("interval", 1)),
        (25, FsyncPolicy.every(25)),
    ],
)
def test_parse_fsync_policy(text: str | int, expected: FsyncPolicy) -> None:
    policy = parse_fsync_policy(text)
    assert policy == expected
    assert parse_fsync_policy(str(policy)) == policy


@pytest.mark.parametrize(
    "text", ["sometimes", "interval", "interval=", "interval=0", "interval=-5", "interval=1.5", ""]
)
def test_parse_fsync_policy_rejects_with_a_clear_message(text: str) -> None:
    with pytest.raises(ValueError, match="always.*never.*interval=<ms>") as info:
        parse_fsync_policy(text)
    assert isinstance(info.value, InvalidConfiguration)
    assert repr(text) in str(info.value)


async def test_interval_policy_reports_after_write_and_fsyncs_on_the_interval(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, fsync_policy="interval=50", **events.callbacks())
    async with serving(wal):
        wal.append_nowait([(1, b"a")])
        await events.wait_durable(1)
        assert wal.statistics().fsyncs == 1  # nothing synced for 50 ms: sync now
        wal.append_nowait([(1, b"b")])
        await events.wait_durable(2)
        wal.append_nowait([(1, b"c")])
        await events.wait_durable(3)
        stats = wal.statistics()
        assert (stats.fsyncs, stats.last_synced_lsn, stats.last_durable_lsn) == (1, 1, 3)
        mock_clock.jump(0.049)
        await trio.testing.wait_all_tasks_blocked()
        assert wal.statistics().fsyncs == 1
        mock_clock.jump(0.001)
        await events.wait_for(lambda: wal.statistics().fsyncs == 2)
        assert wal.statistics().last_synced_lsn == 3


async def test_never_policy_fsyncs_only_when_asked(tmp_path: Path) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, fsync_policy="never", **events.callbacks())
    async with serving(wal):
        for _ in range(5):
            last = await append_numbered(wal, 3)
            await events.wait_durable(last)
        stats = wal.statistics()
        assert (stats.fsyncs, stats.last_synced_lsn, stats.last_durable_lsn) == (0, 0, 15)
        assert await wal.sync() == 15
        assert wal.statistics().fsyncs == 1
        assert await wal.sync() == 15  # nothing new: no fsync
        assert wal.statistics().fsyncs == 1
        await append_numbered(wal, 1)
    assert wal.statistics().fsyncs == 2  # close fsyncs
    assert wal.statistics().last_synced_lsn == 16


async def lose_power_after(tmp_path: Path, *, synced: int, written: int) -> tuple[SimulatedDisk, Events, int]:
    """Under fsync 'never': append ``synced`` records and sync, then ``written`` more
    (reported durable, not fsynced), then lose power. Returns the disk, the callbacks
    seen and the LSN sync() answered (0 if none)."""
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, fsync_policy="never", **events.callbacks())
    synced_lsn = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        if synced:
            await append_numbered(wal, synced)
            synced_lsn = await wal.sync()
        await events.wait_durable(await append_numbered(wal, written))
        disk.lose_power()
        nursery.cancel_scope.cancel()
    return disk, events, synced_lsn


async def test_never_policy_loses_unsynced_records_on_power_loss(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    """Documents why 'never' is unsafe: acknowledged records vanish with the power."""
    disk, events, _ = await lose_power_after(tmp_path, synced=0, written=5)
    _, records = recover_all(tmp_path, fs=disk)
    assert records == []
    assert events.durable[-1] == 5


# --------------------------------------------------------------------------- lazy records


@pytest.mark.parametrize("inline_max_records", [0, 8])
async def test_lazy_records_alone_are_written_without_an_fsync_then_synced_in_time(
    tmp_path: Path, mock_clock: trio.testing.MockClock, inline_max_records: int
) -> None:
    """Under "always", a batch of only lazy records (acks) is reported after its write;
    the fsync follows within lazy_sync_s, counted from the first unsynced write."""
    events = Events()
    disk = SimulatedDisk()
    synced_at: list[float] = []  # when each fsync of a segment began, on the mock clock

    def note_sync(path: str) -> None:
        if path.endswith(".wal"):
            synced_at.append(mock_clock.current_time())

    disk.sync_hook = note_sync
    wal = WriteAheadLog(
        tmp_path, fs=disk, lazy_sync_s=0.2, inline_max_records=inline_max_records, **events.callbacks()
    )
    async def settle() -> None:
        """Give the writer real time to start any fsync it wrongly thinks is due (the
        mock clock stands still meanwhile; an fsync runs in a thread)."""
        await trio.testing.wait_all_tasks_blocked()
        await trio.to_thread.run_sync(time.sleep, 0.05)

    async with serving(wal):
        await events.wait_durable(await append_numbered(wal, 1))
        mock_clock.jump(10)  # long after that fsync
        await events.wait_durable(wal.append_nowait([(8, b"ack 1")], lazy=True))
        stats = wal.statistics()
        assert (stats.last_synced_lsn, stats.last_durable_lsn) == (1, 2)
        await settle()
        mock_clock.jump(0.15)
        await events.wait_durable(wal.append_nowait([(8, b"ack 2")], lazy=True))
        mock_clock.jump(0.049)
        await settle()
        assert synced_at == [0.0]
        mock_clock.jump(0.001)  # 0.2 s after the first unsynced write, not the second
        await events.wait_for(lambda: wal.statistics().fsyncs == 2)
        assert wal.statistics().last_synced_lsn == 3
        mock_clock.jump(10)
        await settle()
        assert synced_at == [0.0, 10.2]  # nothing unsynced since: no more fsyncs


async def test_a_record_with_a_waiter_syncs_the_lazy_ones_before_it(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, lazy_sync_s=3600, **events.callbacks())
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        await events.wait_durable(wal.append_nowait([(8, b"ack 1")], lazy=True))
        await events.wait_durable(wal.append_nowait([(8, b"ack 2")], lazy=True))
        assert wal.statistics().fsyncs == 0
        # a lazy and a waited-for record in one batch: the batch is fsynced
        wal.append_nowait([(8, b"ack 3")], lazy=True)
        await events.wait_durable(wal.append_nowait([(7, b"publish")]))
        stats = wal.statistics()
        assert (stats.fsyncs, stats.last_synced_lsn) == (1, 4)
        await events.wait_durable(wal.append_nowait([(8, b"ack 4")], lazy=True))
        disk.lose_power()
        nursery.cancel_scope.cancel()
    _, records = recover_all(tmp_path, fs=disk)
    # the lazy record after the last fsync is gone with the power; none before it
    assert records == [(1, 8, b"ack 1"), (2, 8, b"ack 2"), (3, 8, b"ack 3"), (4, 7, b"publish")]


async def test_lazy_records_are_synced_by_sync_and_close(tmp_path: Path) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, lazy_sync_s=3600, **events.callbacks())
    async with serving(wal):
        await events.wait_durable(wal.append_nowait([(8, b"ack")], lazy=True))
        assert wal.statistics().fsyncs == 0
        assert await wal.sync() == 1
        assert wal.statistics().fsyncs == 1
        await events.wait_durable(wal.append_nowait([(8, b"ack")], lazy=True))
    stats = wal.statistics()
    assert (stats.fsyncs, stats.last_synced_lsn) == (2, 2)


# --------------------------------------------------------------------------- segments


def segment_firsts(data_dir: Path) -> list[int]:
    return sorted(
        first
        for name in os.listdir(wal_dir(data_dir))
        if (first := parse_segment_name(name)) is not None
    )


def records_in_segment(path: Path) -> int:
    """Records in a segment: the counts of its write groups (docs/durability.md)."""
    data = path.read_bytes()
    pos, count = SEGMENT_HEADER_BYTES, 0
    while pos < len(data):
        (length, magic, records) = struct.unpack_from("<I4sI", data, pos)
        assert magic == b"AKGR"
        pos += 8 + length
        count += records
    return count


async def test_lsns_continue_across_rollover_and_reopen(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, segment_max_bytes=200, **events.callbacks())
    async with serving(wal):
        for n in range(1, 51):
            first = wal.last_lsn + 1
            assert wal.append_nowait([(n % 256, payload_for(first))]) == n
            if n % 3 == 0:
                await events.wait_durable(n)
    firsts = segment_firsts(tmp_path)
    assert len(firsts) > 3
    assert firsts[0] == 1
    for first, following in zip(firsts, firsts[1:]):
        path = wal_dir(tmp_path) / f"{first:016x}.wal"
        assert decode_segment_header(path.read_bytes()).first_lsn == first
        assert first + records_in_segment(path) == following
        assert path.stat().st_size <= 200 or records_in_segment(path) == 1

    recovery, records = recover_all(tmp_path)
    assert [(lsn, payload) for lsn, _, payload in records] == [
        (n, payload_for(n)) for n in range(1, 51)
    ]
    assert recovery.next_lsn == 51

    wal = WriteAheadLog.open(recovery, segment_max_bytes=200)
    async with serving(wal):
        assert await append_numbered(wal, 10) == 60
    recovery, records = recover_all(tmp_path)
    assert [lsn for lsn, _, _ in records] == list(range(1, 61))
    assert all(payload == payload_for(lsn) for lsn, _, payload in records)
    assert recovery.next_lsn == 61


async def test_a_batch_larger_than_a_segment_gets_a_segment_of_its_own(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    wal = WriteAheadLog(tmp_path, segment_max_bytes=100)
    wal.append_nowait([(1, b"x" * 500)])
    wal.append_nowait([(1, b"y")])
    await wal.aclose()
    _, records = recover_all(tmp_path)
    assert [p[:1] for _, _, p in records] == [b"x", b"y"]


async def test_release_through_deletes_only_fully_covered_segments(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, segment_max_bytes=150, **events.callbacks())
    async with serving(wal):
        for _ in range(30):
            await events.wait_durable(await append_numbered(wal, 2))
        firsts = segment_firsts(tmp_path)
        assert len(firsts) >= 5
        assert wal.statistics().segments == len(firsts)

        # One LSN short of covering segment 1 entirely: only segment 0 goes.
        removed = wal.release_through(firsts[2] - 2)
        assert [os.path.basename(p) for p in removed] == [f"{firsts[0]:016x}.wal"]
        assert segment_firsts(tmp_path) == firsts[1:]
        assert wal.release_through(firsts[2] - 2) == []

        removed = wal.release_through(firsts[2] - 1)
        assert len(removed) == 1
        assert segment_firsts(tmp_path) == firsts[2:]

        # Everything covered: the active (last) segment still stays.
        wal.release_through(10**9)
        assert segment_firsts(tmp_path) == firsts[-1:]
        assert wal.statistics().segments == 1

        # A checkpoint covering what was released makes recovery whole again.
        write_checkpoint(tmp_path, wal.last_lsn, [(0, b"state")])
        await events.wait_durable(await append_numbered(wal, 3))
    recovery, records = recover_all(tmp_path)
    assert recovery.checkpoint_lsn == 60
    assert [lsn for lsn, _, _ in records] == [61, 62, 63]


# --------------------------------------------------------------------------- opening


async def test_open_requires_a_finished_recovery(tmp_path: Path) -> None:
    recovery = recover(tmp_path)
    with pytest.raises(RecoveryNotFinished):
        WriteAheadLog.open(recovery)


async def test_refuses_to_append_over_existing_records(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.append_nowait([(1, b"a"), (1, b"b")])
    await wal.aclose()
    with pytest.raises(StorageError, match="recover"):
        WriteAheadLog(tmp_path, next_lsn=1)
    with pytest.raises(InvalidConfiguration):
        WriteAheadLog(tmp_path, next_lsn=0)
    WriteAheadLog(tmp_path, next_lsn=3)  # fine: after the existing records


@pytest.mark.parametrize(
    "options",
    [
        {"segment_max_bytes": 10},
        {"retry_interval_s": 0},
        {"lazy_sync_s": 0},
        {"max_record_bytes": 0},
        {"fsync_policy": "bogus"},
    ],
)
def test_invalid_configuration(tmp_path: Path, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidConfiguration):
        WriteAheadLog(tmp_path, **options)


async def test_an_empty_segment_left_by_a_crash_is_replaced(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    disk = SimulatedDisk()
    faults.set_kill_handler(disk.kill_handler)
    faults.activate("wal.after_segment_create", skip=1, count=1)  # crash creating segment 2
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, segment_max_bytes=100, **events.callbacks())
    with pytest.raises(BaseExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            await nursery.start(wal.serve)
            wal.append_nowait([(1, b"x" * 60)])
            await events.wait_durable(1)
            wal.append_nowait([(1, b"y" * 60)])
            await trio.sleep_forever()
    assert info.group_contains(SimulatedCrash)
    disk.crash_process()
    assert segment_firsts(tmp_path) == [1, 2]

    recovery, records = recover_all(tmp_path, fs=disk)
    assert [lsn for lsn, _, _ in records] == [1]
    assert recovery.next_lsn == 2
    assert str(wal_dir(tmp_path) / f"{2:016x}.wal") in recovery.report.removed_files
    wal = WriteAheadLog.open(recovery)
    wal.append_nowait([(1, b"z")])
    await wal.aclose()
    assert segment_firsts(tmp_path) == [1, 2]
    _, records = recover_all(tmp_path)
    assert [(lsn, p) for lsn, _, p in records] == [(1, b"x" * 60), (2, b"z")]


async def test_an_empty_segment_named_by_next_lsn_is_appended_to(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    from broker.storage.segment import SegmentHeader, encode_segment_header

    wal = WriteAheadLog(tmp_path)
    wal.append_nowait([(1, b"a"), (1, b"b")])
    await wal.aclose()
    empty = wal_dir(tmp_path) / f"{3:016x}.wal"
    empty.write_bytes(encode_segment_header(SegmentHeader(3)))
    wal = WriteAheadLog(tmp_path, next_lsn=3)
    assert wal.append_nowait([(1, b"c")]) == 3
    await wal.aclose()
    assert segment_firsts(tmp_path) == [1, 3]
    assert empty.stat().st_size > SEGMENT_HEADER_BYTES
    _, records = recover_all(tmp_path)
    assert [lsn for lsn, _, _ in records] == [1, 2, 3]


async def test_a_crash_right_after_a_failure_probe_continues_without_a_gap(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, recover_all: RecoverAll
) -> None:
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, **events.callbacks())
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        wal.append_nowait([(1, b"one")])
        await events.wait_durable(1)
        disk.fail_syncs(1)
        disk.fail_truncates(1)  # and the failed batch stays on disk
        wal.append_nowait([(1, b"failed-2"), (1, b"failed-3")])
        await events.wait_for(lambda: events.recovered == 1)
        assert segment_firsts(tmp_path) == [1, 4]  # the probe segment, void from LSN 2
        nursery.cancel_scope.cancel()
    disk.crash_process()

    recovery, records = recover_all(tmp_path, fs=disk)
    assert [(lsn, p) for lsn, _, p in records] == [(1, b"one")]
    assert [v.first_lsn for v in recovery.report.voided] == [2]
    assert recovery.next_lsn == 2  # the core's counter continues from the last record
    assert segment_firsts(tmp_path) == [1]
    wal = WriteAheadLog.open(recovery)
    wal.append_nowait([(1, b"two")])
    await wal.aclose()
    _, records = recover_all(tmp_path)
    assert [(lsn, p) for lsn, _, p in records] == [(1, b"one"), (2, b"two")]


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("inline_max_records", [0, 8])
@pytest.mark.parametrize("mechanism", ["disk", "fault-point"])
async def test_fsync_failure_fails_the_batch_then_probes_and_recovers(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    recover_all: RecoverAll,
    mechanism: str,
    inline_max_records: int,
) -> None:
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(
        tmp_path, fs=disk, retry_interval_s=1.0, inline_max_records=inline_max_records,
        **events.callbacks(),
    )
    async with serving(wal):
        wal.append_nowait([(1, b"ok-1")])
        await events.wait_durable(1)
        if mechanism == "disk":
            disk.fail_syncs(1)
        else:
            faults.activate("wal.fsync_error", count=1)
        assert wal.append_nowait([(1, b"bad-2"), (1, b"bad-3")]) == 3
        await events.wait_for(lambda: bool(events.failures))
        first, last, exc = events.failures[0]
        assert (first, last) == (2, 3)
        assert isinstance(exc, OSError) and exc.errno == errno.EIO
        assert events.durable == [1]
        assert wal.failed and wal.statistics().failed
        written = wal.statistics().bytes_written

        # While failed, batches fail at once and are not written.
        assert wal.append_nowait([(1, b"bad-4")]) == 4
        await events.wait_for(lambda: len(events.failures) == 2)
        assert events.failures[1][:2] == (4, 4)
        assert wal.statistics().bytes_written == written
        with pytest.raises(WALFailed):
            await wal.sync()

        await events.wait_for(lambda: events.recovered == 1)  # after retry_interval_s
        assert not wal.failed
        assert wal.append_nowait([(1, b"ok-5")]) == 5
        await events.wait_durable(5)
    assert events.durable == [1, 5]
    recovery, records = recover_all(tmp_path)
    assert [(lsn, p) for lsn, _, p in records] == [(1, b"ok-1"), (5, b"ok-5")]
    assert recovery.next_lsn == 6
    assert recovery.report.truncated == ()


async def test_probe_keeps_retrying_until_the_disk_works(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, recover_all: RecoverAll
) -> None:
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, retry_interval_s=0.5, **events.callbacks())
    async with serving(wal):
        disk.fail_syncs(4)  # the batch, then three probes
        wal.append_nowait([(1, b"bad")])
        await events.wait_for(lambda: events.recovered == 1)
        assert trio.current_time() >= 4 * 0.5 - 1e-9
        wal.append_nowait([(1, b"good")])
        await events.wait_durable(2)
    _, records = recover_all(tmp_path)
    assert [(lsn, p) for lsn, _, p in records] == [(2, b"good")]


async def test_partial_write_failure_is_truncated_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, recover_all: RecoverAll
) -> None:
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, **events.callbacks())
    async with serving(wal):
        wal.append_nowait([(1, b"good")])
        await events.wait_durable(1)
        segment = wal_dir(tmp_path) / f"{1:016x}.wal"
        good_size = SEGMENT_HEADER_BYTES + GROUP_HEADER_BYTES + FRAME_OVERHEAD_BYTES + len(b"good")
        assert segment.stat().st_size > good_size  # preallocated
        disk.fail_writes(1)  # writes half the batch, then ENOSPC
        wal.append_nowait([(1, b"lost-%d" % n) for n in range(10)])
        await events.wait_for(lambda: bool(events.failures))
        assert events.failures[0][:2] == (2, 11)
        assert events.failures[0][2].errno == errno.ENOSPC
        assert segment.stat().st_size == good_size
        await events.wait_for(lambda: events.recovered == 1)
        wal.append_nowait([(1, b"after")])
        await events.wait_durable(12)
    recovery, records = recover_all(tmp_path)
    assert [(lsn, p) for lsn, _, p in records] == [(1, b"good"), (12, b"after")]
    assert recovery.report.voided == ()


async def test_failed_batch_left_on_disk_is_voided_at_recovery(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, recover_all: RecoverAll
) -> None:
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, **events.callbacks())
    async with serving(wal):
        wal.append_nowait([(1, b"good")])
        await events.wait_durable(1)
        disk.fail_syncs(1)
        disk.fail_truncates(1)  # the best-effort truncation fails too
        wal.append_nowait([(1, b"never-durable-%d" % n) for n in range(5)])
        await events.wait_for(lambda: events.recovered == 1)
        wal.append_nowait([(1, b"after")])
        await events.wait_durable(7)
    recovery, records = recover_all(tmp_path)
    assert [(lsn, p) for lsn, _, p in records] == [(1, b"good"), (7, b"after")]
    (voided,) = recovery.report.voided
    assert voided.first_lsn == 2
    assert voided.path.endswith(f"{1:016x}.wal")
    # the void region was truncated away: a second recovery has nothing to void
    recovery, records = recover_all(tmp_path)
    assert recovery.report.voided == ()
    assert [lsn for lsn, _, _ in records] == [1, 7]


async def test_failure_of_the_periodic_fsync_enters_the_failed_state(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, fsync_policy="interval=100", **events.callbacks())
    async with serving(wal):
        wal.append_nowait([(1, b"a")])
        await events.wait_durable(1)  # fsynced right away (first sync)
        disk.fail_syncs(1)
        wal.append_nowait([(1, b"b")])
        await events.wait_durable(2)  # reported after the write
        await events.wait_for(lambda: events.recovered == 1)  # tick fails, probe works
        assert events.failures == []
    assert "reported durable under fsync policy interval=100" in caplog.text


@pytest.mark.parametrize("inline_max_records", [0, 8])
async def test_tasks_woken_with_the_writer_run_before_its_write(
    tmp_path: Path, inline_max_records: int
) -> None:
    """The writer passes a schedule point (acquiring its IO lock) before taking a batch,
    so a task woken together with it (the channel writer sending the delivery the same
    publish made) runs before the write and fsync, which may hold the event loop (inline
    batches). trio runs a batch of woken tasks in random order: without that schedule
    point this fails about half the time (checked by removing it)."""
    order: list[str] = []

    events = Events()
    wal = WriteAheadLog(tmp_path, inline_max_records=inline_max_records, **events.callbacks())
    io_write = wal._committer._io_write

    def recording_io_write(*args: Any) -> Any:
        order.append("write")
        return io_write(*args)

    wal._committer._io_write = recording_io_write  # type: ignore[method-assign]
    async with serving(wal), trio.open_nursery() as nursery:
        await append_numbered(wal, 1)  # the first batch creates the segment
        await events.wait_durable(1)
        for round_ in range(20):
            woken = trio.Event()

            async def other(ev: trio.Event = woken, n: int = round_) -> None:
                await ev.wait()
                order.append(f"other-{n}")

            nursery.start_soon(other)
            await trio.testing.wait_all_tasks_blocked()
            last = await append_numbered(wal, 1)
            woken.set()
            await events.wait_durable(last)
    writes = [i for i, what in enumerate(order) if what == "write"]
    for n in range(20):
        assert order.index(f"other-{n}") < writes[n + 1], order


async def test_small_batches_are_written_on_the_loop_thread_and_large_ones_in_a_worker(
    tmp_path: Path,
) -> None:
    """docs/durability.md: a batch of at most ``inline_max_records`` records that fits
    the active segment skips the worker thread; bigger batches still use it."""
    writer_threads: list[bool] = []

    events = Events()
    wal = WriteAheadLog(tmp_path, inline_max_records=8, **events.callbacks())
    io_write = wal._committer._io_write

    def recording_io_write(*args: Any) -> Any:
        writer_threads.append(threading.current_thread() is threading.main_thread())
        return io_write(*args)

    wal._committer._io_write = recording_io_write  # type: ignore[method-assign]
    async with serving(wal):
        last = await append_numbered(wal, 1)  # creates the segment: always a worker
        await events.wait_durable(last)
        last = await append_numbered(wal, 8)
        await events.wait_durable(last)
        last = await append_numbered(wal, 9)
        await events.wait_durable(last)
    assert writer_threads == [False, True, False]


# --------------------------------------------------------------------------- preallocation


def logical_end(path: Path) -> int:
    """Where the frames of a segment end (the first all-zero header, or the file's end)."""
    data = path.read_bytes()
    pos = SEGMENT_HEADER_BYTES
    while pos + 8 <= len(data) and data[pos : pos + 8] != bytes(8):
        (length,) = struct.unpack_from("<I", data, pos)
        pos += 8 + length
    return pos


async def test_the_active_segment_is_written_into_preallocated_space(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    # The mechanism behind the cheaper fsync: batches overwrite reserved blocks and the
    # file's size changes once per step, not once per batch.
    step = 4096
    events = Events()
    wal = WriteAheadLog(tmp_path, preallocate_bytes=step, segment_max_bytes=1 << 20, **events.callbacks())
    segment = wal_dir(tmp_path) / f"{1:016x}.wal"
    sizes = []
    async with serving(wal):
        for _ in range(60):
            await events.wait_durable(await append_numbered(wal, 3))
            sizes.append(segment.stat().st_size)
            assert logical_end(segment) < sizes[-1]  # room reserved ahead of the frames
        end = logical_end(segment)
    assert len(set(sizes)) <= end // step + 1  # grew in steps
    assert sizes[0] == SEGMENT_HEADER_BYTES + step  # reserved when the segment was made
    assert segment.stat().st_size == end  # closing cut the reserve off
    _, records = recover_all(tmp_path)
    assert [p for _, _, p in records] == [payload_for(lsn) for lsn in range(1, 181)]


async def test_a_retired_segment_is_cut_back_to_its_records(tmp_path: Path) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, preallocate_bytes=1 << 20, segment_max_bytes=300, **events.callbacks())
    async with serving(wal):
        for _ in range(30):
            await events.wait_durable(await append_numbered(wal, 2))
        firsts = segment_firsts(tmp_path)
        assert len(firsts) > 2
        *retired, active = [wal_dir(tmp_path) / f"{first:016x}.wal" for first in firsts]
        for path in retired:
            assert path.stat().st_size == logical_end(path) <= 300
        # the reserve never takes a segment past its size limit
        assert logical_end(active) < active.stat().st_size <= 300


@pytest.mark.parametrize("inline_max_records", [0, 8])
async def test_a_crash_leaves_a_zero_tail_that_recovery_cuts_and_appending_continues(
    tmp_path: Path, recover_all: RecoverAll, inline_max_records: int
) -> None:
    disk = SimulatedDisk()
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, inline_max_records=inline_max_records, **events.callbacks())
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        await events.wait_durable(await append_numbered(wal, 5))
        disk.crash_process()
        nursery.cancel_scope.cancel()
    segment = wal_dir(tmp_path) / f"{1:016x}.wal"
    end = logical_end(segment)
    assert segment.stat().st_size > end  # the crash left the reserve behind
    recovery, records = recover_all(tmp_path, fs=disk)
    assert [lsn for lsn, _, _ in records] == [1, 2, 3, 4, 5]
    assert recovery.report.truncated == ()
    assert segment.stat().st_size == end
    wal = WriteAheadLog.open(recovery, inline_max_records=inline_max_records)
    async with serving(wal):
        await append_numbered(wal, 5)
    _, records = recover_all(tmp_path)
    assert [p for _, _, p in records] == [payload_for(lsn) for lsn in range(1, 11)]


async def test_power_loss_keeps_the_durable_records_of_a_preallocated_segment(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    _disk, _events, synced = await lose_power_after(tmp_path, synced=5, written=5)
    segment = wal_dir(tmp_path) / f"{1:016x}.wal"
    assert segment.stat().st_size > logical_end(segment)  # the reserve was durable
    _, records = recover_all(tmp_path)
    assert synced == 5
    assert [lsn for lsn, _, _ in records] == [1, 2, 3, 4, 5]


async def test_preallocation_refused_by_the_file_system_only_costs_the_saving(
    tmp_path: Path, recover_all: RecoverAll, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def refuse(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", refuse, raising=False)
    events = Events()
    wal = WriteAheadLog(tmp_path, segment_max_bytes=400, **events.callbacks())
    async with serving(wal):
        for _ in range(10):
            await events.wait_durable(await append_numbered(wal, 3))
    assert not events.failures
    firsts = segment_firsts(tmp_path)
    assert len(calls) == len(firsts) > 1  # asked once per segment, not per batch
    _, records = recover_all(tmp_path)
    assert [p for _, _, p in records] == [payload_for(lsn) for lsn in range(1, 31)]


async def test_preallocation_can_be_switched_off(tmp_path: Path) -> None:
    events = Events()
    wal = WriteAheadLog(tmp_path, preallocate_bytes=0, **events.callbacks())
    segment = wal_dir(tmp_path) / f"{1:016x}.wal"
    async with serving(wal):
        for _ in range(5):
            await events.wait_durable(await append_numbered(wal, 2))
            assert segment.stat().st_size == logical_end(segment)

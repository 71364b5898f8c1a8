"""What the runtime relies on from its log (``broker.runtime.LogPort``), checked on the
real write-ahead log and on the tests' stand-in (``tests/support/fakewal.py``) alike,
in the manner of trio's ``testing/_check_streams.py``: one suite, run against each
implementation, so a fake earns trust by passing the real thing's tests.

Three implementations run it: ``WriteAheadLog`` (on a ``SimulatedDisk``, so a power cut
can be simulated), ``FakeWAL`` making batches durable as it serves (``hold=False``), and
``FakeWAL`` holding durability until the test releases it (``hold=True``, the mode the
API tests use). Each comes with its "disk" (:class:`LogUnderTest`): how to let it catch
up, fail, heal and lose power. Durability is only ever observed through the public
interface: the ``on_durable``/``on_failure``/``on_recovered`` callbacks, ``sync`` and
``statistics``.

The rules, per ``LogPort`` member:

- ``append_nowait``: batches numbered one after another from 1; returns the batch's last
  LSN; lazy and ``together`` batches numbered like any other; an empty batch numbers
  nothing; a bad record (type, size) numbers nothing of its batch; refused after close.
- durability: reported through ``on_durable`` in increasing order, never past what was
  appended, through the last LSN once the disk catches up (lazy batches too).
- ``sync``: returns an LSN at least the last one appended before it, reported durable.
- ``reader``: reads back durable records by LSN; an LSN never written is a permanent
  ``ReadFailure``.
- ``active_first_lsn``: None before anything is written, then the first LSN written.
- ``statistics``: last LSN, last durable LSN, records written, nothing buffered after
  a sync, ``failed``.
- ``release_through``: never deletes the segment being appended to.
- ``want_reserve``: may be called any time.
- ``aclose``: writes what is buffered (reported durable); idempotent; then appends and
  syncs raise ``WALClosed``.
- failures: a failed disk reports through ``on_failure`` (never ``on_durable``) what
  it could not write; ``sync`` raises ``WALFailed``; once it heals, ``on_recovered``
  and appends are durable again.
- a power cut keeps every record ``sync`` returned, and what survives is a prefix.

The fake's own knobs (holding durability, releasing it in steps) are tested at the end.
"""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from broker.storage import RecordTooLarge, WALClosed, WALFailed, WriteAheadLog, recover
from broker.storage.reader import ReadFailure
from broker.storage.testing import SimulatedDisk
from tests.support.fakewal import FakeWAL
from tests.support.wait import wait_until

MAX_RECORD_BYTES = 4096


@dataclass
class LogUnderTest:
    """A log, what it reported, and its disk's controls."""

    log: Any = None
    durable: list[int] = field(default_factory=list)
    failures: list[tuple[int, int]] = field(default_factory=list)
    recovered: int = 0
    #: let the disk write what is appended (the real log on its own; a held fake when told)
    catch_up: Callable[[], Awaitable[None]] = None  # type: ignore[assignment]
    #: make writes (and syncs) fail until heal()
    break_disk: Callable[[], None] = None  # type: ignore[assignment]
    heal: Callable[[], Awaitable[None]] = None  # type: ignore[assignment]
    #: cut the power: returns LSN -> (rtype, payload) of what survives
    power_cut: Callable[[], Awaitable[dict[int, tuple[int, bytes]]]] = None  # type: ignore[assignment]

    def on_durable(self, lsn: int) -> None:
        self.durable.append(lsn)

    def on_failure(self, first: int, last: int, exc: OSError) -> None:
        self.failures.append((first, last))

    def on_recovered(self) -> None:
        self.recovered += 1

    @property
    def durable_lsn(self) -> int:
        return self.durable[-1] if self.durable else 0


async def _wait_reported(lut: LogUnderTest) -> None:
    """Until the log has reported everything appended (durable or failed)."""
    def settled() -> bool:
        last = lut.log.last_lsn
        failed = max((b for _a, b in lut.failures), default=0)
        return max(lut.durable_lsn, failed) >= last

    await wait_until(settled, what="the log reported every appended record")


@asynccontextmanager
async def _real(tmp_path: Path) -> AsyncIterator[LogUnderTest]:
    disk = SimulatedDisk()
    data_dir = tmp_path / "data"
    recovery = recover(data_dir, fs=disk, max_record_bytes=MAX_RECORD_BYTES)
    for _record in recovery.wal_records:  # the read phase comes first (empty here)
        pass
    lut = LogUnderTest()
    wal = WriteAheadLog.open(
        recovery,
        fsync_policy="always",
        on_durable=lut.on_durable,
        on_failure=lut.on_failure,
        on_recovered=lut.on_recovered,
        retry_interval_s=0.02,
    )
    lut.log = wal
    crashed = False

    async def catch_up() -> None:
        await _wait_reported(lut)

    def break_disk() -> None:
        disk.fail_syncs(count=1_000_000, err=errno.EIO)

    async def heal() -> None:
        disk.fail_syncs(count=0)
        await wait_until(lambda: lut.recovered, what="on_recovered")

    async with trio.open_nursery() as nursery:
        serving = trio.Event()
        serve_scope = trio.CancelScope()

        async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with serve_scope:
                    await wal.serve(task_status=task_status)
            finally:
                serving.set()

        await nursery.start(serve)

        async def power_cut() -> dict[int, tuple[int, bytes]]:
            nonlocal crashed
            crashed = True
            serve_scope.cancel()
            await serving.wait()
            disk.lose_power()
            after = recover(data_dir, fs=disk, max_record_bytes=MAX_RECORD_BYTES)
            survivors = {lsn: (rtype, payload) for lsn, rtype, payload in after.wal_records}
            after.reader.close()
            return survivors

        lut.catch_up, lut.break_disk, lut.heal, lut.power_cut = catch_up, break_disk, heal, power_cut
        try:
            yield lut
        finally:
            if not crashed:
                await wal.aclose()
            nursery.cancel_scope.cancel()


def _fake(hold: bool) -> Callable[[Path], Any]:
    @asynccontextmanager
    async def open_fake(tmp_path: Path) -> AsyncIterator[LogUnderTest]:
        lut = LogUnderTest()
        wal = FakeWAL(
            on_durable=lut.on_durable,
            on_failure=lut.on_failure,
            on_recovered=lut.on_recovered,
            hold=hold,
            max_record_bytes=MAX_RECORD_BYTES,
        )
        lut.log = wal

        async def catch_up() -> None:
            if hold:
                wal.make_durable()
            await _wait_reported(lut)

        async def heal() -> None:
            wal.recover()

        async def power_cut() -> dict[int, tuple[int, bytes]]:
            return wal.crash()

        lut.catch_up, lut.break_disk, lut.heal, lut.power_cut = catch_up, wal.fail, heal, power_cut
        async with trio.open_nursery() as nursery:
            await nursery.start(wal.serve)
            try:
                yield lut
            finally:
                await wal.aclose()
                nursery.cancel_scope.cancel()

    return open_fake


@pytest.fixture(params=[_real, _fake(hold=False), _fake(hold=True)], ids=["WriteAheadLog", "FakeWAL", "FakeWAL-held"])
async def log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LogUnderTest]:
    async with request.param(tmp_path) as lut:
        yield lut


async def _sync_while_catching_up(lut: LogUnderTest) -> int:
    """``sync()`` with the disk catching up meanwhile (a held fake syncs only then)."""
    result: list[int] = []

    async def run_sync() -> None:
        result.append(await lut.log.sync())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_sync)
        await trio.testing.wait_all_tasks_blocked()
        await lut.catch_up()
    return result[0]


# -- append_nowait: numbering --------------------------------------------------------


async def test_batches_are_numbered_one_after_another(log: LogUnderTest) -> None:
    assert log.log.append_nowait([(1, b"a")]) == 1
    assert log.log.append_nowait([(1, b"b"), (2, b"c"), (3, b"d")]) == 4
    assert log.log.append_nowait([(9, b"")]) == 5


async def test_lazy_and_together_batches_are_numbered_like_any_other(log: LogUnderTest) -> None:
    assert log.log.append_nowait([(1, b"a")]) == 1
    assert log.log.append_nowait([(2, b"ack"), (2, b"ack")], lazy=True) == 3
    assert log.log.append_nowait([(3, b"t1"), (3, b"t2"), (3, b"t3")], together=True) == 6
    assert log.log.append_nowait([(1, b"b")]) == 7


async def test_numbering_counts_records_not_bytes(log: LogUnderTest) -> None:
    assert log.log.append_nowait([(1, b"x" * 4000)]) == 1
    assert log.log.append_nowait([(1, b"")] * 1000) == 1001


async def test_an_empty_batch_numbers_nothing(log: LogUnderTest) -> None:
    assert log.log.append_nowait([]) == 0
    log.log.append_nowait([(1, b"a")])
    assert log.log.append_nowait([]) == 1
    assert log.log.statistics().last_lsn == 1


async def test_a_bad_record_numbers_nothing_of_its_batch(log: LogUnderTest) -> None:
    log.log.append_nowait([(1, b"a")])
    with pytest.raises(ValueError):
        log.log.append_nowait([(1, b"ok"), (256, b"bad type")])
    with pytest.raises(RecordTooLarge):
        log.log.append_nowait([(1, b"ok"), (1, b"x" * MAX_RECORD_BYTES)])
    assert log.log.append_nowait([(1, b"b")]) == 2
    await log.catch_up()
    assert log.log.reader.read([1, 2]) == [(1, b"a"), (1, b"b")]


# -- durability, sync, reads ------------------------------------------------------------


async def test_durability_is_reported_in_order_and_never_past_what_was_appended(log: LogUnderTest) -> None:
    await trio.testing.wait_all_tasks_blocked()
    assert log.durable == []  # nothing appended, nothing durable
    for i in range(5):
        log.log.append_nowait([(1, b"m%d" % i)] * (i + 1))
        await log.catch_up()
    assert log.durable == sorted(log.durable)
    assert log.durable[-1] == log.log.statistics().last_lsn == 15
    assert all(lsn <= 15 for lsn in log.durable)
    assert log.failures == []


async def test_lazy_records_become_durable_too(log: LogUnderTest) -> None:
    log.log.append_nowait([(2, b"ack")], lazy=True)
    await log.catch_up()
    assert log.durable_lsn == 1
    assert log.log.statistics().last_durable_lsn == 1


async def test_sync_returns_an_lsn_covering_every_earlier_append(log: LogUnderTest) -> None:
    log.log.append_nowait([(1, b"a"), (1, b"b")])
    log.log.append_nowait([(2, b"c")], lazy=True)
    synced = await _sync_while_catching_up(log)
    assert synced >= 3
    assert log.durable_lsn >= 3
    stats = log.log.statistics()
    assert stats.buffered_records == 0 and stats.buffered_bytes == 0
    assert stats.last_synced_lsn >= 3 and stats.records_written == 3 and stats.fsyncs >= 1
    assert stats.failed is False


async def test_the_reader_reads_back_durable_records_by_lsn(log: LogUnderTest) -> None:
    log.log.append_nowait([(1, b"one"), (7, b"two")])
    log.log.append_nowait([(3, b"t1"), (3, b"t2")], together=True)
    await log.catch_up()
    assert log.log.reader.read([4, 1, 2, 3]) == [(3, b"t2"), (1, b"one"), (7, b"two"), (3, b"t1")]
    assert log.log.reader.spans() == [(1, 5)]
    [missing] = log.log.reader.read([99])
    assert isinstance(missing, ReadFailure) and not missing.transient


async def test_the_active_segment_starts_at_the_first_record_written(log: LogUnderTest) -> None:
    assert log.log.active_first_lsn is None
    assert log.log.statistics().active_segment is None
    log.log.append_nowait([(1, b"a")])
    await log.catch_up()
    assert log.log.active_first_lsn == 1
    assert log.log.statistics().active_segment is not None


async def test_release_through_never_deletes_the_active_segment(log: LogUnderTest) -> None:
    log.log.append_nowait([(1, b"a"), (1, b"b")])
    await _sync_while_catching_up(log)
    assert log.log.release_through(2) == []
    assert log.log.reader.read([1, 2]) == [(1, b"a"), (1, b"b")]


async def test_want_reserve_may_be_called_any_time(log: LogUnderTest) -> None:
    log.log.want_reserve()
    log.log.append_nowait([(1, b"a")])
    log.log.want_reserve()
    await log.catch_up()
    assert log.durable_lsn == 1


# -- closing -------------------------------------------------------------------------------


async def test_aclose_writes_what_is_buffered_and_then_refuses(log: LogUnderTest) -> None:
    log.log.append_nowait([(1, b"a"), (1, b"b")])
    await log.log.aclose()
    assert log.durable_lsn == 2
    await log.log.aclose()  # idempotent
    with pytest.raises(WALClosed):
        log.log.append_nowait([(1, b"c")])
    with pytest.raises(WALClosed):
        await log.log.sync()


# -- failures and crashes -------------------------------------------------------------------


async def test_a_failing_disk_reports_failures_not_durability_until_it_heals(log: LogUnderTest) -> None:
    log.log.append_nowait([(1, b"before")])
    await log.catch_up()
    log.break_disk()
    log.log.append_nowait([(1, b"lost1"), (1, b"lost2")])
    await _wait_reported(log)
    assert log.durable_lsn == 1
    assert log.failures and log.failures[0][0] == 2 and log.failures[-1][1] == 3
    assert log.log.statistics().failed is True
    with pytest.raises(WALFailed):
        await log.log.sync()
    await log.heal()
    assert log.recovered == 1
    assert log.log.statistics().failed is False
    assert log.log.append_nowait([(1, b"after")]) == 4
    await log.catch_up()
    assert log.durable_lsn == 4
    assert log.log.reader.read([1, 4]) == [(1, b"before"), (1, b"after")]


async def test_a_power_cut_keeps_what_sync_returned_and_survivors_are_a_prefix(log: LogUnderTest) -> None:
    log.log.append_nowait([(1, b"a"), (2, b"b")])
    log.log.append_nowait([(3, b"c")], lazy=True)
    synced = await _sync_while_catching_up(log)
    log.log.append_nowait([(4, b"maybe")])  # not synced: may or may not survive
    survivors = await log.power_cut()
    assert sorted(survivors) == list(range(1, len(survivors) + 1))
    assert len(survivors) >= synced >= 3
    assert [survivors[lsn] for lsn in (1, 2, 3)] == [(1, b"a"), (2, b"b"), (3, b"c")]


# -- the fake's own knobs ------------------------------------------------------------------


async def test_a_held_fake_makes_nothing_durable_until_released_and_releases_in_steps() -> None:
    durable: list[int] = []
    wal = FakeWAL(on_durable=durable.append, hold=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        wal.append_nowait([(1, b"a"), (1, b"b"), (1, b"c")])
        await trio.testing.wait_all_tasks_blocked()
        assert durable == [] and wal.statistics().buffered_records == 3
        with trio.move_on_after(0.05) as waited:
            await wal.sync()
        assert waited.cancelled_caught  # sync waits for the test to release the disk
        wal.make_durable(2)
        assert durable == [2] and wal.reader.read([2])[0] == (1, b"b")
        assert isinstance(wal.reader.read([3])[0], ReadFailure)  # not written yet
        with pytest.raises(ValueError):
            wal.make_durable(4)  # never appended
        wal.make_durable()
        assert durable == [2, 3]
        assert await wal.sync() == 3
        await wal.aclose()


async def test_a_fake_crash_loses_what_was_not_durable() -> None:
    wal = FakeWAL(hold=True)
    wal.append_nowait([(1, b"a"), (1, b"b")])
    wal.make_durable(1)
    assert wal.crash() == {1: (1, b"a")}
    with pytest.raises(WALClosed):
        wal.append_nowait([(1, b"c")])

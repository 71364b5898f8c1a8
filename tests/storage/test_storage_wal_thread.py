"""The WAL's own IO thread (``broker/storage/wal_thread.py``): alone, and under the writer."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from broker.storage import WriteAheadLog
from broker.storage.testing import SimulatedDisk
from broker.storage.wal_thread import THREAD_NAME, IOThread
from tests.storage.walevents import Events, serving


def wal_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


# --------------------------------------------------------------------------- alone


async def test_calls_run_in_order_in_one_thread_and_the_thread_is_joined_on_stop() -> None:
    io = IOThread(trio.CapacityLimiter(1))
    io.start()
    try:
        ran: list[tuple[int, str]] = []
        for n in range(20):
            assert await io.run(lambda n=n: ran.append((n, threading.current_thread().name)) or n) == n
        assert [n for n, _ in ran] == list(range(20))
        assert {name for _, name in ran} == {THREAD_NAME}
        assert len(wal_threads()) == 1
    finally:
        io.stop()
    assert not io.running
    assert wal_threads() == []
    io.stop()  # a second stop is a no-op


async def test_what_the_call_raises_is_raised_in_the_task() -> None:
    io = IOThread(trio.CapacityLimiter(1))
    io.start()
    try:

        def fail() -> None:
            raise OSError(5, "Input/output error")

        with pytest.raises(OSError, match="Input/output error"):
            await io.run(fail)
        assert await io.run(lambda: 7) == 7  # the thread goes on
    finally:
        io.stop()


async def test_without_the_thread_calls_go_to_trios_threads() -> None:
    io = IOThread(trio.CapacityLimiter(1))
    name = await io.run(lambda: threading.current_thread().name)
    assert name != THREAD_NAME and name != threading.current_thread().name
    io.start()
    io.stop()
    io.start()  # restartable: serve() may run again after it ended
    try:
        assert await io.run(lambda: threading.current_thread().name) == THREAD_NAME
    finally:
        io.stop()


async def test_cancelled_while_waiting_for_the_io_slot_nothing_is_handed_over() -> None:
    limiter = trio.CapacityLimiter(1)
    io = IOThread(limiter)
    io.start()
    ran: list[int] = []
    outcome: list[str] = []

    async def call() -> None:
        try:
            await io.run(lambda: ran.append(1))
            outcome.append("returned")
        except trio.Cancelled:
            outcome.append("cancelled")
            raise

    try:
        async with trio.open_nursery() as nursery:
            await limiter.acquire_on_behalf_of(nursery)  # another holder has the slot
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        limiter.release_on_behalf_of(nursery)
        assert outcome == ["cancelled"]
        assert await io.run(lambda: len(ran)) == 0  # never handed over
    finally:
        io.stop()


async def test_a_call_handed_over_is_waited_for_whatever_is_cancelled() -> None:
    io = IOThread(trio.CapacityLimiter(1))
    io.start()
    entered = threading.Event()
    release = threading.Event()
    done: list[str] = []

    def blocking() -> str:
        entered.set()
        release.wait(60.0)  # a hang guard only
        done.append("io")
        return "finished"

    results: list[str] = []
    scope = trio.CancelScope()

    async def call() -> None:
        with scope:
            results.append(await io.run(blocking))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            assert await trio.to_thread.run_sync(entered.wait, 60.0)  # a hang guard only
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert done == [] and results == []  # still waiting for the thread
            release.set()
        assert done == ["io"]
        assert results == ["finished"]  # not abandoned: its result came back
    finally:
        release.set()
        io.stop()


# --------------------------------------------------------------------------- under the writer


async def test_the_writer_fsyncs_in_its_io_thread_and_joins_it_on_close(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    synced_in: list[str] = []
    disk.sync_hook = lambda path: synced_in.append(threading.current_thread().name) if path.endswith(".wal") else None
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, **events.callbacks())
    async with serving(wal):
        assert len(wal_threads()) == 1
        for n in range(3):
            lsn = wal.append_nowait([(1, b"r%d" % n)])
            await events.wait_durable(lsn)
    assert synced_in and set(synced_in) <= {THREAD_NAME}
    assert wal_threads() == []


async def test_cancelled_writer_waits_for_its_fsync_then_stops_the_thread(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    entered = threading.Event()
    release = threading.Event()

    def slow_fsync(path: str) -> None:
        if path.endswith(".wal") and not release.is_set():
            entered.set()
            release.wait(60.0)  # a hang guard only

    disk.sync_hook = slow_fsync
    events = Events()
    wal = WriteAheadLog(tmp_path, fs=disk, **events.callbacks())
    scope = trio.CancelScope()

    async def serve(task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await wal.serve(task_status=task_status)

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve)
            wal.append_nowait([(1, b"a")])
            assert await trio.to_thread.run_sync(entered.wait, 60.0)  # a hang guard only
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert events.durable == []  # the fsync is still running, and waited for
            assert len(wal_threads()) == 1
            release.set()
        assert events.durable == [1]  # the batch handed over was finished and reported
        assert wal_threads() == []  # serve's end stopped and joined the thread
    finally:
        release.set()
        await wal.aclose()

"""Graceful shutdown in-process, with real signals sent to this process."""

from __future__ import annotations

import os
import signal

import anyio
import pytest

import client
from client import open_graceful_shutdown
from tests.client.fakebroker import FakeBroker

pytestmark = pytest.mark.anyio


async def _fill(ch: client.Channel, n: int) -> None:
    await ch.declare_queue("q")
    for i in range(n):
        ch.publish_nowait("", "q", f"{i}".encode())
    await ch.wait_for_confirms()


async def test_first_signal_cancels_consumers_lets_the_handler_finish_then_closes(
    fake: FakeBroker, conn: client.Connection
) -> None:
    handled = []
    async with open_graceful_shutdown() as shutdown:
        shutdown.attach(conn)
        async with conn.channel() as ch:
            await _fill(ch, 10)
            async with ch.consume("q", prefetch=5) as messages:
                async for msg in messages:
                    if not handled:
                        os.kill(os.getpid(), signal.SIGTERM)
                        await shutdown.wait_requested()
                        await anyio.sleep(0.05)  # the handler is still working
                    handled.append(msg.body)
                    assert await msg.ack()
    assert handled == [b"0"]
    assert shutdown.requested and not shutdown.aborted and shutdown.signal == signal.SIGTERM
    assert fake.bodies("q") == [f"{i}".encode() for i in range(1, 10)]
    assert fake.queues["q"].unacked == 0
    ops = [op["op"] for op in fake.ops_seen if op["op"] in ("cancel", "ack", "close")]
    assert ops == ["cancel", "ack", "close"]  # unsubscribe, handler settles, then close


async def test_second_signal_aborts_without_acking_the_unfinished_message(
    fake: FakeBroker, conn: client.Connection
) -> None:
    started = anyio.Event()
    async with open_graceful_shutdown() as shutdown:
        shutdown.attach(conn)
        async with conn.channel() as ch:
            await _fill(ch, 3)
            async with ch.consume("q", prefetch=1) as messages:
                async for msg in messages:
                    started.set()
                    os.kill(os.getpid(), signal.SIGINT)
                    await shutdown.wait_requested()
                    os.kill(os.getpid(), signal.SIGINT)
                    await anyio.sleep_forever()  # a handler that does not finish
                    await msg.ack()  # pragma: no cover
    assert started.is_set() and shutdown.aborted
    await anyio.wait_all_tasks_blocked()
    assert fake.acked_ids == []
    assert fake.bodies("q") == [b"0", b"1", b"2"]  # all back, in order


async def test_grace_period_aborts_a_stuck_handler(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with open_graceful_shutdown(grace_s=5) as shutdown:
        shutdown.attach(conn)
        async with conn.channel() as ch:
            await _fill(ch, 1)
            async with ch.consume("q") as messages:
                async for msg in messages:
                    shutdown.request()
                    start = anyio.current_time()
                    await anyio.sleep(3600)
    assert shutdown.aborted
    assert 4.9 <= anyio.current_time() - start <= 5.5
    await anyio.wait_all_tasks_blocked()
    assert fake.bodies("q") == [b"0"] and fake.acked_ids == []


async def test_producer_stops_and_its_publishes_are_confirmed_before_close(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    handles = []
    async with open_graceful_shutdown() as shutdown:
        shutdown.attach(conn)
        async with conn.channel() as ch:
            await ch.declare_queue("q")
            fake.ack_mode = "batch"
            while not shutdown.requested:
                handles.append(await ch.start_publish("", "q", b"x"))
                if len(handles) == 500:
                    shutdown.request()
            # leaving the channel block waits for the confirms, then closes
    assert all(h.done() and h.exception() is None for h in handles)
    assert len(fake.bodies("q")) == 500


async def test_attach_after_the_request_stops_consumers_at_once(
    fake: FakeBroker, conn: client.Connection
) -> None:
    async with open_graceful_shutdown() as shutdown:
        shutdown.request()
        shutdown.attach(conn)
        async with conn.channel() as ch:
            await _fill(ch, 2)
            async with ch.consume("q") as messages:
                assert [m async for m in messages] == []
    assert fake.bodies("q") == [b"0", b"1"]

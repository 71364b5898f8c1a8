"""When the channel's writer sends (client/session.py): a lone op with nothing else
runnable goes out at once, in the writer's first step; ops queued by a busy producer
are coalesced into few chunks (docs/client.md, "Batching")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest
import trio

import client
from client.consumer import YIELD_EVERY
from client.endpoint import Endpoint
from tests.client.fakebroker import FakeBroker

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["trio"])]


class LoopIterations(trio.abc.Instrument):
    """Counts passes of trio's run loop (each one an IO check, then a batch of steps)."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


class SendRecorder(anyio.abc.ByteStream):
    """Wraps the client's side of a connection; calls ``on_send`` with every write."""

    def __init__(self, inner: anyio.abc.ByteStream, on_send: Callable[[bytes], None]) -> None:
        self._inner = inner
        self._on_send = on_send

    async def send(self, data: bytes) -> None:
        self._on_send(bytes(data))
        await self._inner.send(data)

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._inner.receive(max_bytes)

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def recording_channel(
    fake: FakeBroker, **settings: int
) -> AsyncIterator[tuple[client.Channel, list[tuple[int, bytes]], LoopIterations]]:
    """A channel whose writes are recorded as ``(loop iteration, bytes)``."""
    loop = LoopIterations()
    writes: list[tuple[int, bytes]] = []

    async def opener(endpoint: Endpoint) -> anyio.abc.ByteStream:
        stream = await fake.open_stream(endpoint)
        return SendRecorder(stream, lambda data: writes.append((loop.count, data)))

    async with client.connect("http://fake.invalid:8080", open_stream=opener) as conn:
        async with conn.channel(**settings) as ch:
            await ch.declare_queue("q")
            await anyio.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(loop)
            try:
                writes.clear()
                yield ch, writes, loop
            finally:
                trio.lowlevel.remove_instrument(loop)


def publish_writes(writes: list[tuple[int, bytes]]) -> list[tuple[int, int]]:
    """``(loop iteration, publishes in it)`` of each write carrying publishes."""
    return [(it, data.count(b'"op":"publish"')) for it, data in writes if b'"op":"publish"' in data]


async def test_a_lone_publish_is_written_in_the_writers_first_step(fake: FakeBroker) -> None:
    async with recording_channel(fake) as (ch, writes, loop):
        for body in (b"1", b"2", b"3"):
            start = loop.count
            handle = ch.publish_nowait("", "q", body)
            # nothing else is runnable: the writer wakes in the next pass of the run
            # loop and sends at once, instead of waiting scheduling rounds for more
            await handle
            assert publish_writes(writes)[-1] == (start + 1, 1)
        assert fake.bodies("q") == [b"1", b"2", b"3"]


async def test_a_publish_awaited_alone_is_written_at_once(fake: FakeBroker) -> None:
    async with recording_channel(fake) as (ch, writes, loop):
        start = loop.count
        await ch.publish("", "q", b"alone")
        assert publish_writes(writes) == [(start + 1, 1)]


async def test_a_publishing_loop_is_still_coalesced(fake: FakeBroker) -> None:
    count = 8 * YIELD_EVERY
    async with recording_channel(fake, max_pending=10 * count) as (ch, writes, _):
        for i in range(count):
            await ch.start_publish("", "q", b"%d" % i)
        await ch.wait_for_confirms()
        chunks = publish_writes(writes)
        assert sum(n for _, n in chunks) == count
        # the writer keeps waiting while the publisher keeps adding: few, large chunks
        assert len(chunks) <= 3
        assert fake.bodies("q") == [b"%d" % i for i in range(count)]


async def test_ops_queued_together_leave_in_one_chunk(fake: FakeBroker) -> None:
    async with recording_channel(fake) as (ch, writes, _):
        handles = [ch.publish_nowait("", "q", b"%d" % i) for i in range(5)]
        for handle in handles:
            await handle
        assert [n for _, n in publish_writes(writes)] == [5]


def ack_writes(writes: list[tuple[int, bytes]]) -> list[bytes]:
    return [data for _, data in writes if b'"op":"ack"' in data]


async def test_a_consumer_acking_in_order_is_coalesced(fake: FakeBroker) -> None:
    # In-order acks merge into the one queued ``multiple`` ack, so the queue does not
    # grow while the consumer acks: the writer must still see them coming and wait,
    # not send after two rounds (a chunk per couple of the consumer's schedule points).
    count = 8 * YIELD_EVERY
    async with recording_channel(fake) as (ch, writes, _):
        for i in range(count):
            ch.publish_nowait("", "q", b"%d" % i)
        await ch.wait_for_confirms()
        async with ch.consume("q", prefetch=count) as messages:
            await anyio.wait_all_tasks_blocked()
            writes.clear()
            assert messages.buffered == count
            for _ in range(count):
                message = await messages.receive()
                assert await message.ack()
            await anyio.wait_all_tasks_blocked()
            # (COALESCE_ROUNDS bounds each wait: about 80 acks a chunk here; 7 to 13
            # chunks when the writer judged by the queue's length, sent a lone op at
            # once, and sent what came during a send with no wait)
            assert len(ack_writes(writes)) <= 2
        assert fake.bodies("q") == [] and fake.queues["q"].unacked == 0

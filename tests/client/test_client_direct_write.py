"""Direct writes and the reader's hand-over (client/session.py): over a plain socket, a
lone op is written by the task that queues it, in that task's own step; a burst is
still coalesced by the writer; order and the bytes a socket did not take are kept; a
broken socket found by a direct write ends the session and the publish is resent. And
the reader lets a consumer it handed a delivery run before it reads again."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

import client
from client.consumer import YIELD_EVERY, MessageStream
from client.duplex import DuplexExchange
from tests.client.fakebroker import FakeBroker

# Direct writes happen under trio only (client/transport.py: asyncio's transports
# buffer writes themselves, so a direct write could overtake them).
pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["trio"])]


class Writes:
    """Every write of the channel's request body: ``(how, publishes in it)``, ``how``
    being ``"direct"`` (by the producer, :meth:`DuplexExchange.write_nowait`) or
    ``"writer"`` (by the writer task)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[tuple[str, int]] = []
        self.leftovers: list[int] = []
        write_nowait, send = DuplexExchange.write_nowait, DuplexExchange.send

        def recording_write_nowait(exchange: DuplexExchange, data: bytes) -> bytes:
            self.log.append(("direct", data.count(b'"op":"publish"')))
            leftover = write_nowait(exchange, data)
            self.leftovers.append(len(leftover))
            return leftover

        async def recording_send(exchange: DuplexExchange, data: bytes) -> None:
            self.log.append(("writer", data.count(b'"op":"publish"')))
            await send(exchange, data)

        monkeypatch.setattr(DuplexExchange, "write_nowait", recording_write_nowait)
        monkeypatch.setattr(DuplexExchange, "send", recording_send)

    def publishes(self) -> list[tuple[str, int]]:
        return [(how, n) for how, n in self.log if n]


@asynccontextmanager
async def socket_channel(fake: FakeBroker, **settings: int) -> AsyncIterator[client.Channel]:
    """A channel to the fake broker over a socket pair, settled and idle."""
    fake.socket_streams = True
    async with client.connect("http://fake.invalid:8080", open_stream=fake.open_stream) as conn:
        async with conn.channel(**settings) as ch:
            await ch.declare_queue("q")
            await anyio.wait_all_tasks_blocked()
            yield ch


async def test_a_lone_publish_is_written_by_the_publisher_itself(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with socket_channel(fake) as ch:
        writes = Writes(monkeypatch)
        for body in (b"1", b"2", b"3"):
            handle = ch.publish_nowait("", "q", body)
            # on the socket before publish_nowait returned: no scheduling round
            assert writes.publishes()[-1] == ("direct", 1)
            await handle
        assert writes.publishes() == [("direct", 1)] * 3
        assert fake.bodies("q") == [b"1", b"2", b"3"]


async def test_ops_after_a_direct_write_follow_it_in_one_chunk(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with socket_channel(fake) as ch:
        writes = Writes(monkeypatch)
        handles = [ch.publish_nowait("", "q", b"%d" % i) for i in range(5)]
        for handle in handles:
            await handle
        assert writes.publishes() == [("direct", 1), ("writer", 4)]
        assert fake.bodies("q") == [b"%d" % i for i in range(5)]


async def test_a_publishing_loop_over_a_socket_is_still_coalesced(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 8 * YIELD_EVERY
    async with socket_channel(fake, max_pending=10 * count) as ch:
        writes = Writes(monkeypatch)
        for i in range(count):
            await ch.start_publish("", "q", b"%d" % i)
        await ch.wait_for_confirms()
        chunks = writes.publishes()
        assert sum(n for _, n in chunks) == count
        # one direct write at most when the loop starts, then few large chunks
        assert [how for how, _ in chunks].count("direct") <= 1
        assert len(chunks) <= 4
        assert fake.bodies("q") == [b"%d" % i for i in range(count)]


async def test_bytes_the_socket_did_not_take_go_out_before_the_next_op(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = b"x" * (4 << 20)  # far more than a socket buffer holds
    async with socket_channel(fake, max_pending_bytes=16 << 20) as ch:
        writes = Writes(monkeypatch)
        first = ch.publish_nowait("", "q", big)
        second = ch.publish_nowait("", "q", b"small")
        assert writes.leftovers and writes.leftovers[0] > 0
        await first
        await second
        assert fake.bodies("q") == [big, b"small"]


async def test_a_broken_socket_found_by_a_direct_write_ends_the_session_and_the_publish_is_resent(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with socket_channel(fake) as ch:
        writes = Writes(monkeypatch)
        fake.client_sockets[-1].shutdown(socket.SHUT_WR)  # the next write fails (EPIPE)
        handle = ch.publish_nowait("", "q", b"again")
        assert writes.publishes() == [("direct", 1)]
        with anyio.fail_after(30):
            await handle
        stats = ch.statistics()
        assert (stats.reconnects, stats.resent) == (1, 1)
        assert fake.bodies("q") == [b"again"]


async def test_the_reader_lets_a_consumer_run_before_it_reads_again(
    fake: FakeBroker, conn: client.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (each read notes how many messages the stream had been handed by then: the
    # stream's own count, since the compiled build's streams cannot be patched)
    order: list[str] = []
    streams: list[MessageStream] = []
    receive_some = DuplexExchange.receive_some

    async def recording_receive_some(exchange: DuplexExchange) -> bytes:
        order.append(f"read after {sum(stream.delivered for stream in streams)} delivered")
        return await receive_some(exchange)

    monkeypatch.setattr(DuplexExchange, "receive_some", recording_receive_some)
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        async with ch.consume("q") as messages:
            streams.append(messages)
            await ch.publish("", "q", b"m")
            async for message in messages:
                order.append("consumer")
                await message.ack()
                break
            await anyio.wait_all_tasks_blocked()
    # the consumer got its message before the reader read again
    after = order.index("read after 1 delivered")
    assert order[after - 1] == "consumer", order


@asynccontextmanager
async def one_delivery(fake: FakeBroker) -> AsyncIterator[tuple[client.Channel, client.Message]]:
    """A socket channel holding one unacked delivery, everything else settled."""
    async with socket_channel(fake) as ch:
        await ch.publish("", "q", b"m")
        async with ch.consume("q") as messages:
            async for message in messages:
                await anyio.wait_all_tasks_blocked()
                yield ch, message
                break


async def test_an_op_that_may_go_direct_does_not_overtake_a_queued_one(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with one_delivery(fake) as (ch, message):
        writes = Writes(monkeypatch)
        await message.ack()  # queued (settling ops never go direct)
        # nothing unconfirmed: this publish may go direct, but the ack is queued
        handle = ch.publish_nowait("", "q", b"after the ack")
        assert writes.log == []
        await handle
        assert writes.log == [("writer", 1)]  # the ack, then the publish


async def test_settling_ops_are_never_written_directly(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with one_delivery(fake) as (_ch, message):
        writes = Writes(monkeypatch)
        await message.ack()
        await anyio.wait_all_tasks_blocked()
        assert [how for how, _ in writes.log] == ["writer"]


async def test_a_publish_that_waited_for_room_is_not_written_directly(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that filled its window gets it back all at once when the broker confirms
    the lot; the first publish of the refill must not go alone (the broker would fsync
    it on its own), even though nothing else is unconfirmed at that moment."""
    async with socket_channel(fake, max_pending=4) as ch:
        writes = Writes(monkeypatch)
        fake.hold_confirms = True

        async def loop() -> None:
            for i in range(12):
                await ch.start_publish("", "q", b"%d" % i)

        async with anyio.create_task_group() as nursery:
            nursery.start_soon(loop)
            for _ in range(2):
                await anyio.wait_all_tasks_blocked()
                fake.release_confirms()  # the whole window at once
            await anyio.wait_all_tasks_blocked()
        fake.hold_confirms = False
        fake.release_confirms()
        await ch.wait_for_confirms()
        chunks = writes.publishes()
        assert chunks[0] == ("direct", 1)  # the loop's very first publish
        assert [how for how, _ in chunks[1:]] == ["writer"] * (len(chunks) - 1)
        assert sum(n for _, n in chunks) == 12
        assert fake.bodies("q") == [b"%d" % i for i in range(12)]

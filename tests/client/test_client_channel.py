"""Channel behaviour against the in-process fake broker: confirms, failures, the
pending window, declarations, consumers and settling."""

from __future__ import annotations

import anyio
import pytest
from trio.testing import MockClock

import client
from client import (
    ChannelClosedByBroker,
    ClientClosed,
    ConfirmTimeout,
    MessageAlreadySettled,
    PublishNacked,
    PublishRefused,
    PublishReturned,
    SomePublishesFailed,
)
from tests.client.fakebroker import FakeBroker

pytestmark = pytest.mark.anyio


async def test_publish_returns_once_confirmed(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        mid = await ch.publish("", "q", b"hello", properties={"content_type": "text/plain"})
        assert fake.bodies("q") == [b"hello"]
        assert fake.queues["q"].ready[0].properties == {"content_type": "text/plain", "message_id": mid}
        mid2 = await ch.publish("", "q", "text body", properties=client.Properties(message_id="mine"))
        assert mid2 == "mine"
        stats = ch.statistics()
        assert stats.published == stats.confirmed == 2 and stats.pending_publishes == 0


async def test_binary_bodies_survive(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        await ch.publish("", "q", bytes(range(256)))
        async with ch.consume("q") as messages:
            msg = await messages.receive()
            assert msg.body == bytes(range(256))
            await msg.ack()


async def test_nack_raises_publish_nacked(fake: FakeBroker, conn: client.Connection) -> None:
    fake.nack_ids.add("bad")
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        with pytest.raises(PublishNacked) as info:
            await ch.publish("", "q", b"x", properties={"message_id": "bad"})
        assert info.value.reason == "fake nack" and info.value.message_id == "bad"
        await ch.publish("", "q", b"y")  # the channel goes on
        assert fake.bodies("q") == [b"y"]


async def test_unroutable_mandatory_publish_is_returned(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        with pytest.raises(PublishReturned) as info:
            await ch.publish("", "nowhere", b"x", mandatory=True)
        assert info.value.reply_code == 312 and info.value.message.routing_key == "nowhere"
        assert info.value.message.body == b"x"
        # not mandatory: silently dropped, but confirmed
        await ch.publish("", "nowhere", b"x")


async def test_publish_refused_by_a_channel_error_does_not_stop_the_others(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        good1 = ch.publish_nowait("", "q", b"1")
        bad = ch.publish_nowait("", "k" * 300, b"2")  # the broker ends the channel over it
        good2 = ch.publish_nowait("", "q", b"3")
        await good1
        with pytest.raises(PublishRefused) as info:
            await bad
        assert info.value.code == "invalid_argument"
        await good2
        assert fake.bodies("q") == [b"1", b"3"]
        assert fake.channels_opened == 2  # the error closed the first session


async def test_pipelined_publishes_and_wait_for_confirms(fake: FakeBroker, conn: client.Connection) -> None:
    fake.ack_mode = "batch"
    async with conn.channel(max_pending=50) as ch:
        await ch.declare_queue("q")
        for i in range(500):
            await ch.start_publish("", "q", f"m{i}".encode())
            assert len(ch._tracker) <= 50
        await ch.wait_for_confirms()
        assert fake.bodies("q") == [f"m{i}".encode() for i in range(500)]
        assert ch.statistics().confirmed == 500


async def test_wait_for_confirms_reports_unseen_failures_once(fake: FakeBroker, conn: client.Connection) -> None:
    fake.nack_ids.update({"n1", "n2"})
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        seen = ch.publish_nowait("", "q", b"a", properties={"message_id": "n1"})
        ch.publish_nowait("", "q", b"b", properties={"message_id": "n2"})
        ch.publish_nowait("", "q", b"c")
        with pytest.raises(PublishNacked):
            await seen
        with pytest.raises(SomePublishesFailed) as info:
            await ch.wait_for_confirms()
        assert [e.message_id for e in info.value.failures] == ["n2"]  # type: ignore[attr-defined]
        await ch.wait_for_confirms()  # reported once only


async def test_publish_nowait_raises_wouldblock_when_the_window_is_full(
    fake: FakeBroker, conn: client.Connection
) -> None:
    fake.hold_confirms = True
    async with conn.channel(max_pending=3) as ch:
        await ch.declare_queue("q")
        handles = [ch.publish_nowait("", "q", b"x") for _ in range(3)]
        with pytest.raises(anyio.WouldBlock):
            ch.publish_nowait("", "q", b"x")
        await anyio.wait_all_tasks_blocked()
        fake.release_confirms()
        for h in handles:
            assert await h == h.message_id
        fake.hold_confirms = False
        ch.publish_nowait("", "q", b"x")


async def test_publish_waits_for_room_then_times_out(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    fake.hold_confirms = True
    async with conn.channel(max_pending=1, close_timeout_s=1) as ch:
        await ch.declare_queue("q")
        first = ch.publish_nowait("", "q", b"1")
        with pytest.raises(ConfirmTimeout) as info:
            await ch.publish("", "q", b"2", timeout_s=5)
        assert not info.value.enqueued  # it never got room: nothing was sent
        assert fake.publishes == 1
        fake.release_confirms()
        await first
        with pytest.raises(ConfirmTimeout) as info:
            await ch.publish("", "q", b"3", timeout_s=5)
        assert info.value.enqueued  # sent, outcome unknown: still pending
        assert len(ch._tracker) == 1
        with pytest.raises(ConfirmTimeout):
            await ch.wait_for_confirms(timeout_s=1)
        fake.release_confirms()
        await ch.wait_for_confirms()


async def test_a_cancelled_publish_without_timeout_stays_pending(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    """``publish`` without ``timeout_s`` runs without a cancel scope of its own; a
    cancellation from outside still leaves the sent message pending, as with one."""
    fake.hold_confirms = True
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        with anyio.move_on_after(5) as scope:
            await ch.publish("", "q", b"1")
        assert scope.cancelled_caught
        assert ch.statistics().pending_publishes == 1
        fake.release_confirms()
        await ch.wait_for_confirms()
        assert ch.statistics().confirmed == 1
        assert fake.bodies("q") == [b"1"]


async def test_backpressure_blocks_a_publisher_until_confirms_arrive(
    fake: FakeBroker, conn: client.Connection
) -> None:
    fake.hold_confirms = True
    done = []
    async with conn.channel(max_pending=2) as ch:
        await ch.declare_queue("q")

        async def producer() -> None:
            for i in range(5):
                await ch.start_publish("", "q", b"x")
                done.append(i)

        async with anyio.create_task_group() as nursery:
            nursery.start_soon(producer)
            await anyio.wait_all_tasks_blocked()
            assert done == [0, 1]
            fake.release_confirms()
            await anyio.wait_all_tasks_blocked()
            assert done == [0, 1, 2, 3]
            fake.release_confirms()
        await anyio.wait_all_tasks_blocked()
        fake.release_confirms()


async def test_byte_window(fake: FakeBroker, conn: client.Connection) -> None:
    fake.hold_confirms = True
    async with conn.channel(max_pending_bytes=1000) as ch:
        await ch.declare_queue("q")
        ch.publish_nowait("", "q", b"x" * 2000)  # fits: nothing pending
        with pytest.raises(anyio.WouldBlock):
            ch.publish_nowait("", "q", b"x")
        await anyio.wait_all_tasks_blocked()
        fake.release_confirms()
        await ch.wait_for_confirms()
        ch.publish_nowait("", "q", b"x" * 500)  # about 610 bytes on the wire
        with pytest.raises(anyio.WouldBlock):
            ch.publish_nowait("", "q", b"x" * 500)
        ch.publish_nowait("", "q", b"x" * 200)
        fake.hold_confirms = False
        await anyio.wait_all_tasks_blocked()
        fake.release_confirms()


async def test_declare_error_raises_and_the_channel_recovers(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel() as ch:
        await ch.declare_exchange("x", "fanout")
        with pytest.raises(ChannelClosedByBroker) as info:
            await ch.declare_exchange("x", "direct")
        assert info.value.code == "precondition_failed"
        await ch.declare_queue("q")
        await ch.bind_queue("q", "x")
        await ch.publish("x", "anything", b"m")
        assert fake.bodies("q") == [b"m"]


async def test_bind_unbind_delete_purge(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        declared = await ch.declare_queue("")
        assert declared.queue.startswith("amq.gen-")
        await ch.declare_exchange("x")
        await ch.bind_queue(declared.queue, "x", "k")
        await ch.publish("x", "k", b"1")
        assert await ch.purge_queue(declared.queue) == 1
        await ch.unbind_queue(declared.queue, "x", "k")
        assert fake.bindings == []
        assert await ch.delete_queue(declared.queue) == 0
        assert len(ch._topology) == 1  # only the exchange is left to re-declare


async def test_consume_ack_nack_reject(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        for i in range(4):
            await ch.publish("", "q", f"{i}".encode())
        async with ch.consume("q", prefetch=10) as messages:
            m0 = await messages.receive()
            assert (m0.body, m0.routing_key, m0.exchange, m0.redelivered) == (b"0", "q", "", False)
            assert m0.message_id is not None
            assert await m0.ack()
            m1 = await messages.receive()
            assert await m1.nack(requeue=True)
            m2 = await messages.receive()
            assert await m2.reject()  # dropped
            m3 = await messages.receive()
            assert await m3.ack()
            again = await messages.receive()
            assert again.body == b"1" and again.redelivered
            assert await again.ack()
        assert fake.bodies("q") == []
        assert fake.queues["q"].unacked == 0


async def test_settling_twice_raises_and_sends_nothing(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        await ch.publish("", "q", b"x")
        async with ch.consume("q") as messages:
            msg = await messages.receive()
            assert await msg.ack()
            with pytest.raises(MessageAlreadySettled):
                await msg.ack()
            with pytest.raises(MessageAlreadySettled):
                await msg.nack()
        await anyio.wait_all_tasks_blocked()
        assert fake.acked_ids == [msg.message_id]
        assert fake.channels_opened == 1  # no channel error from a double ack


async def test_prefetch_bounds_unacked_deliveries(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        for i in range(10):
            ch.publish_nowait("", "q", b"x")
        await ch.wait_for_confirms()
        async with ch.consume("q", prefetch=3) as messages:
            await anyio.wait_all_tasks_blocked()
            assert messages.buffered == 3
            msg = await messages.receive()
            await msg.ack()
            await anyio.wait_all_tasks_blocked()
            assert messages.buffered == 3


async def test_no_ack_consumer(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        await ch.publish("", "q", b"x")
        async with ch.consume("q", no_ack=True) as messages:
            msg = await messages.receive()
            assert msg.settled
            with pytest.raises(MessageAlreadySettled):
                await msg.ack()
        assert fake.queues["q"].unacked == 0


async def test_leaving_consume_requeues_buffered_messages_in_order(
    fake: FakeBroker, conn: client.Connection
) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        for i in range(5):
            ch.publish_nowait("", "q", f"{i}".encode())
        await ch.wait_for_confirms()
        async with ch.consume("q", prefetch=5) as messages:
            first = await messages.receive()
            await anyio.wait_all_tasks_blocked()
            assert messages.buffered == 4
        # first was handed out and not settled: still unacked on the channel
        assert fake.bodies("q") == [b"1", b"2", b"3", b"4"]
        assert fake.queues["q"].unacked == 1
        assert await first.ack()
        assert ch.statistics().consumers == 0


async def test_stop_consuming_ends_iteration_after_the_current_message(
    fake: FakeBroker, conn: client.Connection
) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        for i in range(5):
            ch.publish_nowait("", "q", f"{i}".encode())
        await ch.wait_for_confirms()
        handled = []
        async with ch.consume("q", prefetch=5) as messages:
            async for msg in messages:
                conn.stop_consuming()  # e.g. a signal arrives while handling
                handled.append(msg.body)
                assert await msg.ack()
        assert handled == [b"0"]
        assert fake.bodies("q") == [b"1", b"2", b"3", b"4"]
        # consumers opened after a stop end at once
        async with ch.consume("q") as messages:
            assert [m async for m in messages] == []


async def test_broker_cancel_ends_the_stream_with_consumer_cancelled(
    fake: FakeBroker, conn: client.Connection
) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        await ch.publish("", "q", b"x")
        async with ch.consume("q") as messages:
            await anyio.wait_all_tasks_blocked()
            fake.cancel_consumers_of("q")
            msg = await messages.receive()  # buffered messages first
            await msg.ack()
            with pytest.raises(client.ConsumerCancelled) as info:
                await messages.receive()
            assert info.value.reason == "queue deleted"


async def test_consume_unknown_queue_raises(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel() as ch:
        with pytest.raises(ChannelClosedByBroker):
            async with ch.consume("missing"):
                pass  # pragma: no cover
        assert ch.statistics().consumers == 0
        await ch.declare_queue("q")  # the channel recovered


async def test_expired_delivery_is_not_acked(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        await ch.publish("", "q", b"x")
        async with ch.consume("q") as messages:
            msg = await messages.receive()
            (fch,) = fake.channels.values()
            fch.send({"ev": "expired", "consumer_tag": msg.consumer_tag, "delivery_tag": msg.delivery_tag})
            await anyio.wait_all_tasks_blocked()
            assert await msg.ack() is False
        await anyio.wait_all_tasks_blocked()
        assert fake.acked_ids == [] and fake.channels_opened == 1


async def test_close_waits_for_pending_confirms(fake: FakeBroker, conn: client.Connection) -> None:
    fake.hold_confirms = True
    async with anyio.create_task_group() as nursery:
        async with conn.channel() as ch:
            await ch.declare_queue("q")
            handle = ch.publish_nowait("", "q", b"x")

            async def release_later() -> None:
                await anyio.wait_all_tasks_blocked()
                assert ch.state == "closing"
                fake.release_confirms()

            nursery.start_soon(release_later)
        assert await handle == handle.message_id
        assert ch.state == "closed"
        with pytest.raises(ClientClosed):
            await ch.publish("", "q", b"late")


async def test_close_gives_up_on_confirms_after_close_timeout(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    fake.hold_confirms = True
    async with conn.channel(close_timeout_s=3) as ch:
        await ch.declare_queue("q")
        handle = ch.publish_nowait("", "q", b"x")
        start = anyio.current_time()
    assert anyio.current_time() - start == pytest.approx(3, abs=0.5)
    with pytest.raises(ClientClosed):
        await handle


async def test_an_exception_in_the_block_aborts_without_waiting_and_is_not_wrapped(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    fake.hold_confirms = True
    start = anyio.current_time()
    with pytest.raises(KeyError):
        async with conn.channel(close_timeout_s=30) as ch:
            await ch.declare_queue("q")
            handle = ch.publish_nowait("", "q", b"x")
            raise KeyError("boom")
    assert anyio.current_time() - start < 1
    with pytest.raises(ClientClosed):
        await handle


async def test_channels_are_independent_connections(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as a, conn.channel() as b:
        await a.declare_queue("q")
        await b.publish("", "q", b"from b")
        async with a.consume("q") as messages:
            assert (await messages.receive()).body == b"from b"
        assert len(conn.channels) == 2
    assert fake.connects == 2 and conn.channels == []

"""Reconnect against the fake broker: resend in order, exactly once in the queue,
consumers re-established, topology re-declared, backoff, give-up, channel errors."""

from __future__ import annotations

import random

import anyio
import pytest
from trio.testing import MockClock

import client
from client import (
    ChannelClosedByBroker,
    ConnectionLost,
    PublishReturned,
    ReconnectPolicy,
)
from tests.client.fakebroker import FakeBroker

pytestmark = pytest.mark.anyio

FAST = ReconnectPolicy(initial_delay_s=0.05, max_delay_s=1.0)


async def _chaos(fake: FakeBroker, rng: random.Random, crashes: int, stores: bool) -> None:
    """Crash the broker `crashes` times, each after a random number of publishes."""
    for _ in range(crashes):
        fake.crash_stores_publish = stores if stores is not None else rng.random() < 0.5
        # down at once, briefly, or past several of FAST's retries (its delays double
        # from 0.05 s): the asyncio runs wait these out in real time
        fake.crash_down_s = rng.choice([0.0, 0.5, 1.5])
        fake.crash_after_publishes = fake.publishes + rng.randint(1, 400)
        while fake.crash_after_publishes is not None:
            await anyio.sleep(0.01)


@pytest.mark.real_time
@pytest.mark.parametrize("seed", range(6))
async def test_pipelined_producer_across_crashes_is_exactly_once_in_order(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock, seed: int
) -> None:
    rng = random.Random(seed)
    fake.ack_mode = rng.choice(["each", "batch"])
    n = 3000
    async with conn.channel(max_pending=rng.choice([1, 7, 100, 1000]), reconnect=FAST) as ch:
        await ch.declare_queue("q")
        handles = []
        async with anyio.create_task_group() as nursery:
            nursery.start_soon(_chaos, fake, rng, 4, None)
            for i in range(n):
                handles.append(await ch.start_publish("", "q", f"{i}".encode()))
            await ch.wait_for_confirms()
            nursery.cancel_scope.cancel()
        for h in handles:
            assert h.done() and h.exception() is None
        assert fake.bodies("q") == [f"{i}".encode() for i in range(n)]
        stats = ch.statistics()
        assert stats.reconnects >= 1 and stats.confirmed == n and stats.failed == 0


@pytest.mark.real_time
@pytest.mark.parametrize("stores", [True, False])
async def test_sequential_publishes_all_return_and_land_once(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock, stores: bool
) -> None:
    rng = random.Random(42)
    async with conn.channel(reconnect=FAST) as ch:
        await ch.declare_queue("q")
        async with anyio.create_task_group() as nursery:
            nursery.start_soon(_chaos, fake, rng, 3, stores)
            for i in range(1000):
                await ch.publish("", "q", f"{i}".encode())
            nursery.cancel_scope.cancel()
    assert fake.bodies("q") == [f"{i}".encode() for i in range(1000)]
    if stores:
        assert fake.duplicates >= 1  # some resends were deduplicated


async def test_publishes_during_an_outage_wait_and_go_out_after_it(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel(reconnect=FAST) as ch:
        await ch.declare_queue("q")
        await ch.publish("", "q", b"before")
        fake.crash(down_s=30)
        await anyio.wait_all_tasks_blocked()
        assert not ch.connected
        start = anyio.current_time()
        await ch.publish("", "q", b"during")
        assert anyio.current_time() - start >= 29
        assert fake.bodies("q") == [b"before", b"during"]


async def test_channel_gives_up_after_the_deadline(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    policy = ReconnectPolicy(initial_delay_s=0.1, max_delay_s=2, give_up_after_s=20)
    async with conn.channel(reconnect=policy) as ch:
        await ch.declare_queue("q")
        fake.hold_confirms = True
        handle = ch.publish_nowait("", "q", b"x")
        await anyio.wait_all_tasks_blocked()
        fake.refuse = True
        fake.crash()
        start = anyio.current_time()
        with pytest.raises(ConnectionLost) as info:
            await handle
        assert 19 <= anyio.current_time() - start <= 21
        assert isinstance(info.value.__cause__, ConnectionLost)
        assert isinstance(info.value.__cause__.__cause__, ConnectionRefusedError)
        assert ch.state == "failed"
        with pytest.raises(ConnectionLost):
            await ch.publish("", "q", b"y")
        with pytest.raises(ConnectionLost):
            await ch.declare_queue("r")


async def test_first_open_waits_for_the_broker(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    fake.refuse_until = 10.0 + anyio.current_time()
    async with conn.channel(reconnect=FAST) as ch:
        assert anyio.current_time() >= fake.refuse_until
        assert ch.state == "open"
    assert fake.attempts > 5


async def test_first_open_gives_up_with_the_cause_chained(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    fake.refuse = True
    with pytest.raises(ConnectionLost) as info:
        async with conn.channel(reconnect=ReconnectPolicy(max_attempts=4)):
            pass  # pragma: no cover
    assert fake.attempts == 4
    assert "could not open" in str(info.value)
    assert isinstance(info.value.__cause__.__cause__, ConnectionRefusedError)  # type: ignore[union-attr]


async def test_503_on_channel_open_is_retried(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    fake.channel_status = 503

    async def recover_later() -> None:
        await anyio.sleep(5)
        fake.channel_status = 200

    async with anyio.create_task_group() as nursery:
        nursery.start_soon(recover_later)
        async with conn.channel(reconnect=FAST) as ch:
            await ch.declare_queue("q")
    with pytest.raises(ConnectionLost) as info:
        fake.channel_status = 503
        async with conn.channel(reconnect=ReconnectPolicy(max_attempts=2)):
            pass  # pragma: no cover
    assert isinstance(info.value.__cause__, client.BrokerRequestError)
    assert info.value.__cause__.status == 503


async def test_backoff_caps_the_delay_between_attempts(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    policy = ReconnectPolicy(initial_delay_s=0.5, max_delay_s=2.0)
    async with conn.channel(reconnect=policy) as ch:
        await ch.declare_queue("q")
        attempts = fake.attempts
        fake.crash(down_s=60)
        await anyio.sleep(60)
        during = fake.attempts - attempts
        # full jitter, capped at 2 s: at least 30 attempts in 60 s, and not a busy loop
        assert 30 <= during <= 2000
        await ch.publish("", "q", b"after")


@pytest.mark.real_time
async def test_consumer_keeps_consuming_across_crashes(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    n = 500
    seen: list[int] = []
    stale_acks = 0
    async with conn.channel(reconnect=FAST) as prod, conn.channel(reconnect=FAST) as cons:
        await prod.declare_queue("q")

        # Five crashes while the consumer works through the queue: the crashes' spacing
        # and the work per message are set together (the asyncio run waits them out in
        # real time), so that every crash lands while messages are still unconsumed.
        async def crash_sometimes() -> None:
            rng = random.Random(7)
            for _ in range(5):
                await anyio.sleep(rng.uniform(0.25, 1.5))
                fake.crash(down_s=rng.choice([0, 0.5]))

        async with anyio.create_task_group() as nursery:
            nursery.start_soon(crash_sometimes)
            for i in range(n):
                await prod.start_publish("", "q", f"{i}".encode())
            async with cons.consume("q", prefetch=20) as messages:
                async for msg in messages:
                    await anyio.sleep(0.01)  # work
                    seen.append(int(msg.body))
                    if not await msg.ack():
                        stale_acks += 1
                    if set(seen) == set(range(n)):
                        break
            nursery.cancel_scope.cancel()
        await prod.wait_for_confirms()
    assert set(seen) == set(range(n))  # none lost
    assert len(seen) - n <= stale_acks * 20 + 20  # duplicates only from dropped sessions
    assert cons.statistics().reconnects >= 1


async def test_topology_is_redeclared_after_reconnect(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel(reconnect=FAST) as ch:
        await ch.declare_exchange("events", "direct")
        await ch.declare_queue("q")
        await ch.bind_queue("q", "events", "a")
        await ch.declare_queue("gone")
        await ch.delete_queue("gone")
        fake.crash()
        fake.forget_topology()
        await ch.publish("events", "a", b"routed again")
        assert fake.bodies("q") == [b"routed again"]
        assert "gone" not in fake.queues
        declared = [op["op"] for op in fake.ops_seen if op["op"].startswith(("declare", "bind"))]
        assert declared == ["declare_exchange", "declare_queue", "bind", "declare_queue",
                            "declare_exchange", "declare_queue", "bind"]


async def test_a_failing_redeclare_fails_the_channel_instead_of_looping(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel(reconnect=FAST) as ch:
        await ch.declare_exchange("x", "direct")
        fake.crash()
        fake.exchanges["x"] = "fanout"
        with pytest.raises(ConnectionLost) as info:
            await ch.declare_queue("q")
        assert isinstance(info.value.__cause__, ChannelClosedByBroker)
        assert "re-declaring exchange 'x'" in str(info.value)
        assert ch.state == "failed"


async def test_consumers_are_reestablished_with_their_tag(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel(reconnect=FAST) as ch:
        await ch.declare_queue("q")
        async with ch.consume("q", consumer_tag="worker-1", prefetch=5) as messages:
            fake.crash()
            await ch.publish("", "q", b"after the crash")
            msg = await messages.receive()
            assert msg.body == b"after the crash" and msg.consumer_tag == "worker-1"
            assert await msg.ack()
        consumes = [op for op in fake.ops_seen if op["op"] == "consume"]
        assert [op["consumer_tag"] for op in consumes] == ["worker-1", "worker-1"]


async def test_unacked_message_of_a_dropped_session_is_redelivered_and_old_ack_is_stale(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel(reconnect=FAST) as ch:
        await ch.declare_queue("q")
        await ch.publish("", "q", b"job")
        async with ch.consume("q") as messages:
            first = await messages.receive()
            fake.crash()
            await anyio.wait_all_tasks_blocked()
            assert await first.ack() is False  # the session that delivered it is gone
            again = await messages.receive()
            assert again.body == b"job" and again.redelivered
            assert await again.ack() is True
        assert fake.acked_ids == [first.message_id]


async def test_closing_event_holds_new_publishes_for_the_next_session(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel(reconnect=FAST) as ch:
        await ch.declare_queue("q")
        fake.announce_closing()
        await anyio.wait_all_tasks_blocked()
        handle = ch.publish_nowait("", "q", b"x")
        await anyio.wait_all_tasks_blocked()
        assert fake.publishes == 0
        fake.crash()
        await handle
        assert fake.bodies("q") == [b"x"] and fake.publishes == 1


async def test_a_return_is_remembered_across_a_resend(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel(reconnect=FAST) as ch:
        fake.hold_confirms = True
        handle = ch.publish_nowait("", "nowhere", b"x", mandatory=True)
        await anyio.wait_all_tasks_blocked()
        fake.crash()  # the ack was never sent
        fake.hold_confirms = False
        with pytest.raises(PublishReturned):
            await handle
        assert fake.duplicates == 1  # the resend was deduplicated: no second return


async def test_error_without_id_is_blamed_on_the_oldest_request(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    fake.echo_error_ids = False
    async with conn.channel(reconnect=FAST) as ch:
        await ch.declare_exchange("x", "fanout")
        with pytest.raises(ChannelClosedByBroker):
            await ch.declare_exchange("x", "direct")
        await ch.declare_queue("q")


async def test_repeated_errors_without_id_fail_the_channel(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    fake.echo_error_ids = False
    async with conn.channel(reconnect=FAST) as ch:
        handle = ch.publish_nowait("", "k" * 300, b"x")  # the broker ends the channel over it
        with pytest.raises(ConnectionLost) as info:
            await handle
        assert "error naming no operation" in str(info.value)
        assert isinstance(info.value.__cause__, ChannelClosedByBroker)


async def test_buffered_deliveries_of_a_dropped_session_are_not_handed_out(
    fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock
) -> None:
    async with conn.channel(reconnect=FAST) as ch:
        await ch.declare_queue("q")
        for body in (b"0", b"1", b"2"):
            await ch.publish("", "q", body)
        async with ch.consume("q", prefetch=3) as messages:
            first = await messages.receive()
            await anyio.wait_all_tasks_blocked()
            assert messages.buffered == 2
            fake.crash()
            await anyio.wait_all_tasks_blocked()  # the client noticed the drop
            assert messages.buffered == 0
            again = [await messages.receive() for _ in range(3)]
            assert [(m.body, m.redelivered) for m in again] == [(b"0", True), (b"1", True), (b"2", True)]
            assert await first.ack() is False
            for m in again:
                assert await m.ack()
        assert fake.bodies("q") == [] and len(fake.acked_ids) == 3

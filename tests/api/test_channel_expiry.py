"""Delivery ack timeouts on ``POST /channel``: the ``expired`` event, redelivery, the
late-ack error, and ``touch``.

An in-process broker over ``trio.testing`` memory streams with ``autojump_clock``:
virtual time passes only when every task waits, so "nothing happened within 29.9 s"
and "expired at 30 s" are exact, and the tests take no real time.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.support.app import MemoryBroker
from tests.support.channel import ChannelClient, Clients
from tests.support.memory_fixtures import broker, clients  # noqa: F401 (fixtures)


async def consumer(
    clients: Clients, queue: str, n: int = 1, queue_args: dict[str, Any] | None = None, **consume: Any
) -> ChannelClient:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": queue, "arguments": queue_args or {}})
    await ch.send(*[{"op": "publish", "routing_key": queue, "body": f"m{i}"} for i in range(n)])
    await ch.ok({"op": "consume", "queue": queue, "consumer_tag": "c", **consume})
    return ch


def evs(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Compact view: ("deliver", tag, body, redelivered) / ("expired", tag)."""
    out: list[tuple[Any, ...]] = []
    for e in events:
        if e["ev"] == "deliver":
            out.append(("deliver", e["delivery_tag"], e["message"]["body"], e["redelivered"]))
        elif e["ev"] == "expired":
            out.append(("expired", e["delivery_tag"]))
    return out


async def test_unacked_delivery_expires_after_ack_timeout(clients: Clients, autojump_clock: Any) -> None:
    start = trio.current_time()
    ch = await consumer(clients, "exp", n=2, prefetch=1, ack_timeout_ms=30_000)
    assert evs(await ch.sync()) == [("deliver", 1, "m0", False)]
    await trio.sleep(29.9)
    assert evs(await ch.sync()) == []
    expired = await ch.next_event()  # virtual time jumps to the deadline
    assert expired == {"ev": "expired", "consumer_tag": "c", "delivery_tag": 1}
    assert trio.current_time() - start == pytest.approx(30.0)
    # The message went back to its place at the head of the queue, redelivered.
    assert evs(await ch.sync()) == [("deliver", 2, "m0", True)]


async def test_late_ack_of_an_expired_tag_is_a_clear_channel_error(
    broker: MemoryBroker, clients: Clients, autojump_clock: Any
) -> None:
    ch = await consumer(clients, "late", n=1, ack_timeout_ms=1000)
    await ch.sync()
    await ch.expect("expired", delivery_tag=1)
    assert evs(await ch.sync()) == [("deliver", 2, "m0", True)]
    await ch.send({"op": "ack", "delivery_tag": 1, "id": "late"})
    error = await ch.expect("error", id="late", error="delivery_expired")
    assert "1" in error["message"] and "expired" in error["message"]
    assert await ch.remaining_events() == []
    # The channel closed: its unacked redelivery (tag 2) is back in the queue.
    await trio.testing.wait_all_tasks_blocked()
    q = broker.runtime.core.queues["late"]
    assert (q.ready_count(), q.unacked) == (1, 0)


async def test_touch_resets_the_timer(clients: Clients, autojump_clock: Any) -> None:
    start = trio.current_time()
    ch = await consumer(clients, "touchy", n=1, ack_timeout_ms=30_000)
    await ch.sync()
    for _ in range(5):  # 100 s of work, touched every 20 s
        await trio.sleep(20)
        await ch.send({"op": "touch", "delivery_tag": 1})
        assert evs(await ch.sync()) == []
    await ch.expect("expired", delivery_tag=1)
    assert trio.current_time() - start == pytest.approx(100 + 30)


async def test_acked_in_time_never_expires(clients: Clients, autojump_clock: Any) -> None:
    ch = await consumer(clients, "ontime", n=1, ack_timeout_ms=1000)
    await ch.sync()
    await trio.sleep(0.5)
    await ch.send({"op": "ack", "delivery_tag": 1})
    await trio.sleep(3600)
    assert evs(await ch.sync()) == []


async def test_queue_argument_x_consumer_timeout(clients: Clients, autojump_clock: Any) -> None:
    start = trio.current_time()
    ch = await consumer(clients, "qarg", n=1, queue_args={"x-consumer-timeout": 5000})
    await ch.sync()
    await ch.expect("expired", delivery_tag=1)
    assert trio.current_time() - start == pytest.approx(5.0)


async def test_consume_op_timeout_overrides_the_queue_argument(clients: Clients, autojump_clock: Any) -> None:
    start = trio.current_time()
    ch = await consumer(clients, "both", n=1, queue_args={"x-consumer-timeout": 5000}, ack_timeout_ms=60_000)
    await ch.sync()
    await ch.expect("expired", delivery_tag=1)
    assert trio.current_time() - start == pytest.approx(60.0)


async def test_default_ack_timeout_is_30_minutes(clients: Clients, autojump_clock: Any) -> None:
    start = trio.current_time()
    ch = await consumer(clients, "default", n=1)
    await ch.sync()
    await trio.sleep(1799)
    assert evs(await ch.sync()) == []
    await ch.expect("expired", delivery_tag=1)
    assert trio.current_time() - start == pytest.approx(1800.0)


async def test_expired_message_returns_to_its_original_position(clients: Clients, autojump_clock: Any) -> None:
    # m0 and m1 are out; only m1's timer runs out (m0 is touched), and m1 comes back
    # before m2, m3.
    ch = await consumer(clients, "order", n=4, prefetch=2, ack_timeout_ms=10_000)
    assert evs(await ch.sync()) == [("deliver", 1, "m0", False), ("deliver", 2, "m1", False)]
    await trio.sleep(9)
    await ch.send({"op": "touch", "delivery_tag": 1})
    await ch.expect("expired", delivery_tag=2)
    assert evs(await ch.sync()) == [("deliver", 3, "m1", True)]
    await ch.send({"op": "ack", "delivery_tag": 3, "multiple": True})
    assert evs(await ch.sync()) == [("deliver", 4, "m2", False), ("deliver", 5, "m3", False)]


async def test_each_expiry_is_reported_once_per_tag(clients: Clients, autojump_clock: Any) -> None:
    ch = await consumer(clients, "repeat", n=1, ack_timeout_ms=1000)
    await ch.sync()
    seen = []
    for _ in range(3):
        expired = await ch.expect("expired")
        seen.append(expired["delivery_tag"])
        await ch.sync()
    assert seen == [1, 2, 3]  # each redelivery gets its own tag and its own timer


async def test_no_ack_consumers_have_nothing_to_expire(clients: Clients, autojump_clock: Any) -> None:
    ch = await consumer(clients, "auto", n=3, no_ack=True, ack_timeout_ms=1000)
    assert len(evs(await ch.sync())) == 3
    await trio.sleep(3600)
    assert evs(await ch.sync()) == []


@pytest.mark.parametrize(("tag", "code"), [(1, "delivery_expired"), (99, "unknown_delivery_tag")])
async def test_touch_of_a_tag_that_is_not_out_is_an_error(
    clients: Clients, autojump_clock: Any, tag: int, code: str
) -> None:
    ch = await consumer(clients, f"t{tag}", n=1, ack_timeout_ms=1000)
    await ch.sync()
    await ch.expect("expired", delivery_tag=1)
    await ch.send({"op": "touch", "delivery_tag": tag, "id": "t"})
    events = await ch.events_until(lambda e: e["ev"] == "error")
    assert events[-1]["error"] == code and events[-1]["id"] == "t"

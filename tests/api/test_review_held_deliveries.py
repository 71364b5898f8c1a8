"""``Broker.hold_deliveries`` (a quorum leader hands out no message its majority does
not hold yet) as the API sees it: a REST long-poll and a channel consumer waiting on a
held queue are woken when the hold lifts, as ``Replication._deliverable`` lifts it
(the core command, then the runtime's pump), not when their wait runs out."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from broker.app import BrokerApp
from tests.api.test_rest_leases import get, publish, wait_parked
from tests.core.helpers import ready_entries
from tests.support.http import HTTPClient, open_memory_client
from tests.support.sink import RecordingSink


def _lift(app: BrokerApp, queue: str, after_seq: int | None) -> None:
    """What the replication layer does when the majority point moves."""
    app.runtime.core.hold_deliveries(queue, after_seq)
    app.runtime.pump()


def _seqs(app: BrokerApp, queue: str) -> list[int]:
    return sorted(e.message.seq for e in ready_entries(app.runtime.core, queue))


async def test_a_long_poll_on_a_held_queue_is_woken_when_the_hold_lifts(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    await memory_client.put("/queues/q")
    broker_app.runtime.core.hold_deliveries("q", 0)
    async with open_memory_client(broker_app) as publisher:
        await publish(publisher, "q", b"first")
        await publish(publisher, "q", b"second")
    (first, second) = _seqs(broker_app, "q")
    assert await get(memory_client, "q") == []  # held: not handed out
    start = trio.current_time()
    got: list[tuple[float, list[dict[str, Any]]]] = []

    async def long_poll() -> None:
        messages = await get(memory_client, "q", "wait=30&max=5")
        got.append((trio.current_time() - start, messages))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(long_poll)
        await wait_parked(broker_app, "q")
        await trio.sleep(5)
        assert got == []  # still held after 5 s
        _lift(broker_app, "q", first)  # the majority has the first one only
    ((at, messages),) = got
    assert 5 <= at < 6 and [m["body"] for m in messages] == ["first"]
    assert broker_app.runtime.core.queues["q"].getters == 0
    async with trio.open_nursery() as nursery:
        got.clear()
        start = trio.current_time()
        nursery.start_soon(long_poll)
        await wait_parked(broker_app, "q")
        await trio.sleep(2)
        _lift(broker_app, "q", second)
    ((at, messages),) = got
    assert 2 <= at < 3 and [m["body"] for m in messages] == ["second"]


async def test_a_consumer_of_a_held_queue_is_handed_its_messages_when_the_hold_lifts(broker_app: BrokerApp) -> None:
    runtime = broker_app.runtime
    core = runtime.core
    core.declare_queue("q", durable=False)
    core.hold_deliveries("q", 0)
    channel = core.open_channel()
    sink = RecordingSink()
    runtime.add_sink(channel, sink)
    core.consume(channel, "q", consumer_tag="c")
    async with open_memory_client(broker_app) as publisher:
        for body in (b"a", b"b", b"c"):
            await publish(publisher, "q", body)
    await trio.testing.wait_all_tasks_blocked()
    assert sink.bodies() == []  # the consumer waits on the hold, not on an empty queue
    a, b, _c = _seqs(broker_app, "q")
    _lift(broker_app, "q", b)
    assert sink.bodies() == [b"a", b"b"]
    _lift(broker_app, "q", None)
    assert sink.bodies() == [b"a", b"b", b"c"]
    assert a < b

"""Memory back-pressure (docs/operations.md, "Memory and disk alarms"): above the
memory high watermark publishes wait, then are refused (REST ``503`` with
``Retry-After``, a channel's ``nack``), channels get a ``flow`` event, a publisher's
own deadline ends its wait with the reason ``deadline``, and publishing resumes once
memory falls.

The broker's memory reading is a fake (the runtime's ``memory_probe``) so no test
allocates for real; an in-process broker over memory streams with ``autojump_clock``, so the
waits are exact and take no real time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from broker.api.metrics import BrokerMetrics
from tests.support.app import MemoryBroker, open_memory_broker
from tests.support.channel import Clients
from tests.support.http import HTTPClient
from tests.support.memory_fixtures import clients  # noqa: F401 (a fixture)

WATERMARK = 100 << 20  # 100 MiB, absolute


class FakeMemory:
    """The resident size the broker reads: set by the test."""

    def __init__(self) -> None:
        self.used = 10 << 20

    def __call__(self) -> int:
        return self.used


@pytest.fixture
def memory() -> FakeMemory:
    return FakeMemory()


@pytest.fixture
async def broker(memory: FakeMemory) -> AsyncIterator[MemoryBroker]:
    async with open_memory_broker(
        memory_probe=memory, memory_high_watermark=float(WATERMARK), blocked_publish_wait_s=5.0
    ) as broker:
        yield broker


@pytest.fixture
async def http(broker: MemoryBroker) -> AsyncIterator[HTTPClient]:
    async def connect() -> trio.abc.Stream:
        return broker.connect()

    c = HTTPClient(connect)
    try:
        yield c
    finally:
        await c.aclose()


async def alarm(broker: MemoryBroker, memory: FakeMemory, used: int) -> None:
    """Set the memory reading and wait for the monitor's next sample."""
    memory.used = used
    runtime = broker.app.runtime
    with trio.fail_after(5):
        while runtime.memory.used != used:
            await trio.sleep(0.1)


async def publish(http: HTTPClient, body: bytes = b"x", **headers: str) -> Any:
    return await http.post("/exchanges/amq.default/publish?routing_key=q", body=body, headers=headers or None)


async def test_publishes_are_refused_with_503_and_retry_after_above_the_watermark_and_resume_below(
    broker: MemoryBroker, memory: FakeMemory, http: HTTPClient, autojump_clock: Any
) -> None:
    assert (await http.put("/queues/q", json={})).status in (200, 201)
    assert (await publish(http)).status == 200
    await alarm(broker, memory, WATERMARK + 1)
    health = (await http.get("/healthz")).json()
    assert health["publishing_blocked"] is True and health["memory_alarm"] is True
    assert "memory alarm" in health["alarms"]["memory"]

    start = trio.current_time()
    refused = await publish(http)
    assert refused.status == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["reason"].startswith("memory alarm")
    assert trio.current_time() - start == pytest.approx(5.0, abs=0.6)  # it waited first
    assert (await http.get("/queues/q")).json()["messages_ready"] == 1  # not taken

    overview = (await http.get("/overview")).json()
    assert overview["memory"]["alarm"] is True
    assert overview["memory"]["high_watermark_bytes"] == WATERMARK
    assert overview["flow"]["blocked"] is True
    assert overview["file_descriptors"]["limit"] is None or overview["file_descriptors"]["limit"] > 0
    metrics = BrokerMetrics()
    metrics.bind(broker.app.runtime, broker.app.server)
    text = metrics.registry.render()
    assert "ackbus_memory_alarm 1" in text
    assert "ackbus_publishes_refused_blocked_total 1" in text
    assert f"ackbus_memory_bytes {WATERMARK + 1}" in text

    # A publish waiting while memory falls goes through as soon as it does.
    async with trio.open_nursery() as nursery:
        answers: list[Any] = []

        async def waiting() -> None:
            answers.append(await publish(http, b"later"))

        nursery.start_soon(waiting)
        await trio.sleep(2)
        assert answers == []
        memory.used = 10 << 20
    assert answers[0].status == 200
    assert trio.current_time() - start < 5.0 + 2.0 + 1.0
    assert (await http.get("/healthz")).json()["publishing_blocked"] is False
    assert (await http.get("/queues/q")).json()["messages_ready"] == 2


async def test_a_rest_deadline_refuses_with_reason_deadline(
    broker: MemoryBroker, memory: FakeMemory, http: HTTPClient, autojump_clock: Any
) -> None:
    await http.put("/queues/q", json={})
    await alarm(broker, memory, WATERMARK)  # at the watermark: raised
    start = trio.current_time()
    refused = await publish(http, **{"X-Deadline-Ms": "300"})
    assert refused.status == 503
    assert refused.json()["reason"] == "deadline"
    assert trio.current_time() - start == pytest.approx(0.3, abs=0.05)
    bad = await publish(http, **{"X-Deadline-Ms": "soon"})
    assert bad.status == 400 and "X-Deadline-Ms" in bad.json()["message"]


async def test_a_channel_gets_flow_events_deadline_nacks_and_resumes(
    broker: MemoryBroker, memory: FakeMemory, clients: Clients, autojump_clock: Any
) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "q"})
    await ch.send({"op": "publish", "routing_key": "q", "body": "1"})
    await ch.expect("ack", delivery_tag=1)

    await alarm(broker, memory, WATERMARK + 1)
    flow = await ch.next_event()
    assert flow["ev"] == "flow" and flow["active"] is False and flow["reason"].startswith("memory alarm")

    # Its own deadline: nacked with reason "deadline" after 200 ms, not 5 s.
    start = trio.current_time()
    await ch.send({"op": "publish", "routing_key": "q", "body": "2", "deadline_ms": 200})
    nack = await ch.expect("nack", delivery_tag=2)
    assert nack["reason"] == "deadline"
    assert trio.current_time() - start == pytest.approx(0.2, abs=0.05)

    # Without one: waits blocked_publish_wait_s, then the alarm's reason.
    await ch.send({"op": "publish", "routing_key": "q", "body": "3"})
    nack = await ch.expect("nack", delivery_tag=3)
    assert nack["reason"].startswith("memory alarm")
    assert trio.current_time() - start == pytest.approx(5.0, abs=0.6)

    # A channel opened during the alarm is told at once.
    late = await clients.channel()
    assert (await late.next_event())["ev"] == "flow"

    memory.used = 10 << 20
    assert await ch.expect("flow", active=True)
    await ch.send({"op": "publish", "routing_key": "q", "body": "4"})
    await ch.expect("ack", delivery_tag=4)
    assert broker.app.runtime.core.views.queue_counter("messages_ready", "q") == 2


async def test_a_bad_channel_deadline_is_a_channel_error(clients: Clients, autojump_clock: Any) -> None:
    ch = await clients.channel()
    await ch.send({"op": "publish", "routing_key": "q", "deadline_ms": -1, "id": 7})
    error = await ch.expect("error", error="invalid_argument", id=7)
    assert "deadline_ms" in error["message"]


async def test_the_disk_reserve_gives_the_same_signal(
    broker: MemoryBroker, http: HTTPClient, clients: Clients, autojump_clock: Any
) -> None:
    await http.put("/queues/q", json={"durable": False})
    ch = await clients.channel()
    runtime = broker.app.runtime
    runtime.space.on_reserve_used()  # a checkpoint on a full disk used the reserve
    flow = await ch.next_event()
    assert flow["ev"] == "flow" and flow["active"] is False and flow["reason"].startswith("disk full")
    refused = await publish(http)  # transient, to a non-durable queue: blocked all the same
    assert refused.status == 503 and refused.headers["retry-after"] == "5"
    assert refused.json()["reason"].startswith("disk full")
    health = (await http.get("/healthz")).json()
    assert health["publishing_blocked"] is True and health["memory_alarm"] is False
    runtime.space.on_reserve(True)  # the reserve is made again
    await ch.expect("flow", active=True)
    assert (await publish(http)).status == 200

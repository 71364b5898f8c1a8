"""One long poll over several queues (``POST /get``): the first listed queue with
messages answers; while all are empty the request is parked on every one of them (no
polling) and the first message to arrive anywhere wakes it."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.http import HTTPClient, assert_error, open_memory_client

QUEUES = ["urgent", "normal", "bulk"]


async def publish(client: HTTPClient, queue: str, body: bytes) -> None:
    reply = await client.post(f"/exchanges/amq.default/publish?routing_key={queue}", body=body)
    assert reply.json() == {"confirm": "ack", "routed": 1}, reply.body


async def get_any(client: HTTPClient, **body: Any) -> dict[str, Any]:
    reply = await client.post("/get", json={"queues": QUEUES, **body})
    assert reply.status == 200, reply.body
    return reply.json()  # type: ignore[no-any-return]


async def declare_all(client: HTTPClient) -> None:
    for name in QUEUES:
        assert (await client.put(f"/queues/{name}")).status == 201


async def test_the_first_listed_queue_with_messages_answers(memory_client: HTTPClient) -> None:
    await declare_all(memory_client)
    await publish(memory_client, "bulk", b"b1")
    await publish(memory_client, "normal", b"n1")
    await publish(memory_client, "normal", b"n2")
    got = await get_any(memory_client, max=10)
    assert got["queue"] == "normal"
    assert [(m["body"], m["queue"]) for m in got["messages"]] == [("n1", "normal"), ("n2", "normal")]
    got = await get_any(memory_client, max=10)
    assert (got["queue"], [m["body"] for m in got["messages"]]) == ("bulk", ["b1"])
    # leases are settled on their own queue
    reply = await memory_client.post("/queues/bulk/ack", json={"lease_ids": [got["messages"][0]["lease_id"]]})
    assert reply.json() == {"acked": 1}
    assert await get_any(memory_client) == {"messages": []}


async def test_a_parked_get_is_woken_by_the_last_listed_queue(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    await declare_all(memory_client)
    start = trio.current_time()
    got: list[Any] = []

    async def long_poll() -> None:
        got.append(await get_any(memory_client, wait=30))
        got.append(trio.current_time() - start)

    async with open_memory_client(broker_app) as publisher, trio.open_nursery() as nursery:
        nursery.start_soon(long_poll)
        await trio.sleep(7)
        assert all(broker_app.runtime.core.queues[q].getters == 1 for q in QUEUES)  # parked on each
        await publish(publisher, "bulk", b"late")
    assert got[0]["queue"] == "bulk" and got[0]["messages"][0]["body"] == "late"
    assert got[1] == pytest.approx(7)
    assert all(broker_app.runtime.core.queues[q].getters == 0 for q in QUEUES)


async def test_an_empty_wait_elapses_in_virtual_time(
    autojump_clock: trio.testing.MockClock, memory_client: HTTPClient
) -> None:
    await declare_all(memory_client)
    start = trio.current_time()
    assert await get_any(memory_client, wait=12) == {"messages": []}
    assert trio.current_time() - start == pytest.approx(12)


@pytest.mark.parametrize(
    "body",
    [
        {"queues": []},
        {"queues": "urgent"},
        {"queues": ["urgent", "urgent"]},
        {"queues": ["urgent", 7]},
        {"queues": ["urgent", "missing"]},
        {"queues": ["urgent"], "max": 0},
        {"queues": ["urgent"], "max": 1.5},
        {"queues": ["urgent"], "wait": -1},
        {"queues": ["urgent"], "lease": 0},
        {"queues": ["urgent"], "weights": [1, 2]},
        {"queues": ["urgent"], "weights": [0]},
        {"queues": ["urgent"], "weights": ["1"]},
        {"queues": ["urgent"], "priority": 1},
        {},
    ],
)
async def test_bad_requests_are_refused_and_take_nothing(memory_client: HTTPClient, body: dict[str, Any]) -> None:
    await declare_all(memory_client)
    await publish(memory_client, "urgent", b"u")
    reply = await memory_client.post("/get", json=body)
    assert_error(reply, 404 if body.get("queues") == ["urgent", "missing"] else 400,
                 "not_found" if body.get("queues") == ["urgent", "missing"] else "invalid_argument")
    assert (await memory_client.get("/queues/urgent")).json()["messages_ready"] == 1


async def test_weights_share_the_gets_among_the_queues_that_have_messages(memory_client: HTTPClient) -> None:
    await declare_all(memory_client)
    for name in QUEUES:
        for i in range(40):
            await publish(memory_client, name, f"{name}{i}".encode())
    answered = [(await get_any(memory_client, weights=[3, 1, 1]))["queue"] for _ in range(50)]
    assert {q: answered.count(q) for q in QUEUES} == {"urgent": 30, "normal": 10, "bulk": 10}
    assert answered[:5].count("urgent") == 3  # interleaved, not in runs
    # an empty queue's turn goes to the others
    await memory_client.post("/queues/urgent/purge")
    answered = [(await get_any(memory_client, weights=[3, 1, 1]))["queue"] for _ in range(10)]
    assert sorted(set(answered)) == ["bulk", "normal"] and answered.count("normal") == 5

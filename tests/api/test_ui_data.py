"""What the management UI reads besides the entities: the broker's short history of
rates and depths (``GET /overview/history``, ``GET /queues/{name}/history``), each
exchange's message counters, and dead letters counted as arrivals of the queue they
land in."""

from __future__ import annotations

from typing import Any

import trio

from broker.app import BrokerApp
from tests.support.http import HTTPClient, assert_error


async def test_history_is_kept_by_the_broker_from_its_start(app: BrokerApp, client: HTTPClient) -> None:
    history = app.runtime.history
    await client.put("/queues/jobs", json={})
    for _ in range(3):
        assert (await client.post("/exchanges/amq.default/publish?routing_key=jobs", body=b"x")).status == 200
    history.sample()  # the timer's next sample, now
    body = (await client.get("/overview/history")).json()
    assert body["interval_s"] == 5.0
    latest = body["samples"][-1]
    assert latest["published"] >= 3 and latest["messages_ready"] == 3
    assert latest["memory_bytes"] > 0
    assert body["samples"][0]["t"] <= latest["t"] <= body["now"]
    queue = (await client.get("/queues/jobs/history")).json()
    assert queue["samples"][-1]["messages_ready"] == 3
    assert queue["samples"][-1]["published"] == 3
    assert_error(await client.get("/queues/nope/history"), 404, "not_found")


async def test_history_is_bounded(app: BrokerApp, client: HTTPClient) -> None:
    history = app.runtime.history
    await client.put("/queues/late", json={})
    history.sample()
    await client.put("/queues/later", json={})
    for _ in range(history.size + 5):
        history.sample()
    body = (await client.get("/overview/history")).json()
    assert len(body["samples"]) == history.size
    times = [s["t"] for s in body["samples"]]
    assert times == sorted(times)
    assert len((await client.get("/queues/late/history")).json()["samples"]) == history.size
    # a queue declared after the start of the ring: only its own samples
    await client.delete("/queues/late")
    history.sample()
    await client.put("/queues/late", json={})
    history.sample()
    assert len((await client.get("/queues/late/history")).json()["samples"]) == 1


async def test_the_sampler_runs_on_its_timer(autojump_clock: Any) -> None:
    from tests.support.app import open_memory_broker

    async with open_memory_broker() as broker:
        history = broker.app.runtime.history
        start = history.taken
        await trio.sleep(history.interval_s * 3 + 0.1)
        assert history.taken == start + 3


async def test_exchanges_count_messages_in_and_out(client: HTTPClient) -> None:
    await client.put("/exchanges/orders", json={"type": "direct"})
    await client.put("/queues/created", json={})
    await client.post("/bindings", json={"exchange": "orders", "queue": "created", "routing_key": "created"})
    await client.post("/exchanges/orders/publish?routing_key=created", body=b"1")
    await client.post("/exchanges/orders/publish?routing_key=created", body=b"2")
    await client.post("/exchanges/orders/publish?routing_key=nowhere", body=b"3")
    info = (await client.get("/exchanges/orders")).json()
    assert info["message_stats"] == {"messages_in": 3, "messages_out": 2}
    listed = {x["name"]: x for x in (await client.get("/exchanges")).json()["exchanges"]}
    assert listed["orders"]["message_stats"]["messages_in"] == 3


async def test_dead_letters_count_as_arrivals_of_the_dead_letter_queue(client: HTTPClient) -> None:
    await client.put("/exchanges/dlx", json={"type": "fanout"})
    await client.put("/queues/dead", json={})
    await client.post("/bindings", json={"exchange": "dlx", "queue": "dead"})
    await client.put("/queues/work", json={"arguments": {"x-dead-letter-exchange": "dlx"}})
    await client.post("/exchanges/amq.default/publish?routing_key=work", body=b"poison")
    got = (await client.post("/queues/work/get?max=1")).json()
    lease = got["messages"][0]["lease_id"]
    assert (await client.post("/queues/work/nack", json={"lease_ids": [lease], "requeue": False})).status == 200
    dead = (await client.get("/queues/dead")).json()
    assert dead["messages_ready"] == 1
    assert dead["message_stats"]["published"] == 1
    assert (await client.get("/exchanges/dlx")).json()["message_stats"] == {"messages_in": 1, "messages_out": 1}

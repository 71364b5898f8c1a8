"""Priority queues over REST and channels: ``x-max-priority`` at declare (bad values
refused with a reason), the ``priority`` property (``X-Priority`` on a REST publish)
deciding the order of gets and deliveries, ready counts by priority in queue info."""

from __future__ import annotations

import pytest

from tests.support.channel import Clients
from tests.support.http import HTTPClient, assert_error


@pytest.mark.parametrize("value", [-1, 256, "9", None, 1.5])  # (0 is one level, as in RabbitMQ)
async def test_a_bad_x_max_priority_is_refused_and_nothing_declared(client: HTTPClient, value: object) -> None:
    reply = await client.put("/queues/pq", json={"arguments": {"x-max-priority": value}})
    body = assert_error(reply, 400, "invalid_argument")
    assert "x-max-priority" in body["message"]
    assert (await client.get("/queues/pq")).status == 404


async def test_rest_publishes_with_x_priority_come_out_highest_first(client: HTTPClient) -> None:
    reply = await client.put("/queues/pq", json={"arguments": {"x-max-priority": 3}})
    assert reply.status == 201, reply.body
    for body, prio in [(b"low", None), (b"high", "3"), (b"mid", "2"), (b"top", "250"), (b"low2", "0")]:
        headers = {} if prio is None else {"X-Priority": prio}
        reply = await client.post("/exchanges/amq.default/publish?routing_key=pq", body=body, headers=headers)
        assert reply.json() == {"confirm": "ack", "routed": 1}, reply.body
    info = (await client.get("/queues/pq")).json()
    assert info["messages_ready_by_priority"] == {"0": 2, "2": 1, "3": 2}
    got = (await client.post("/queues/pq/get?max=10")).json()["messages"]
    assert [m["body"] for m in got] == ["high", "top", "mid", "low", "low2"]


async def test_a_channel_consumer_receives_by_priority_and_a_nack_goes_back_in_place(clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send({"op": "declare_queue", "queue": "pq", "arguments": {"x-max-priority": 9}, "id": 1})
    await ch.expect("ok", id=1)
    for i, prio in enumerate([1, 9, 1, 5, 9]):
        await ch.send({"op": "publish", "routing_key": "pq", "body": f"m{i}-p{prio}", "properties": {"priority": prio}})
    await ch.events_until(lambda ev: ev["ev"] == "ack" and ev["delivery_tag"] == 5)
    await ch.send({"op": "consume", "queue": "pq", "prefetch": 1, "consumer_tag": "c", "id": 2})
    await ch.expect("consume_ok", id=2)
    first = await ch.expect("deliver")
    assert first["message"]["body"] == "m1-p9"
    await ch.send({"op": "nack", "delivery_tag": first["delivery_tag"], "requeue": True})
    order = []
    for _ in range(5):
        ev = await ch.expect("deliver")
        order.append((ev["message"]["body"], ev["redelivered"]))
        await ch.send({"op": "ack", "delivery_tag": ev["delivery_tag"]})
    assert order == [("m1-p9", True), ("m4-p9", False), ("m3-p5", False), ("m0-p1", False), ("m2-p1", False)]

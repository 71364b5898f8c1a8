"""A lease can only be settled through the queue it came from."""

from __future__ import annotations

from typing import Any


async def test_lease_of_another_queue_is_not_found_and_changes_nothing(client: Any) -> None:
    for q in ("qa", "qb"):
        assert (await client.request("PUT", f"/queues/{q}", json={})).status == 201
    reply = await client.request("POST", "/exchanges/amq.default/publish?routing_key=qa", body=b"x")
    assert reply.status == 200
    lease = (await client.request("POST", "/queues/qa/get")).json()["messages"][0]["lease_id"]
    for verb, body in (("ack", {}), ("nack", {}), ("extend", {"lease": 5})):
        reply = await client.request("POST", f"/queues/qb/{verb}", json={"lease_ids": [lease], **body})
        assert reply.status == 404, reply
    assert (await client.request("GET", "/queues/qa")).json()["messages_unacked"] == 1
    reply = await client.request("POST", "/queues/qa/ack", json={"lease_ids": [lease]})
    assert reply.status == 200 and reply.json()["acked"] == 1
    assert (await client.request("GET", "/queues/qa")).json()["messages"] == 0

"""Headers an AMQP consumer could not be given are refused at the publish on every
HTTP front end (REST, the channel, the management API), with the field named:
field names over 255 bytes, tagged values out of their type's range
(broker/core/fieldtables.py). Nothing of a refused publish is enqueued."""

from __future__ import annotations

import pytest

from tests.support.app import MemoryBroker
from tests.support.channel import open_channel
from tests.support.http import HTTPClient, assert_error
from tests.support.memory_fixtures import api, broker  # noqa: F401 (fixtures)

LONG = "k" * 256


async def ready(api: HTTPClient) -> int:
    return int((await api.get("/queues/q")).json()["messages_ready"])


async def test_rest(api: HTTPClient) -> None:
    await api.put("/queues/q")
    target = "/exchanges/amq.default/publish?routing_key=q"
    body = assert_error(await api.post(target, body=b"x", headers=[(f"X-Header-{LONG}", "v")]), 400, "invalid_argument")
    assert "field name 'kkkk" in body["message"] and "longer than 255 bytes" in body["message"]
    ok = await api.post(target, body=b"x", headers=[(f"X-Header-{LONG[:255]}", "v")])
    assert ok.status == 200, ok.body
    assert await ready(api) == 1


@pytest.mark.parametrize(("headers", "why"), [
    ({LONG: 1}, "longer than 255 bytes"),
    ({"n": [{LONG: 1}]}, "longer than 255 bytes"),
    ({"f": {"$amqp": "float", "value": 1e300}}, "32-bit float"),
    ({"d": {"$amqp": "decimal", "value": "1e10000000"}}, "decimal"),
], ids=["name", "nested", "float", "decimal"])
async def test_channel(broker: MemoryBroker, api: HTTPClient, headers: dict[str, object], why: str) -> None:  # noqa: F811
    await api.put("/queues/q")
    ch = await open_channel(broker.connect())
    await ch.send({"op": "publish", "routing_key": "q", "body": "x", "id": 3, "properties": {"headers": headers}})
    error = await ch.expect("error")
    assert error["error"] == "invalid_argument" and why in error["message"] and error["id"] == 3, error
    assert error["message"].startswith("property headers")
    await ch.aclose()
    assert await ready(api) == 0


async def test_management_api(api: HTTPClient) -> None:
    await api.put("/queues/q")
    reply = await api.post("/api/exchanges/%2F/amq.default/publish", json={
        "properties": {"headers": {LONG: 1}}, "routing_key": "q", "payload": "x", "payload_encoding": "string",
    })
    assert reply.status == 400 and "longer than 255 bytes" in reply.json()["reason"], reply.body
    assert await ready(api) == 0


async def test_a_forwarding_channel_carries_stored_headers(broker: MemoryBroker, api: HTTPClient) -> None:  # noqa: F811
    """A node's forwarding channel (no users here: no principal) carries stored
    messages too (a dead letter of a message kept from before the check): taken."""
    await api.put("/queues/q")
    ch = await open_channel(broker.connect(), headers=[("X-Ackbus-Forwarded", "a")])
    await ch.send({"op": "publish", "routing_key": "q", "body": "x", "properties": {"headers": {LONG: 1}}})
    await ch.expect("ack")
    await ch.aclose()
    assert await ready(api) == 1

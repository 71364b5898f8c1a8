"""Single hostile requests over real HTTP: refused with a reason, changing nothing."""

from __future__ import annotations

from broker.app import BrokerApp
from tests.http.conftest import HTTPClient, assert_error


async def test_head_on_the_stream_endpoint_is_refused_and_consumes_nothing(
    client: HTTPClient, broker_app: BrokerApp
) -> None:
    assert (await client.put("/queues/s")).status == 201
    for i in range(20):
        reply = await client.post(f"/exchanges/amq.default/publish?routing_key=s", body=b"m%d" % i)
        assert reply.status == 200
    reply = await client.request("HEAD", "/queues/s/stream?ack=auto")
    assert reply.status == 405
    assert reply.headers.get("allow") == "GET"
    info = (await client.get("/queues/s")).json()
    assert info["messages_ready"] == 20 and info["messages_unacked"] == 0


async def test_head_on_a_safe_get_still_answers_without_a_body(client: HTTPClient) -> None:
    reply = await client.request("HEAD", "/queues")
    assert reply.status == 200 and reply.body == b""


async def test_a_stray_percent_in_a_queue_name_is_400_and_declares_nothing(
    client: HTTPClient, broker_app: BrokerApp
) -> None:
    for path in ("/queues/%", "/queues/%%", "/queues/a%zz"):
        assert_error(await client.put(path), 400, "invalid_argument")
    assert not any("%" in name for name in broker_app.runtime.core.queues)
    assert (await client.put("/queues/100%25")).status == 201  # an escaped % is fine
    assert "100%" in broker_app.runtime.core.queues

"""Single hostile requests over real HTTP: refused with a reason, changing nothing."""

from __future__ import annotations

from broker.app import BrokerApp
from tests.support.http import HTTPClient, assert_error


async def test_head_on_the_stream_endpoint_is_refused_and_consumes_nothing(
    client: HTTPClient, broker_app: BrokerApp
) -> None:
    assert (await client.put("/queues/s")).status == 201
    for i in range(20):
        reply = await client.post("/exchanges/amq.default/publish?routing_key=s", body=b"m%d" % i)
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


async def test_out_of_range_numeric_headers_are_400_and_count_nothing(
    client: HTTPClient, broker_app: BrokerApp
) -> None:
    assert (await client.put("/queues/n")).status == 201
    before = dict(broker_app.runtime.core.stats)
    for header in (("X-Timestamp", str(1 << 64)), ("X-Expiration", "1" + "0" * 400)):
        reply = await client.post(
            "/exchanges/amq.default/publish?routing_key=n", body=b"x", headers=[header]
        )
        assert_error(reply, 400, "invalid_argument")
    assert dict(broker_app.runtime.core.stats) == before
    assert (await client.get("/queues/n")).json()["messages_ready"] == 0


async def test_deeply_nested_arguments_and_headers_are_400_and_the_broker_lives_on(
    client: HTTPClient, broker_app: BrokerApp
) -> None:
    deep = b'{"a":' * 300 + b'"x"' + b"}" * 300  # (too deep for the client's encoder)
    body = b'{"type": "direct", "arguments": {"d": ' + deep + b"}}"
    reply = await client.put("/exchanges/x", body=body, headers=[("Content-Type", "application/json")])
    assert reply.status == 400
    assert "x" not in broker_app.runtime.core.exchanges
    assert (await client.get("/exchanges")).status == 200
    assert (await client.put("/queues/d")).status == 201
    reply = await client.post(
        "/exchanges/amq.default/publish?routing_key=d",
        body=b"x",
        headers=[("X-Header-a", "b")],
    )
    assert reply.status == 200


async def test_overview_counts_confirmed_publishes(client: HTTPClient) -> None:
    # before: stats.confirmed stayed 0 however many publishes were confirmed
    assert (await client.put("/queues/c")).status == 201
    for _ in range(3):
        reply = await client.post("/exchanges/amq.default/publish?routing_key=c", body=b"x")
        assert reply.status == 200
    assert (await client.get("/overview")).json()["stats"]["confirmed"] == 3

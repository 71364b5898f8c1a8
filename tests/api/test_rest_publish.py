"""One-shot REST publish over real HTTP: confirms, routing, properties in headers
coming back as JSON on get, bodies that are not UTF-8, mandatory, nacks, dedup."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from broker.app import BrokerApp
from broker.http.limits import Limits
from tests.support.app import open_broker_app
from tests.support.http import (
    HTTPClient,
    RawConnection,
    Reply,
    assert_error,
    open_tcp_client,
)
from tests.support.wait import wait_until


async def publish(
    client: HTTPClient, exchange: str, key: str, body: bytes, headers: Any = None, **query: str
) -> Reply:
    target = f"/exchanges/{exchange}/publish?routing_key={key}"
    for name, value in query.items():
        target += f"&{name}={value}"
    return await client.post(target, body=body, headers=headers)


async def get_one(client: HTTPClient, queue: str, **query: Any) -> dict[str, Any]:
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    reply = await client.post(f"/queues/{queue}/get" + (f"?{qs}" if qs else ""))
    assert reply.status == 200, reply.body
    messages = reply.json()["messages"]
    assert len(messages) == 1, messages
    return messages[0]  # type: ignore[no-any-return]


async def ready(client: HTTPClient, queue: str) -> int:
    return int((await client.get(f"/queues/{queue}")).json()["messages_ready"])


async def test_publish_confirms_with_routed_count(client: HTTPClient) -> None:
    await client.put("/exchanges/fan", json={"type": "fanout"})
    for q in ("a", "b"):
        await client.put(f"/queues/{q}")
        await client.post("/bindings", json={"exchange": "fan", "queue": q})
    reply = await publish(client, "fan", "", b"to both")
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"confirm": "ack", "routed": 2}
    assert await ready(client, "a") == await ready(client, "b") == 1


async def test_default_exchange_alias_routes_by_queue_name(client: HTTPClient) -> None:
    await client.put("/queues/jobs")
    assert (await publish(client, "amq.default", "jobs", b"x")).json() == {"confirm": "ack", "routed": 1}
    message = await get_one(client, "jobs")
    assert message["exchange"] == ""  # the default exchange's real name, as in AMQP
    assert message["routing_key"] == "jobs"


async def test_unroutable_without_mandatory_is_acked(client: HTTPClient) -> None:
    reply = await publish(client, "amq.direct", "nobody", b"x")
    assert reply.status == 200
    assert reply.json() == {"confirm": "ack", "routed": 0}


async def test_mandatory_unroutable_is_404_no_route(client: HTTPClient) -> None:
    reply = await publish(client, "amq.direct", "nobody", b"x", mandatory="true")
    body = assert_error(reply, 404, "no_route")
    assert body["confirm"] == "ack" and body["routed"] == 0
    assert "nobody" in body["message"]
    await client.put("/queues/q")
    await client.post("/bindings", json={"exchange": "amq.direct", "queue": "q", "routing_key": "k"})
    assert (await publish(client, "amq.direct", "k", b"x", mandatory="true")).json() == {
        "confirm": "ack",
        "routed": 1,
    }


async def test_properties_from_headers_come_back_on_get(client: HTTPClient) -> None:
    await client.put("/queues/q")
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Encoding", "identity"),
        ("X-Message-Id", "m-1"),
        ("X-Correlation-Id", "c-7"),
        ("X-Reply-To", "replies"),
        ("X-Priority", "5"),
        ("X-Expiration", "60000"),
        ("X-Delivery-Mode", "1"),
        ("X-Type", "order.created"),
        ("X-App-Id", "shop"),
        ("X-Timestamp", "1700000000"),
        ("X-Header-Trace-Id", "abc123"),
        ("X-Header-Tenant", "acme"),
    ]
    assert (await publish(client, "amq.default", "q", b'{"n": 1}', headers)).status == 200
    message = await get_one(client, "q")
    assert message["body"] == '{"n": 1}'
    assert message["properties"] == {
        "content_type": "application/json",
        "content_encoding": "identity",
        "message_id": "m-1",
        "correlation_id": "c-7",
        "reply_to": "replies",
        "priority": 5,
        "expiration": 60000,
        "delivery_mode": 1,
        "type": "order.created",
        "app_id": "shop",
        "timestamp": 1700000000,
        "headers": {"trace-id": "abc123", "tenant": "acme"},
    }
    assert message["redelivered"] is False
    assert isinstance(message["lease_id"], str)


async def test_x_header_headers_route_on_a_headers_exchange(client: HTTPClient) -> None:
    await client.put("/queues/pdf")
    binding = {"exchange": "amq.headers", "queue": "pdf", "arguments": {"x-match": "all", "format": "pdf"}}
    assert (await client.post("/bindings", json=binding)).status == 201
    assert (await publish(client, "amq.headers", "", b"doc", [("X-Header-Format", "pdf")])).json()["routed"] == 1
    assert (await publish(client, "amq.headers", "", b"img", [("X-Header-Format", "png")])).json()["routed"] == 0
    assert (await get_one(client, "pdf"))["properties"] == {"headers": {"format": "pdf"}}


async def test_expired_message_is_not_delivered(client: HTTPClient) -> None:
    await client.put("/queues/q")
    await publish(client, "amq.default", "q", b"stale", [("X-Expiration", "1")])
    published = time.time()  # expiration is wall-clock milliseconds from the publish
    await publish(client, "amq.default", "q", b"fresh", [("X-Expiration", "600000")])
    await wait_until(lambda: time.time() > published + 0.002, interval_s=0.001, what="the 1 ms TTL ran out")
    assert (await get_one(client, "q"))["body"] == "fresh"


async def test_no_properties_and_octet_stream_is_not_a_property(client: HTTPClient) -> None:
    await client.put("/queues/q")
    await publish(client, "amq.default", "q", b"plain", [("Content-Type", "application/octet-stream")])
    message = await get_one(client, "q")
    assert message["properties"] == {}
    assert message["body"] == "plain"


async def test_binary_body_comes_back_as_body_b64(client: HTTPClient) -> None:
    await client.put("/queues/q")
    raw = bytes(range(256))
    await publish(client, "amq.default", "q", raw)
    message = await get_one(client, "q")
    assert "body" not in message
    assert base64.b64decode(message["body_b64"]) == raw


async def test_empty_body(client: HTTPClient) -> None:
    await client.put("/queues/q")
    assert (await publish(client, "amq.default", "q", b"")).status == 200
    assert (await get_one(client, "q"))["body"] == ""


async def test_utf8_body_and_routing_key(client: HTTPClient) -> None:
    await client.put("/exchanges/t", json={"type": "topic"})
    await client.put("/queues/q")
    await client.post("/bindings", json={"exchange": "t", "queue": "q", "routing_key": "café.*"})
    reply = await publish(client, "t", "caf%C3%A9.cr%C3%A8me", "brûlée ✓".encode())
    assert reply.json() == {"confirm": "ack", "routed": 1}
    message = await get_one(client, "q")
    assert message["body"] == "brûlée ✓"
    assert message["routing_key"] == "café.crème"


async def test_header_values_are_utf8(client: HTTPClient, broker_app: BrokerApp) -> None:
    await client.put("/queues/q")
    raw = await RawConnection.open(broker_app.port)
    head = (
        b"POST /exchanges/amq.default/publish?routing_key=q HTTP/1.1\r\nHost: t\r\n"
        b"Content-Length: 1\r\nX-Header-City: " + "Zürich".encode() + b"\r\n"
        b"X-Correlation-Id: " + "réf-1".encode() + b"\r\n\r\nx"
    )
    await raw.send(head)
    assert (await raw.read_response()).json() == {"confirm": "ack", "routed": 1}
    await raw.send(head.replace("Zürich".encode(), b"Z\xfcrich"))  # Latin-1, not UTF-8
    body = assert_error(await raw.read_response(), 400, "invalid_argument")
    assert "x-header-city" in body["message"]
    await raw.aclose()
    message = await get_one(client, "q")
    assert message["properties"] == {"correlation_id": "réf-1", "headers": {"city": "Zürich"}}
    assert await ready(client, "q") == 0


@pytest.mark.parametrize(
    "header, value",
    [
        ("X-Priority", "high"),
        ("X-Priority", "256"),
        ("X-Delivery-Mode", "3"),
        ("X-Expiration", "-1"),
        ("X-Expiration", "soon"),
        ("X-Message-Id", "m" * 256),
    ],
)
async def test_bad_property_headers(client: HTTPClient, header: str, value: str) -> None:
    await client.put("/queues/q")
    body = assert_error(await publish(client, "amq.default", "q", b"x", [(header, value)]), 400, "invalid_argument")
    assert header.lower().removeprefix("x-").replace("-", "_") in body["message"].replace("-", "_")
    assert await ready(client, "q") == 0


async def test_bad_query(client: HTTPClient) -> None:
    await client.put("/queues/q")
    assert_error(await publish(client, "amq.default", "q", b"x", mandatory="perhaps"), 400, "invalid_argument")
    # A typo must not silently publish with an empty routing key.
    body = assert_error(await client.post("/exchanges/amq.direct/publish?routing-key=q", body=b"x"), 400, "invalid_argument")
    assert "routing-key" in body["message"]
    assert_error(await publish(client, "amq.default", "q" * 256, b"x"), 400, "invalid_argument")
    assert_error(
        await client.post("/exchanges/amq.default/publish?routing_key=q&routing_key=r", body=b"x"),
        400,
        "invalid_argument",
    )
    assert await ready(client, "q") == 0


async def test_publish_to_unknown_exchange(client: HTTPClient) -> None:
    body = assert_error(await publish(client, "nope", "k", b"x"), 404, "not_found")
    assert "nope" in body["message"]


async def test_publish_to_internal_exchange_is_refused(client: HTTPClient) -> None:
    await client.put("/exchanges/inner", json={"type": "fanout", "internal": True})
    await client.put("/queues/q")
    await client.post("/bindings", json={"exchange": "inner", "queue": "q"})
    assert_error(await publish(client, "inner", "", b"x"), 403, "access_refused")
    assert await ready(client, "q") == 0


async def test_nack_when_queue_full_with_reject_publish(client: HTTPClient, broker_app: BrokerApp) -> None:
    await client.put("/queues/small", json={"arguments": {"x-max-length": 1, "x-overflow": "reject-publish"}})
    assert (await publish(client, "amq.default", "small", b"1")).json() == {"confirm": "ack", "routed": 1}
    reply = await publish(client, "amq.default", "small", b"2")
    body = assert_error(reply, 503, "nack")
    assert body["confirm"] == "nack"
    assert "full" in body["reason"] and "full" in body["message"]
    assert await ready(client, "small") == 1
    assert (await get_one(client, "small"))["body"] == "1"
    assert broker_app.runtime.core.stats["nacked"] == 1


async def test_nack_when_storage_fails(client: HTTPClient, broker_app: BrokerApp) -> None:
    await client.put("/queues/q")
    core = broker_app.runtime.core
    core.storage_failed(core.last_lsn + 1, core.last_lsn + 1, "disk full")  # as the WAL reports it
    body = assert_error(await publish(client, "amq.default", "q", b"x"), 503, "nack")
    assert "disk full" in body["reason"]
    # Transient messages need no disk: still taken.
    assert (await publish(client, "amq.default", "q", b"y", [("X-Delivery-Mode", "1")])).status == 200
    core.storage_recovered()
    assert (await publish(client, "amq.default", "q", b"z")).status == 200
    assert [(await get_one(client, "q"))["body"] for _ in range(2)] == ["y", "z"]


async def test_duplicate_message_id_is_acked_once_enqueued(client: HTTPClient) -> None:
    await client.put("/queues/q")
    headers = [("X-Message-Id", "order-42")]
    assert (await publish(client, "amq.default", "q", b"x", headers)).json() == {"confirm": "ack", "routed": 1}
    again = await publish(client, "amq.default", "q", b"x", headers)
    assert again.status == 200
    assert again.json() == {"confirm": "ack", "routed": 0}
    assert await ready(client, "q") == 1


async def test_body_over_the_default_16_mib_is_413(client: HTTPClient, broker_app: BrokerApp) -> None:
    await client.put("/queues/q")
    raw = await RawConnection.open(broker_app.port)
    # The declared length is refused before a byte of the body is read.
    await raw.send(
        b"POST /exchanges/amq.default/publish?routing_key=q HTTP/1.1\r\nHost: t\r\n"
        b"Content-Length: %d\r\n\r\n" % (16 * 1024 * 1024 + 1)
    )
    reply = await raw.read_response()
    assert_error(reply, 413, "payload_too_large")
    assert reply.headers["connection"] == "close"
    await raw.aclose()
    assert await ready(client, "q") == 0
    assert broker_app.runtime.core.stats["published"] == 0


async def test_body_at_the_configured_limit_passes_one_more_byte_is_413() -> None:
    async with open_broker_app(Limits(max_body_bytes=1024, linger_s=0.2)) as app, open_tcp_client(app.port) as client:
        await client.put("/queues/q")
        assert (await publish(client, "amq.default", "q", b"x" * 1024)).status == 200
        assert_error(await publish(client, "amq.default", "q", b"x" * 1025), 413, "payload_too_large")
        # Chunked: no declared length, the running total is checked.
        conn = await client.connection()
        await conn.send_head("POST", "/exchanges/amq.default/publish?routing_key=q")
        for _ in range(3):
            await conn.send_data(b"y" * 500)
        reply = await conn.receive_response()
        assert_error(reply, 413, "payload_too_large")
        assert await ready(client, "q") == 1

"""Bad input against the broker's REST API: each gets a clear JSON error or a clean
close, the broker keeps serving everyone else, and nothing changes half-way.

Malformed and abusive requests are written as raw bytes. Time-outs run on
``autojump_clock`` over memory streams, so the 10-second header timeout costs nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.http import HTTPClient, RawConnection, assert_error


async def still_serving(client: HTTPClient) -> None:
    reply = await client.get("/healthz")
    assert reply.status == 200


@asynccontextmanager
async def open_raw_memory(app: BrokerApp) -> AsyncIterator[RawConnection]:
    """A raw connection over a memory stream served by ``app``'s server."""
    client_side, server_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app.server.serve_stream, server_side)
        raw = RawConnection(client_side)
        try:
            yield raw
        finally:
            await raw.aclose()


# -- paths and methods -------------------------------------------------------------


async def test_unknown_path_is_404_and_the_connection_stays(client: HTTPClient) -> None:
    conn = await client.connection()
    reply = await conn.request("GET", "/nowhere")
    body = assert_error(reply, 404, "not_found")
    assert "/nowhere" in body["message"]
    assert conn.reusable
    assert (await conn.request("GET", "/healthz")).status == 200


@pytest.mark.parametrize(
    "method, target, allow",
    [
        ("PATCH", "/queues/q", "DELETE, GET, HEAD, PUT"),
        ("POST", "/queues", "GET, HEAD"),
        ("DELETE", "/healthz", "GET, HEAD"),
        ("GET", "/exchanges/x/publish", "POST"),
        ("PUT", "/bindings", "DELETE, GET, HEAD, POST"),
        ("BREW", "/overview", "GET, HEAD"),
    ],
)
async def test_wrong_method_is_405_with_allow(client: HTTPClient, method: str, target: str, allow: str) -> None:
    reply = await client.request(method, target)
    assert_error(reply, 405, "method_not_allowed")
    assert reply.headers["allow"] == allow
    await still_serving(client)


async def test_unknown_query_parameter(client: HTTPClient) -> None:
    await client.put("/queues/q")
    body = assert_error(await client.delete("/queues/q?if_emtpy=true"), 400, "invalid_argument")
    assert "if_emtpy" in body["message"] and "if_empty" in body["message"]
    assert_error(await client.get("/queues?pgae=2"), 400, "invalid_argument")  # page= is known
    assert (await client.get("/queues/q")).status == 200


async def test_path_that_does_not_decode(client: HTTPClient) -> None:
    assert_error(await client.put("/queues/%FF"), 400, "invalid_argument")
    assert (await client.get("/queues")).json() == {"queues": []}


# -- malformed HTTP ------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"this is not http\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 requires Host
        (b"POST /queues/q/purge HTTP/1.1\r\nHost: t\r\nContent-Length: ten\r\n\r\n", 400),
        (b"POST /queues/q/purge HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    ],
)
async def test_malformed_http_gets_a_json_error_and_a_close(
    client: HTTPClient, broker_app: BrokerApp, request_bytes: bytes, status: int
) -> None:
    raw = await RawConnection.open(broker_app.port)
    await raw.send(request_bytes)
    reply = await raw.read_response()
    assert reply.status == status
    assert reply.json()["error"]
    assert "b'" not in reply.json()["message"] and "bytearray" not in reply.json()["message"]  # no reprs
    assert reply.headers["connection"] == "close"
    assert await raw.at_eof()
    await raw.aclose()
    await still_serving(client)


async def test_bad_chunked_body_changes_nothing(client: HTTPClient, broker_app: BrokerApp) -> None:
    await client.put("/queues/q")
    raw = await RawConnection.open(broker_app.port)
    await raw.send(
        b"POST /exchanges/amq.default/publish?routing_key=q HTTP/1.1\r\nHost: t\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"
    )
    reply = await raw.read_response()
    assert_error(reply, 400, "bad_request")
    await raw.aclose()
    assert (await client.get("/queues/q")).json()["messages_ready"] == 0
    assert broker_app.runtime.core.stats["published"] == 0


async def test_client_leaving_mid_body_publishes_nothing(client: HTTPClient, broker_app: BrokerApp) -> None:
    await client.put("/queues/q")
    raw = await RawConnection.open(broker_app.port)
    await raw.send(
        b"POST /exchanges/amq.default/publish?routing_key=q HTTP/1.1\r\nHost: t\r\n"
        b"Content-Length: 100\r\n\r\n" + b"x" * 50
    )
    await raw.aclose()
    with trio.fail_after(10):
        while broker_app.server.statistics().open_connections > 1:  # only `client` is left
            await trio.sleep(0.001)
    assert broker_app.runtime.core.stats["published"] == 0
    assert (await client.get("/queues/q")).json()["messages_ready"] == 0


async def test_header_flood_is_431(client: HTTPClient, broker_app: BrokerApp) -> None:
    too_many = b"".join(b"X-Header-H%d: v\r\n" % n for n in range(101))
    too_big = b"X-Header-Big: " + b"v" * (64 * 1024) + b"\r\n"
    for extra in (too_many, too_big):
        raw = await RawConnection.open(broker_app.port)
        await raw.send(b"POST /exchanges/amq.direct/publish HTTP/1.1\r\nHost: t\r\n" + extra + b"\r\n")
        reply = await raw.read_response()
        assert_error(reply, 431, "header_fields_too_large")
        await raw.aclose()
    assert broker_app.runtime.core.stats["published"] == 0
    await still_serving(client)


async def test_expect_100_continue_publish(client: HTTPClient, broker_app: BrokerApp) -> None:
    """curl sends ``Expect: 100-continue`` for bodies over 1 KiB."""
    await client.put("/queues/q")
    raw = await RawConnection.open(broker_app.port)
    await raw.send(
        b"POST /exchanges/amq.default/publish?routing_key=q HTTP/1.1\r\nHost: t\r\n"
        b"Content-Length: 2000\r\nExpect: 100-continue\r\n\r\n"
    )
    assert (await raw._until(b"\r\n\r\n")).startswith(b"HTTP/1.1 100 ")
    await raw.send(b"x" * 2000)
    reply = await raw.read_response()
    assert reply.json() == {"confirm": "ack", "routed": 1}
    await raw.aclose()


async def test_http_1_0_request(broker_app: BrokerApp) -> None:
    raw = await RawConnection.open(broker_app.port)
    await raw.send(b"GET /healthz HTTP/1.0\r\n\r\n")
    reply = await raw.read_response()
    assert reply.status == 200
    assert reply.json()["ready"] is True
    assert await raw.at_eof()
    await raw.aclose()


# -- slow and silent clients -----------------------------------------------------


async def test_silent_client_is_closed_others_served(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    async with open_raw_memory(broker_app) as silent:
        start = trio.current_time()
        await memory_client.put("/queues/q")  # served while the silent one waits
        assert await silent.at_eof()  # closed without a response: it never asked anything
        assert trio.current_time() - start == pytest.approx(broker_app.server.limits.header_timeout_s)
    await still_serving(memory_client)


async def test_slow_header_is_408(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    """A slowloris client, one byte a second: answered 408 once the header timeout
    passes, although every byte arrived within the idle time of the previous one."""
    timeout_s = broker_app.server.limits.header_timeout_s
    head = b"PUT /queues/slow HTTP/1.1\r\nHost: t\r\nX-Header-Pad: " + b"p" * 100
    async with open_raw_memory(broker_app) as slow:
        start = trio.current_time()
        try:
            for byte in head:
                await slow.send(bytes([byte]))
                await trio.sleep(1)
        except trio.BrokenResourceError:
            pass
        reply = await slow.read_response()
        assert_error(reply, 408, "request_timeout")
        assert trio.current_time() - start < timeout_s + 2
        await still_serving(memory_client)
    assert (await memory_client.get("/queues")).json() == {"queues": []}


async def test_stalled_body_is_408_and_publishes_nothing(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    await memory_client.put("/queues/q")
    async with open_raw_memory(broker_app) as slow:
        await slow.send(
            b"POST /exchanges/amq.default/publish?routing_key=q HTTP/1.1\r\nHost: t\r\n"
            b"Content-Length: 10\r\n\r\nhalf"
        )
        reply = await slow.read_response()
        body = assert_error(reply, 408, "request_timeout")
        assert str(int(broker_app.server.limits.body_timeout_s)) in body["message"]
    assert (await memory_client.get("/queues/q")).json()["messages_ready"] == 0

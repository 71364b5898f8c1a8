"""The HTTP layer: URLs, REST keep-alive and retry, errors, real TCP."""

from __future__ import annotations

import socket

import anyio
import anyio.abc
import pytest
from trio.testing import MockClock

import client
from client import BrokerRequestError, ConnectionLost
from client.endpoint import Endpoint, open_tcp
from client.transport import Response, error_from_response
from tests.client.fakebroker import FakeBroker, open_fake_broker
from tests.support.memstream import memory_stream_pair

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "url, scheme, host, port, prefix, host_header",
    [
        ("http://127.0.0.1:8080", "http", "127.0.0.1", 8080, "", "127.0.0.1:8080"),
        ("http://broker", "http", "broker", 80, "", "broker"),
        ("https://broker/ackbus/", "https", "broker", 443, "/ackbus", "broker"),
        ("http://[::1]:9000", "http", "::1", 9000, "", "[::1]:9000"),
    ],
)
def test_endpoint_parse(url: str, scheme: str, host: str, port: int, prefix: str, host_header: str) -> None:
    ep = Endpoint.parse(url)
    assert (ep.scheme, ep.host, ep.port, ep.prefix, ep.host_header) == (scheme, host, port, prefix, host_header)


@pytest.mark.parametrize("url", ["ftp://x", "127.0.0.1:8080", "http://"])
def test_endpoint_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        Endpoint.parse(url)


def test_target_encodes_the_query() -> None:
    ep = Endpoint.parse("http://h/p")
    assert ep.target("/queues/a%2Fb/get", {"max": 2, "wait": None, "ack": True}) == "/p/queues/a%2Fb/get?max=2&ack=true"


def test_error_bodies() -> None:
    err = error_from_response(Response(409, [], b'{"error": "precondition_failed", "message": "differs"}'))
    assert (err.status, err.code, err.message) == (409, "precondition_failed", "differs")
    err = error_from_response(Response(502, [], b"<html>bad gateway</html>"))
    assert (err.status, err.code) == (502, "http_error") and "bad gateway" in err.message
    assert "HTTP 502" in str(err)


async def test_rest_calls_reuse_one_keep_alive_connection(fake: FakeBroker, conn: client.Connection) -> None:
    await conn.declare_queue("a")
    await conn.declare_queue("b")
    assert [q.name for q in await conn.list_queues()] == ["a", "b"]
    info = await conn.queue_info("a")
    assert (info.name, info.messages, info.consumers) == ("a", 0, 0)
    assert fake.connects == 1


async def test_a_stale_keep_alive_connection_is_retried_once(fake: FakeBroker, conn: client.Connection) -> None:
    assert await conn.healthy()
    fake.crash()  # the server drops the idle connection
    await anyio.wait_all_tasks_blocked()
    assert await conn.healthy()
    assert fake.connects == 2


async def test_rest_errors(fake: FakeBroker, conn: client.Connection) -> None:
    with pytest.raises(BrokerRequestError) as info:
        await conn.queue_info("missing")
    assert (info.value.status, info.value.code) == (404, "not_found")
    fake.refuse = True
    fake.crash()
    with pytest.raises(ConnectionLost) as lost:
        await conn.list_queues()
    assert isinstance(lost.value.__cause__, ConnectionRefusedError)


async def test_rest_timeout_is_connection_lost(autojump_clock: MockClock) -> None:
    peers = []

    async def silent(endpoint: Endpoint) -> anyio.abc.ByteStream:
        a, b = memory_stream_pair()
        peers.append(b)  # nobody answers
        return a

    async with client.connect("http://x", open_stream=silent, request_timeout_s=5) as conn:
        with pytest.raises(ConnectionLost, match="within 5"):
            await conn.list_queues()


async def test_leased_get_ack_and_nack(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        await ch.publish("", "q", b"1")
        await ch.publish("", "q", b"2")
    (m1, m2) = await conn.get("q", max_messages=5, lease_s=10)
    assert (m1.body, m1.routing_key, m1.redelivered) == (b"1", "q", False)
    await m1.ack()
    await m2.nack()
    assert fake.bodies("q") == [b"2"]


async def test_over_real_tcp() -> None:
    """The default connector: a real loopback socket (keepalive options set)."""
    async with open_fake_broker() as fake:

        async def handler(stream: anyio.abc.SocketStream) -> None:
            await fake._serve_connection(stream)

        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        async with listener, anyio.create_task_group() as nursery:
            nursery.start_soon(listener.serve, handler)
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            async with client.connect(f"http://127.0.0.1:{port}") as conn:
                assert await conn.healthy()
                async with conn.channel() as ch:
                    await ch.declare_queue("q")
                    await ch.publish("", "q", b"over tcp")
            assert fake.bodies("q") == [b"over tcp"]
            nursery.cancel_scope.cancel()


async def test_channel_sockets_send_small_writes_at_once() -> None:
    """TCP_NODELAY (set by anyio's socket streams) and keepalive on the default
    connector: a lone publish or ack must not wait for Nagle's algorithm."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as nursery:
        nursery.start_soon(listener.serve, anyio.aclose_forcefully)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        stream = await open_tcp(Endpoint("http", "127.0.0.1", port))
        assert isinstance(stream, anyio.abc.SocketStream)
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        await stream.aclose()
        nursery.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def test_bad_settings_and_urls_fail_early() -> None:
    with pytest.raises(ValueError):
        async with client.connect("ftp://x"):
            pass  # pragma: no cover
    with pytest.raises(ValueError):
        async with client.connect("http://x", max_pending=0):
            pass  # pragma: no cover
    with pytest.raises(TypeError):
        async with client.connect("http://x", no_such_setting=1):
            pass  # pragma: no cover

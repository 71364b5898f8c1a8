"""TLS: the server speaks HTTPS with certificates made in the test (trustme), requires
client certificates for mutual TLS, swaps its certificate without dropping open
connections, and survives clients that fail or stall the handshake."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import h11
import pytest
import trio
import trio.testing
import trustme

from broker.http import HTTPServer, Limits, Router, server_ssl_context
from tests.support.http import HTTPConnection


def write_pair(tmp_path: Path, ca: trustme.CA, name: str) -> tuple[Path, Path]:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert.private_key_pem.write_to_path(str(key_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for blob in cert.cert_chain_pems[1:]:
        blob.write_to_path(str(cert_path), append=True)
    return cert_path, key_path


def client_context(ca: trustme.CA, client_cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if client_cert is not None:
        client_cert.configure_cert(context)
    return context


def app() -> Router:
    router = Router()

    @router.route("GET", "/hello")
    async def hello(request: object, response: object) -> None:
        await response.send_json(200, {"hello": "tls"})  # type: ignore[attr-defined]

    return router


@asynccontextmanager
async def serving(context: ssl.SSLContext, limits: Limits | None = None) -> AsyncIterator[tuple[HTTPServer, int]]:
    server = HTTPServer(app(), limits=limits or Limits(linger_s=0.1))
    server.set_ssl_context(context)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(server.serve_tcp, 0, host="127.0.0.1"))
        yield server, server.ports[0]
        nursery.cancel_scope.cancel()


async def https(port: int, context: ssl.SSLContext) -> HTTPConnection:
    raw = await trio.open_tcp_stream("127.0.0.1", port)
    stream = trio.SSLStream(raw, context, server_hostname="localhost", https_compatible=True)
    try:
        await stream.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(raw)
        raise
    return HTTPConnection(stream)


async def test_https_serves_and_plain_http_is_refused(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = write_pair(tmp_path, ca, "server")
    async with serving(server_ssl_context(cert, key)) as (server, port):
        conn = await https(port, client_context(ca))
        reply = await conn.request("GET", "/hello")
        assert reply.status == 200 and reply.json() == {"hello": "tls"}
        # keep-alive works over TLS
        assert (await conn.request("GET", "/hello")).status == 200
        await conn.aclose()
        # a plain-HTTP client gets its connection closed, and the server goes on
        plain = await trio.open_tcp_stream("127.0.0.1", port)
        await plain.send_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.fail_after(5):
            while await plain.receive_some(4096):
                pass
        await plain.aclose()
        # a client that does not trust the server's CA fails its own handshake
        with pytest.raises(trio.BrokenResourceError):
            await https(port, client_context(trustme.CA()))
        conn = await https(port, client_context(ca))
        assert (await conn.request("GET", "/hello")).status == 200
        await conn.aclose()
        assert server.statistics().tls_handshake_failures >= 2


async def test_mutual_tls_requires_a_client_certificate_from_the_client_ca(tmp_path: Path) -> None:
    ca, client_ca = trustme.CA(), trustme.CA()
    cert, key = write_pair(tmp_path, ca, "server")
    client_ca_path = tmp_path / "clients.pem"
    client_ca.cert_pem.write_to_path(str(client_ca_path))
    async with serving(server_ssl_context(cert, key, client_ca_path)) as (_server, port):
        good = await https(port, client_context(ca, client_ca.issue_cert("service-a")))
        assert (await good.request("GET", "/hello")).status == 200
        await good.aclose()
        for bad in (None, trustme.CA().issue_cert("intruder")):
            conn = None
            # TLS 1.3: the server's refusal shows on the client's first read, as the
            # connection ending before any response
            with pytest.raises((trio.BrokenResourceError, h11.RemoteProtocolError)):
                conn = await https(port, client_context(ca, bad))
                await conn.request("GET", "/hello")
            if conn is not None:
                await trio.aclose_forcefully(conn.stream)


async def test_a_new_certificate_serves_new_connections_and_open_ones_stay(tmp_path: Path) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    cert, key = write_pair(tmp_path, old_ca, "old")
    async with serving(server_ssl_context(cert, key)) as (server, port):
        kept = await https(port, client_context(old_ca))
        assert (await kept.request("GET", "/hello")).status == 200
        new_cert, new_key = write_pair(tmp_path, new_ca, "new")
        server.set_ssl_context(server_ssl_context(new_cert, new_key))
        fresh = await https(port, client_context(new_ca))
        assert (await fresh.request("GET", "/hello")).status == 200
        with pytest.raises(trio.BrokenResourceError):
            await https(port, client_context(old_ca))  # the old certificate is gone...
        assert (await kept.request("GET", "/hello")).status == 200  # ...but not its connection
        await kept.aclose()
        await fresh.aclose()


def test_unreadable_or_mismatched_files_are_clear_errors(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = write_pair(tmp_path, ca, "a")
    _cert_b, key_b = write_pair(tmp_path, ca, "b")
    with pytest.raises(OSError):
        server_ssl_context(tmp_path / "missing.pem", key)
    with pytest.raises(ssl.SSLError):
        server_ssl_context(cert, key_b)


async def test_a_stalled_handshake_is_closed_after_the_header_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ca = trustme.CA()
    cert, key = write_pair(tmp_path, ca, "server")
    server = HTTPServer(app(), limits=Limits(header_timeout_s=10, send_timeout_s=None))
    server.set_ssl_context(server_ssl_context(cert, key))
    client, server_side = trio.testing.memory_stream_pair()
    started = trio.current_time()
    await server.serve_stream(server_side)  # the client never says hello
    assert trio.current_time() - started == pytest.approx(10)
    assert server.statistics().tls_handshake_failures == 1
    await client.aclose()


async def test_over_the_connection_limit_a_tls_client_is_closed_and_others_go_on(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = write_pair(tmp_path, ca, "server")
    async with serving(server_ssl_context(cert, key), Limits(max_connections_per_address=1, linger_s=0.1)) as (
        server,
        port,
    ):
        first = await https(port, client_context(ca))
        with pytest.raises(trio.BrokenResourceError):
            await https(port, client_context(ca))
        assert (await first.request("GET", "/hello")).status == 200
        assert server.statistics().rejected_connections == 1
        await first.aclose()

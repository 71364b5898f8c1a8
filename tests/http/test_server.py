"""The HTTP server over real loopback TCP, driven with hand-written request bytes.

Raw bytes (not an HTTP client library) so that malformed, pipelined, half-sent and
abandoned requests can be sent exactly as a hostile or buggy client would.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from broker.http.connection import Request, Response
from broker.http.errors import ClientDisconnected, PayloadTooLarge
from broker.http.errors import NoSuchEndpoint as NotFound
from broker.http.limits import Limits
from broker.http.router import Router
from broker.http.server import HTTPServer, serve_http

# -- a tiny, strict HTTP/1.1 response reader for tests ---------------------------


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""

    def json(self) -> Any:
        return orjson.loads(self.body)


class Reader:
    """Reads responses off a raw stream: heads, bodies by length, chunks, or to EOF."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(65536)
        self.buf += data
        return bool(data)

    async def _until(self, sep: bytes) -> bytes:
        while (index := self.buf.find(sep)) < 0:
            if not await self._fill():
                raise EOFError(bytes(self.buf))
        out = bytes(self.buf[: index + len(sep)])
        del self.buf[: index + len(sep)]
        return out

    async def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not await self._fill():
                raise EOFError(bytes(self.buf))
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def head(self) -> Reply:
        raw = await self._until(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return Reply(status, headers)

    async def chunk(self) -> bytes:
        size = int((await self._until(b"\r\n"))[:-2], 16)
        if size == 0:
            await self._until(b"\r\n")  # no trailers in our tests
            return b""
        data = await self._exact(size)
        assert await self._exact(2) == b"\r\n"
        return data

    async def rest(self) -> bytes:
        while await self._fill():
            pass
        out = bytes(self.buf)
        self.buf.clear()
        return out

    async def response(self) -> Reply:
        reply = await self.head()
        while 100 <= reply.status < 200:
            reply = await self.head()
        if "content-length" in reply.headers:
            reply.body = await self._exact(int(reply.headers["content-length"]))
        elif reply.headers.get("transfer-encoding") == "chunked":
            parts = []
            while part := await self.chunk():
                parts.append(part)
            reply.body = b"".join(parts)
        else:
            reply.body = await self.rest()
        return reply

    async def at_eof(self) -> bool:
        return not self.buf and not await self._fill()


# -- the app under test ---------------------------------------------------------


@dataclass
class Seen:
    """What handlers observed, for assertions."""

    events: list[Any] = field(default_factory=list)
    disconnected: trio.Event = field(default_factory=trio.Event)
    release: trio.Event = field(default_factory=trio.Event)
    started: trio.Event = field(default_factory=trio.Event)


def make_app(seen: Seen) -> Router:
    router = Router()

    @router.route("GET", "/healthz")
    async def healthz(request: Request, response: Response) -> None:
        await response.send_json(200, {"ok": True})

    @router.route("PUT", "/queues/{name}")
    async def declare(request: Request, response: Response) -> None:
        body = await request.read_json(default={})
        await response.send_json(200, {"name": request.path_params["name"], "body": body})

    @router.route("POST", "/exchanges/{name}/publish")
    async def publish(request: Request, response: Response) -> None:
        routing_key = request.query.get_str("routing_key", "")
        mandatory = request.query.get_bool("mandatory", False)
        body = await request.read_body()
        await response.send_json(
            200,
            {
                "exchange": request.path_params["name"],
                "routing_key": routing_key,
                "mandatory": mandatory,
                "size": len(body),
                "content_type": request.headers.get("content-type"),
            },
        )

    @router.route("POST", "/queues/{name}/get")
    async def get(request: Request, response: Response) -> None:
        count = request.query.get_int("max", 1, min_value=1, max_value=100)
        wait = request.query.get_float("wait", 0.0, min_value=0, max_value=60)
        await response.send_json(200, {"max": count, "wait": wait})

    @router.route("GET", "/echo/{n}")
    async def echo_n(request: Request, response: Response) -> None:
        await response.send_json(200, {"n": request.path_params["n"]})

    @router.route("GET", "/missing")
    async def missing(request: Request, response: Response) -> None:
        raise NotFound("queue 'x' does not exist")

    @router.route("GET", "/crash")
    async def crash(request: Request, response: Response) -> None:
        raise RuntimeError("boom")

    @router.route("GET", "/silent")
    async def silent(request: Request, response: Response) -> None:
        pass

    @router.route("GET", "/bytes")
    async def raw_bytes(request: Request, response: Response) -> None:
        await response.send_bytes(200, b"\x00\x01", headers={"x-kind": "raw"})

    @router.route("DELETE", "/queues/{name}")
    async def delete(request: Request, response: Response) -> None:
        await response.send_empty(204)

    @router.route("POST", "/ignore-body")
    async def ignore_body(request: Request, response: Response) -> None:
        await response.send_json(200, {"ignored": True})

    @router.route("POST", "/duplex")
    async def duplex(request: Request, response: Response) -> None:
        """Echo each chunk back as soon as it arrives: a full-duplex exchange."""
        await response.start(200, content_type="application/x-ndjson")
        try:
            async for chunk in request.iter_body(max_bytes=None, timeout_s=None):
                await response.send(b"echo:" + chunk)
        except ClientDisconnected as exc:
            seen.events.append(exc)
            seen.disconnected.set()
            raise
        await response.end()

    @router.route("GET", "/stream")
    async def stream(request: Request, response: Response) -> None:
        """Stream until the client leaves; record how the handler learned of it."""
        await response.start(200, content_type="application/x-ndjson")
        seen.started.set()
        try:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    await request.wait_disconnected()
                    seen.events.append("wait_disconnected returned")
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                while True:
                    await response.send(b'{"tick":1}\n')
                    await trio.sleep(0.01)
        finally:
            seen.disconnected.set()

    @router.route("GET", "/wait-closing")
    async def wait_closing(request: Request, response: Response) -> None:
        await response.start(200, content_type="application/x-ndjson")
        seen.started.set()
        await request.server_closing.wait()
        await response.send(b'{"ev":"closing"}\n')
        await response.end()

    @router.route("GET", "/stuck")
    async def stuck(request: Request, response: Response) -> None:
        await response.start(200)
        seen.started.set()
        try:
            await trio.sleep_forever()
        finally:
            seen.events.append("stuck cancelled")

    return router


@asynccontextmanager
async def running(
    limits: Limits | None = None, seen: Seen | None = None
) -> AsyncIterator[tuple[HTTPServer, int, Seen]]:
    seen = seen or Seen()
    server = HTTPServer(make_app(seen), limits=limits)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve_tcp, 0)
        yield server, server.ports[0], seen
        await server.shutdown(grace_s=1)


@asynccontextmanager
async def connect(port: int) -> AsyncIterator[tuple[trio.SocketStream, Reader]]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        yield stream, Reader(stream)


async def roundtrip(port: int, raw: bytes) -> Reply:
    async with connect(port) as (stream, reader):
        await stream.send_all(raw)
        return await reader.response()


def get(path: str, *extra: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: test", *extra, "", ""]
    return "\r\n".join(lines).encode()


def post(path: str, body: bytes, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}", *extra]
    return "\r\n".join([*lines, "", ""]).encode() + body


# -- routing --------------------------------------------------------------------


async def test_routes_params_and_percent_decoding() -> None:
    async with running() as (_, port, _):
        body = b'{"durable": true}'
        raw = (
            b"PUT /queues/a%2Fb%20c HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        reply = await roundtrip(port, raw)
        assert reply.status == 200
        assert reply.headers["content-type"] == "application/json"
        assert reply.json() == {"name": "a/b c", "body": {"durable": True}}

        reply = await roundtrip(
            port,
            post(
                "/exchanges/amq.default/publish?routing_key=orders.eu&mandatory=1",
                b"hello",
                "Content-Type: text/plain",
            ),
        )
        assert reply.json() == {
            "exchange": "amq.default",
            "routing_key": "orders.eu",
            "mandatory": True,
            "size": 5,
            "content_type": "text/plain",
        }


async def test_unknown_path_404_and_wrong_method_405() -> None:
    async with running() as (_, port, _):
        reply = await roundtrip(port, get("/nope"))
        assert reply.status == 404
        assert reply.json()["error"] == "not_found"

        reply = await roundtrip(port, post("/healthz", b""))
        assert reply.status == 405
        assert reply.headers["allow"] == "GET, HEAD"
        assert reply.json()["error"] == "method_not_allowed"


async def test_head_has_headers_but_no_body() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(b"HEAD /healthz HTTP/1.1\r\nHost: t\r\n\r\n" + get("/healthz"))
        head = await reader.head()
        assert head.status == 200
        assert head.headers["content-length"] == "11"
        assert head.headers["date"].endswith(" GMT")  # RFC 9110 section 6.6.1
        # the next response follows immediately: the HEAD response had no body
        assert (await reader.response()).json() == {"ok": True}


async def test_typed_query_errors_are_400_naming_the_parameter() -> None:
    async with running() as (_, port, _):
        reply = await roundtrip(port, post("/queues/q/get?max=lots", b""))
        assert reply.status == 400
        assert reply.json() == {
            "error": "invalid_argument",
            "message": "query parameter 'max' must be an integer; got 'lots'",
        }
        reply = await roundtrip(port, post("/queues/q/get?max=5&wait=99", b""))
        assert reply.status == 400
        assert "'wait' must be at most 60" in reply.json()["message"]
        reply = await roundtrip(port, post("/exchanges/x/publish?mandatory=maybe", b""))
        assert reply.status == 400
        assert "'mandatory'" in reply.json()["message"]
        reply = await roundtrip(port, post("/queues/q/get?max=5&wait=0.5", b""))
        assert reply.json() == {"max": 5, "wait": 0.5}


async def test_invalid_json_and_non_object() -> None:
    async with running() as (_, port, _):
        reply = await roundtrip(
            port, b"PUT /queues/q HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\n{bad"
        )
        assert reply.status == 400
        assert reply.json()["error"] == "invalid_json"
        assert "not valid JSON" in reply.json()["message"]
        reply = await roundtrip(
            port, b"PUT /queues/q HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n[]"
        )
        assert reply.status == 400
        assert "must be a JSON object" in reply.json()["message"]


# -- connection management ------------------------------------------------------


async def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    async with running() as (server, port, _):
        async with connect(port) as (stream, reader):
            for n in range(5):
                await stream.send_all(get(f"/echo/{n}"))
                assert (await reader.response()).json() == {"n": str(n)}
        assert server.statistics().total_accepted == 1


async def test_pipelined_requests_answered_in_order() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        batch = b"".join(
            [
                get("/echo/0"),
                post("/exchanges/x/publish?routing_key=k", b"12345"),
                get("/nope"),
                *(get(f"/echo/{n}") for n in range(1, 20)),
                get("/echo/last", "Connection: close"),
            ]
        )
        await stream.send_all(batch)
        assert (await reader.response()).json() == {"n": "0"}
        assert (await reader.response()).json()["size"] == 5
        assert (await reader.response()).status == 404
        for n in range(1, 20):
            assert (await reader.response()).json() == {"n": str(n)}
        last = await reader.response()
        assert last.json() == {"n": "last"}
        assert last.headers["connection"] == "close"
        assert await reader.at_eof()


async def test_http10_is_answered_and_closed() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(b"GET /healthz HTTP/1.0\r\n\r\n")
        reply = await reader.response()
        assert reply.status == 200
        assert reply.json() == {"ok": True}
        assert await reader.at_eof()


async def test_http10_streaming_response_is_close_delimited() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(b"POST /duplex HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc")
        reply = await reader.response()  # no length, no chunks: read to EOF
        assert reply.status == 200
        assert reply.body == b"echo:abc"


async def test_connection_close_request_is_honoured() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(get("/healthz", "Connection: close"))
        reply = await reader.response()
        assert reply.headers["connection"] == "close"
        assert await reader.at_eof()


async def test_unread_small_body_is_drained_and_connection_kept() -> None:
    async with running() as (server, port, _):
        async with connect(port) as (stream, reader):
            await stream.send_all(post("/ignore-body", b"x" * 1000) + get("/healthz"))
            assert (await reader.response()).json() == {"ignored": True}
            assert (await reader.response()).json() == {"ok": True}
        assert server.statistics().total_accepted == 1


async def test_absolute_form_target() -> None:
    async with running() as (_, port, _):
        reply = await roundtrip(
            port, b"GET http://localhost/echo/abs?x=1 HTTP/1.1\r\nHost: localhost\r\n\r\n"
        )
        assert reply.json() == {"n": "abs"}


async def test_send_bytes_and_send_empty() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(get("/bytes") + b"DELETE /queues/q HTTP/1.1\r\nHost: t\r\n\r\n")
        reply = await reader.response()
        assert reply.body == b"\x00\x01"
        assert reply.headers["content-type"] == "application/octet-stream"
        assert reply.headers["x-kind"] == "raw"
        head = await reader.head()
        assert head.status == 204
        assert "content-length" not in head.headers  # RFC 9110 section 8.6
        await stream.send_all(get("/healthz"))
        assert (await reader.response()).status == 200


async def test_upgrade_request_is_served_as_plain_http() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(get("/healthz", "Connection: Upgrade", "Upgrade: websocket"))
        assert (await reader.response()).status == 200
        await stream.send_all(get("/healthz"))
        assert (await reader.response()).status == 200


@pytest.mark.parametrize(
    "raw",
    [
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n",
    ],
)
async def test_non_path_targets_are_400(raw: bytes) -> None:
    async with running() as (_, port, _):
        reply = await roundtrip(port, raw)
        assert reply.status == 400
        assert "must start with '/'" in reply.json()["message"]


async def test_unread_body_with_pending_100_continue_closes_the_connection() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(
            b"POST /ignore-body HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        reply = await reader.response()
        assert reply.status == 200
        # the client never got 100 Continue, so whether it will send the body is
        # unknowable: the server says it closes rather than guessing
        assert reply.headers["connection"] == "close"


# -- bad input and limits ---------------------------------------------------------


async def test_413_by_content_length_without_reading_the_body() -> None:
    async with running(Limits(max_body_bytes=1000)) as (_, port, _):
        async with connect(port) as (stream, reader):
            await stream.send_all(
                b"POST /exchanges/x/publish HTTP/1.1\r\nHost: t\r\nContent-Length: 5000000\r\n\r\n"
            )
            reply = await reader.response()
            assert reply.status == 413
            assert reply.json()["error"] == "payload_too_large"
            assert reply.headers["connection"] == "close"
            assert await reader.at_eof()


async def test_413_by_chunked_overflow() -> None:
    async with running(Limits(max_body_bytes=1000)) as (_, port, _):
        async with connect(port) as (stream, reader):
            chunk = b"%x\r\n%s\r\n" % (400, b"y" * 400)
            await stream.send_all(
                b"POST /exchanges/x/publish HTTP/1.1\r\nHost: t\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 3
            )
            reply = await reader.response()
            assert reply.status == 413
            assert reply.json()["error"] == "payload_too_large"
            assert reply.headers["connection"] == "close"
            await stream.send_all(chunk * 3)  # the client keeps sending; nothing breaks
            assert await reader.at_eof()


async def test_431_for_oversized_head_and_too_many_headers() -> None:
    async with running(Limits(max_header_bytes=2048, max_headers=10)) as (_, port, _):
        # an unfinished head that outgrows the limit: h11 stops buffering it
        reply = await roundtrip(port, b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 5000)
        assert reply.status == 431
        assert reply.json()["error"] == "header_fields_too_large"
        assert reply.headers["connection"] == "close"

        many = [f"X-H{i}: v" for i in range(11)]
        reply = await roundtrip(port, get("/healthz", *many))
        assert reply.status == 431
        assert "12 header fields" in reply.json()["message"]  # Host counts too

        # a head over the limit that arrives complete in one read is caught too
        reply = await roundtrip(port, get("/healthz", "X-Big: " + "a" * 2100))
        assert reply.status == 431


@pytest.mark.parametrize(
    "raw",
    [
        b"NONSENSE\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nBad Header Line\r\n\r\n",
        b"GET  /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ],
)
async def test_malformed_requests_get_400_and_close(raw: bytes) -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(raw)
        reply = await reader.response()
        assert reply.status == 400
        assert reply.json()["error"] == "bad_request"
        assert reply.headers["connection"] == "close"
        assert await reader.at_eof()


async def test_unsupported_transfer_encoding_is_501() -> None:
    async with running() as (_, port, _):
        reply = await roundtrip(
            port, b"POST /ignore-body HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n"
        )
        assert reply.status == 501
        assert reply.json()["error"] == "not_implemented"


async def test_bad_chunk_framing_is_400() -> None:
    async with running() as (_, port, _):
        reply = await roundtrip(
            port,
            b"POST /exchanges/x/publish HTTP/1.1\r\nHost: t\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        )
        assert reply.status == 400
        assert reply.json()["error"] == "bad_request"


async def test_max_connections_turns_extra_clients_away_with_503() -> None:
    async with running(Limits(max_connections=2)) as (server, port, _):
        async with connect(port) as (s1, r1), connect(port) as (s2, r2):
            for stream, reader in ((s1, r1), (s2, r2)):
                await stream.send_all(get("/healthz"))
                assert (await reader.response()).status == 200
            reply = await roundtrip(port, get("/healthz"))
            assert reply.status == 503
            assert reply.json()["error"] == "unavailable"
            # the admitted connections are unaffected
            await s1.send_all(get("/healthz"))
            assert (await r1.response()).status == 200
        assert server.statistics().rejected_connections == 1
        # once they are gone, new clients are admitted again
        with trio.fail_after(5):
            while server.statistics().open_connections:
                await trio.sleep(0.01)
        assert (await roundtrip(port, get("/healthz"))).status == 200


# -- handler failures -------------------------------------------------------------


async def test_handler_exception_is_500_and_others_keep_being_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running() as (_, port, _), connect(port) as (other, other_reader):
        await other.send_all(get("/healthz"))
        assert (await other_reader.response()).status == 200
        with caplog.at_level(logging.ERROR, logger="ackbus.http"):
            async with connect(port) as (stream, reader):
                await stream.send_all(get("/crash"))
                reply = await reader.response()
                assert reply.status == 500
                assert reply.json() == {
                    "error": "internal_error",
                    "message": "internal server error",
                }
                assert await reader.at_eof()
        assert any(r.exc_info and "boom" in str(r.exc_info[1]) for r in caplog.records)
        await other.send_all(get("/healthz"))
        assert (await other_reader.response()).status == 200


async def test_broker_error_from_handler_becomes_its_json() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(get("/missing") + get("/healthz"))
        reply = await reader.response()
        assert reply.status == 404
        assert reply.json() == {"error": "not_found", "message": "queue 'x' does not exist"}
        assert (await reader.response()).status == 200  # kept alive


async def test_handler_that_does_not_respond_gets_500() -> None:
    async with running() as (_, port, _):
        reply = await roundtrip(port, get("/silent"))
        assert reply.status == 500
        assert reply.json()["error"] == "internal_error"


# -- 100-continue and full duplex -------------------------------------------------


async def test_expect_100_continue_is_answered_when_the_body_is_read() -> None:
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(
            b"POST /exchanges/x/publish HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        with trio.fail_after(2):
            interim = await reader.head()
        assert interim.status == 100
        await stream.send_all(b"abcd")
        reply = await reader.response()
        assert reply.status == 200 and reply.json()["size"] == 4


async def test_expect_100_continue_not_sent_when_rejecting_up_front() -> None:
    async with running(Limits(max_body_bytes=10)) as (_, port, _):
        async with connect(port) as (stream, reader):
            await stream.send_all(
                b"POST /exchanges/x/publish HTTP/1.1\r\nHost: t\r\nContent-Length: 400\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            reply = await reader.head()
            assert reply.status == 413  # straight to the final answer, no 100


async def test_full_duplex_echo_streams_while_the_body_arrives() -> None:
    """Each reply is read before the next chunk is sent: only a truly full-duplex
    server can pass this (a half-duplex one would deadlock waiting for the body end)."""
    async with running() as (_, port, _), connect(port) as (stream, reader):
        await stream.send_all(
            b"POST /duplex HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/x-ndjson\r\nExpect: 100-continue\r\n\r\n"
        )
        with trio.fail_after(5):
            head = await reader.head()
            assert head.status == 100
            head = await reader.head()
            assert head.status == 200
            assert head.headers["transfer-encoding"] == "chunked"
            for n in range(5):
                line = b'{"op":"publish","n":%d}\n' % n
                await stream.send_all(b"%x\r\n%s\r\n" % (len(line), line))
                assert await reader.chunk() == b"echo:" + line
            await stream.send_all(b"0\r\n\r\n")
            assert await reader.chunk() == b""
            # the exchange completed cleanly; the connection is reusable
            await stream.send_all(get("/healthz"))
            assert (await reader.response()).status == 200


async def test_client_disconnect_mid_stream_raises_client_disconnected() -> None:
    seen = Seen()
    async with running(seen=seen) as (_, port, _):
        async with connect(port) as (stream, reader):
            await stream.send_all(
                b"POST /duplex HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n"
            )
            assert (await reader.head()).status == 200
            assert await reader.chunk() == b"echo:hello"
        # the client closed mid-body
        with trio.fail_after(5):
            await seen.disconnected.wait()
        assert isinstance(seen.events[0], ClientDisconnected)


async def test_wait_disconnected_notices_a_departed_streaming_client() -> None:
    seen = Seen()
    async with running(seen=seen) as (server, port, _):
        async with connect(port) as (stream, reader):
            await stream.send_all(get("/stream"))
            assert (await reader.head()).status == 200
            assert await reader.chunk() == b'{"tick":1}\n'
            assert server.statistics().streaming_responses == 1
        with trio.fail_after(5):
            await seen.disconnected.wait()
        assert "wait_disconnected returned" in seen.events


# -- scale, statistics, shutdown ---------------------------------------------------


async def test_many_concurrent_connections() -> None:
    async with running() as (server, port, _):

        async def client(i: int) -> None:
            async with connect(port) as (stream, reader):
                for n in range(3):
                    await stream.send_all(get(f"/echo/{i}-{n}"))
                    assert (await reader.response()).json() == {"n": f"{i}-{n}"}

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(client, i)
        stats = server.statistics()
        assert stats.total_accepted == 200
        assert stats.requests_served == 600


async def test_statistics_count_connections_and_requests() -> None:
    async with running() as (server, port, _):
        assert server.statistics().open_connections == 0
        async with connect(port) as (stream, reader):
            await stream.send_all(get("/healthz") + get("/healthz"))
            await reader.response()
            await reader.response()
            with trio.fail_after(5):  # the handler task finishes just after its reply
                while server.statistics().active_requests:
                    await trio.sleep(0.001)
            stats = server.statistics()
            assert stats.open_connections == 1
            assert stats.total_accepted == 1
            assert stats.requests_served == 2
            assert stats.active_requests == 0


async def test_graceful_shutdown() -> None:
    seen = Seen()
    server = HTTPServer(make_app(seen))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve_tcp, 0)
        port = server.ports[0]
        async with connect(port) as (idle, idle_reader), connect(port) as (busy, busy_reader):
            await idle.send_all(get("/healthz"))
            assert (await idle_reader.response()).status == 200
            await busy.send_all(get("/wait-closing"))
            assert (await busy_reader.head()).status == 200
            await seen.started.wait()

            exchanges = server.active_exchanges()
            assert [(req.path, resp.streaming) for req, resp in exchanges] == [
                ("/wait-closing", True)
            ]
            with trio.fail_after(5):
                await server.shutdown(grace_s=5)
            assert server.closing
            # the streaming handler saw server_closing and said goodbye in-band
            assert await busy_reader.chunk() == b'{"ev":"closing"}\n'
            assert await busy_reader.chunk() == b""
            assert await busy_reader.at_eof()
            # the idle keep-alive connection was simply closed
            assert await idle_reader.at_eof()
        # the listener is closed: serve_tcp has returned, new connections are refused
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)


async def test_shutdown_cancels_stragglers_after_grace() -> None:
    seen = Seen()
    server = HTTPServer(make_app(seen))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve_tcp, 0)
        async with connect(server.ports[0]) as (stream, _reader):
            await stream.send_all(get("/stuck"))
            await seen.started.wait()
            with trio.fail_after(5):
                await server.shutdown(grace_s=0.05)
            assert seen.events == ["stuck cancelled"]
            assert server.statistics().open_connections == 0


async def test_serve_http_hands_back_the_server() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_http(make_app(Seen()), port=0, task_status=task_status)
        )
        assert isinstance(server, HTTPServer)
        assert (await roundtrip(server.ports[0], get("/healthz"))).status == 200
        await server.shutdown(grace_s=1)


async def test_payload_too_large_is_a_broker_error() -> None:
    # handlers may raise it themselves; the server maps it like any BrokerError
    assert PayloadTooLarge("x").status == 413


async def test_connections_that_would_eat_the_reserved_descriptors_get_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Client sockets must not take the last descriptors: the broker's log needs them
    to read messages back (with every descriptor taken, reads failed with EMFILE)."""
    import socket

    from broker.http import server as server_module

    probe = socket.socket()
    lowest_free = probe.fileno()
    probe.close()
    # Room for about 12 more descriptors before the reserve; each connection costs two
    # here (client and server sockets live in this one process).
    monkeypatch.setattr(server_module, "_soft_nofile_limit", lambda: lowest_free + 12 + 64)
    async with running(Limits(reserved_fds=64)) as (server, port, _):
        async with contextlib.AsyncExitStack() as stack:
            statuses = []
            for _ in range(12):
                stream, reader = await stack.enter_async_context(connect(port))
                await stream.send_all(get("/healthz"))
                statuses.append((await reader.response()).status)
            assert statuses[0] == 200
            assert 503 in statuses
            admitted = statuses.count(200)
            assert 1 <= admitted <= 6
            assert server.statistics().rejected_connections == statuses.count(503)
        with trio.fail_after(5):
            while server.statistics().open_connections:
                await trio.sleep(0.01)
        assert (await roundtrip(port, get("/healthz"))).status == 200

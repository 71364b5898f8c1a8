"""The one raw HTTP client of the tests, driven by h11.

:class:`HTTPConnection`
    One client connection: ``request()`` for a whole exchange, or the streaming
    primitives ``send_head`` / ``send_data`` / ``send_end`` / ``receive_head`` /
    ``receive_data`` for chunked uploads and streamed responses. The channel and stream
    clients of ``tests/support/channel.py`` speak through the same h11 client state
    machine.
:class:`HTTPClient`
    Opens connections (TCP or memory) as needed; ``get`` / ``put`` / ``post`` /
    ``delete`` / ``request``, and ``connection()`` for a fresh :class:`HTTPConnection`.
:class:`RawConnection`
    Bytes out, responses in, with no client-side protocol checks: for pipelined and
    malformed requests.
:func:`assert_error`
    Checks a JSON error response (``{"error": code, "message": text}``) and its status.

For subprocess brokers, ``tests/support/broker.py`` has the blocking counterpart
(``request()``), and ``tests/support/rawchannel.py`` a blocking channel client kept
independent of this one on purpose (a crash test must not share a bug with what it
checks).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import h11
import orjson
import trio
import trio.testing

from broker.app import BrokerApp

__all__ = [
    "HTTPClient",
    "HTTPConnection",
    "RawConnection",
    "Reply",
    "assert_error",
    "open_broker_app",
    "open_memory_client",
    "open_tcp_client",
]

_MISSING: Final = object()
Headers = Mapping[str, str] | Iterable[tuple[str, str]] | None


@dataclass
class Reply:
    """One response: status, headers (lowercased names; repeats joined by ``", "``),
    and the whole body."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def error(self) -> str | None:
        """The ``error`` code of a JSON error body (None for a success)."""
        if self.status < 400:
            return None
        return str(self.json()["error"])


def assert_error(reply: Reply, status: int, code: str) -> dict[str, Any]:
    """Check that ``reply`` is the JSON error ``code`` with ``status``; return its body."""
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert isinstance(body, dict) and body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body


def _header_pairs(headers: Headers) -> list[tuple[str, str]]:
    if headers is None:
        return []
    return list(headers.items() if isinstance(headers, Mapping) else headers)


def _reply_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("ascii").lower()
        text = value.decode("latin-1")
        out[key] = f"{out[key]}, {text}" if key in out else text
    return out


# -- clients ----------------------------------------------------------------------


class HTTPConnection:
    """One HTTP/1.1 client connection, with h11 checking the server's side of it."""

    def __init__(self, stream: trio.abc.Stream, host: str = "127.0.0.1") -> None:
        self.stream = stream
        self.host = host
        self.h11 = h11.Connection(h11.CLIENT)

    @property
    def reusable(self) -> bool:
        """Whether another request may be sent (the last exchange ended cleanly and
        neither side asked to close)."""
        return self.h11.our_state is h11.IDLE and self.h11.their_state is h11.IDLE

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)

    # streaming primitives

    async def _send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.stream.send_all(data)

    async def _next_event(self) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(65536))
                continue
            return event  # type: ignore[return-value]

    async def send_head(
        self,
        method: str,
        target: str,
        headers: Headers = None,
        *,
        content_length: int | None = None,
    ) -> None:
        """Send a request head; without ``content_length`` the body is chunked."""
        fields = [("Host", self.host), *_header_pairs(headers)]
        names = {name.lower() for name, _ in fields}
        if content_length is not None:
            if "content-length" not in names:
                fields.append(("Content-Length", str(content_length)))
        elif "content-length" not in names and "transfer-encoding" not in names:
            fields.append(("Transfer-Encoding", "chunked"))
        await self._send(h11.Request(method=method, target=target, headers=fields))

    async def send_data(self, data: bytes) -> None:
        if data:
            await self._send(h11.Data(data=data))

    async def send_end(self) -> None:
        await self._send(h11.EndOfMessage())

    async def receive_head(self) -> Reply:
        """The final response head (``1xx`` responses are skipped)."""
        while True:
            event = await self._next_event()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                return Reply(event.status_code, _reply_headers(event.headers))
            raise AssertionError(f"expected a response head, got {event!r}")

    async def receive_data(self) -> bytes | None:
        """The next piece of the response body, or None once it has ended."""
        event = await self._next_event()
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            self._maybe_next_cycle()
            return None
        raise AssertionError(f"expected response body, got {event!r}")

    def _maybe_next_cycle(self) -> None:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()

    async def receive_response(self) -> Reply:
        reply = await self.receive_head()
        parts = []
        while (part := await self.receive_data()) is not None:
            parts.append(part)
        reply.body = b"".join(parts)
        return reply

    # whole exchanges

    async def request(
        self,
        method: str,
        target: str,
        *,
        json: Any = _MISSING,
        body: bytes | None = None,
        headers: Headers = None,
    ) -> Reply:
        """Send one request (``json`` is encoded; ``body`` sent as is) and read its
        whole response."""
        pairs = _header_pairs(headers)
        if json is not _MISSING:
            body = orjson.dumps(json)
            if not any(name.lower() == "content-type" for name, _ in pairs):
                pairs.append(("Content-Type", "application/json"))
        body = body or b""
        await self.send_head(method, target, pairs, content_length=len(body))
        await self.send_data(body)
        await self.send_end()
        return await self.receive_response()


class HTTPClient:
    """Requests over connections from ``connect``, reusing one while it stays open."""

    def __init__(self, connect: Callable[[], Awaitable[trio.abc.Stream]]) -> None:
        self._connect = connect
        self._conn: HTTPConnection | None = None
        self._opened: list[HTTPConnection] = []

    async def connection(self) -> HTTPConnection:
        """A new connection of its own (closed with the client)."""
        conn = HTTPConnection(await self._connect())
        self._opened.append(conn)
        return conn

    async def request(
        self,
        method: str,
        target: str,
        *,
        json: Any = _MISSING,
        body: bytes | None = None,
        headers: Headers = None,
    ) -> Reply:
        if self._conn is None or not self._conn.reusable:
            if self._conn is not None:
                await self._conn.aclose()
            self._conn = await self.connection()
        return await self._conn.request(method, target, json=json, body=body, headers=headers)

    async def get(self, target: str, **kw: Any) -> Reply:
        return await self.request("GET", target, **kw)

    async def put(self, target: str, **kw: Any) -> Reply:
        return await self.request("PUT", target, **kw)

    async def post(self, target: str, **kw: Any) -> Reply:
        return await self.request("POST", target, **kw)

    async def delete(self, target: str, **kw: Any) -> Reply:
        return await self.request("DELETE", target, **kw)

    async def aclose(self) -> None:
        for conn in self._opened:
            await conn.aclose()
        self._opened.clear()
        self._conn = None


@asynccontextmanager
async def open_tcp_client(port: int) -> AsyncIterator[HTTPClient]:
    async def connect() -> trio.abc.Stream:
        return await trio.open_tcp_stream("127.0.0.1", port)

    c = HTTPClient(connect)
    try:
        yield c
    finally:
        await c.aclose()


@asynccontextmanager
async def open_memory_client(app: BrokerApp) -> AsyncIterator[HTTPClient]:
    """A client whose every connection is a trio memory stream served by ``app``'s
    server in-process (no sockets: safe with ``autojump_clock``)."""
    async with trio.open_nursery() as nursery:

        async def connect() -> trio.abc.Stream:
            client_side, server_side = trio.testing.memory_stream_pair()
            nursery.start_soon(app.server.serve_stream, server_side)
            return client_side

        c = HTTPClient(connect)
        try:
            yield c
        finally:
            await c.aclose()
            nursery.cancel_scope.cancel()


class RawConnection:
    """Hand-written request bytes out, responses in (Content-Length, chunked, or to
    EOF), with no client-side checks: for pipelining and malformed input."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = bytearray()

    @classmethod
    async def open(cls, port: int) -> RawConnection:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)

    async def _fill(self) -> bool:
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:  # a reset counts as the end
            data = b""
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

    async def read_response(self) -> Reply:
        while True:
            lines = (await self._until(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            pairs = []
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    pairs.append((name.strip().encode(), value.strip().encode("latin-1")))
            reply = Reply(status, _reply_headers(pairs))
            if not 100 <= status < 200:
                break
        if "content-length" in reply.headers:
            reply.body = await self._exact(int(reply.headers["content-length"]))
        elif reply.headers.get("transfer-encoding") == "chunked":
            parts = []
            while size := int((await self._until(b"\r\n"))[:-2], 16):
                parts.append(await self._exact(size))
                await self._exact(2)
            await self._until(b"\r\n")
            reply.body = b"".join(parts)
        else:
            while await self._fill():
                pass
            reply.body = bytes(self.buf)
            self.buf.clear()
        return reply

    async def at_eof(self) -> bool:
        """Whether the server closed the connection (after what is buffered)."""
        return not self.buf and not await self._fill()

"""A minimal HTTP/1.1 client (h11 over anyio byte streams: trio or asyncio): REST calls
and duplex exchanges.

Two shapes of exchange, both RFC 9112:

- :class:`RestClient`: one-shot requests with ``Content-Length`` bodies over a small pool
  of keep-alive connections. A request that fails on a *reused* connection before any
  byte of the answer arrived is retried once on a fresh connection: the server may
  have closed an idle keep-alive connection just as we reused it (RFC 9112 §9.3.1
  allows that retry for idempotent requests; ackbus's REST calls are idempotent or
  lease-based, so a retried ``get`` at worst leases a message that comes back when
  its lease expires).
- :class:`DuplexExchange`: the ``POST /channel`` exchange. The request body is chunked
  (§7.1) and written by one task while another reads the chunked response, which the
  broker starts before the request body ends. h11 writes the request head and reads
  the response head; the chunked bodies are then framed by :mod:`client.chunked`, which
  costs a fraction of h11's per-event overhead on this latency-critical path (a
  response that is not chunked is still read through h11). One exchange per TCP
  connection, never reused.

Network failures surface as :class:`~client.errors.ConnectionLost` with the cause
chained; a non-2xx answer to the channel request as
:class:`~client.errors.BrokerRequestError`.

Why a module of ~570 lines: a duplex HTTP/1.1 exchange over one connection (TLS or
plain, chunked framing in both directions, the direct-write fast path) is one state
machine whose halves share the socket and its buffers.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import h11

from ._backend import running_trio
from ._version import __version__
from .chunked import ChunkedDecoder, encode_chunk
from .codec import decode_json
from .diagnosis import network_error_text, tls_refused
from .errors import BrokerRequestError, ConnectionLost, ProtocolError, TLSRefused

__all__ = [
    "Endpoint",
    "StreamOpener",
    "open_tcp",
    "Response",
    "HTTPConnection",
    "RestClient",
    "DuplexExchange",
    "error_from_response",
    "receive_some",
]

USER_AGENT = f"ackbus-client/{__version__}"
RECEIVE_BYTES = 65536
MAX_RESPONSE_BYTES = 64 * 1024 * 1024

# Errors that mean "this connection is unusable": the peer went away, the socket broke,
# or the bytes on it stopped being HTTP.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    h11.ProtocolError,
)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the broker is: parsed from ``http://host:port/prefix``; and how to prove
    who we are (an ``Authorization`` header value) and whom to trust (an SSL context:
    None means the system's CAs, always verified). Neither appears in ``str`` or
    ``repr``, so logging an endpoint never logs a secret."""

    scheme: str
    host: str
    port: int
    prefix: str = ""
    authorization: str | None = field(default=None, repr=False, compare=False)
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    def with_credentials(
        self, *, username: str | None = None, password: str | None = None, token: str | None = None
    ) -> Endpoint:
        """This endpoint authenticating with HTTP Basic (``username``/``password``) or
        a Bearer ``token``.

        Raises:
            ValueError: both, or a user name with ``:`` (RFC 7617 forbids it).
        """
        if token is not None and username is not None:
            raise ValueError("give a username and password, or a token, not both")
        if token is not None:
            return _replace(self, authorization=f"Bearer {token}")
        if username is not None:
            if ":" in username:
                raise ValueError("a user name must not contain ':'")
            pair = f"{username}:{password or ''}".encode()
            return _replace(self, authorization="Basic " + base64.b64encode(pair).decode("ascii"))
        return self

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Parse a broker URL (``http`` or ``https``; default ports 80 / 443).

        Raises:
            ValueError: not an http(s) URL with a host.
        """
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"broker URL must be http:// or https://, got {url!r}")
        if not parts.hostname:
            raise ValueError(f"broker URL has no host: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        endpoint = cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))
        if parts.username is not None:  # http://user:password@host (percent-encoded)
            endpoint = endpoint.with_credentials(
                username=urllib.parse.unquote(parts.username), password=urllib.parse.unquote(parts.password or "")
            )
        return endpoint

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def target(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        """The request target for ``path`` (already percent-encoded) and ``query``."""
        target = self.prefix + path
        if query:
            pairs = {k: _query_value(v) for k, v in query.items() if v is not None}
            if pairs:
                target += "?" + urllib.parse.urlencode(pairs)
        return target

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.prefix}"


def _replace(endpoint: Endpoint, **changes: Any) -> Endpoint:
    fields = {name: getattr(endpoint, name) for name in Endpoint.__dataclass_fields__}
    fields.update(changes)
    return Endpoint(**fields)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


StreamOpener = Callable[[Endpoint], Awaitable[anyio.abc.ByteStream]]
"""How to get a byte stream to the broker; tests substitute in-memory streams."""


async def open_tcp(endpoint: Endpoint) -> anyio.abc.ByteStream:
    """Open a TCP (or TLS) stream to ``endpoint`` with TCP keepalive enabled.

    Keepalive is the only way a half-open connection (broker host gone without a FIN)
    is ever noticed on an idle consumer channel; the probes below notice it within
    about half a minute.

    Raises:
        OSError: the connection could not be made.
    """
    stream: anyio.abc.ByteStream
    try:
        # https is always verified: the system's CAs, or the endpoint's own context (a
        # CA bundle given to connect()); there is no switch that turns checking off.
        if endpoint.scheme == "https":
            stream = await anyio.connect_tcp(
                endpoint.host, endpoint.port, ssl_context=endpoint.ssl_context or ssl.create_default_context(), tls=True,
                tls_hostname=endpoint.host,
            )
        else:
            stream = await anyio.connect_tcp(endpoint.host, endpoint.port)
    except OSError as exc:
        # anyio tries every address and raises "All connection attempts failed"
        # from the real cause (or a group of them): surface it ("Connection refused").
        cause = exc.__cause__
        if isinstance(cause, BaseExceptionGroup):
            cause = cause.exceptions[0]
        if isinstance(cause, OSError):
            raise cause from None
        raise
    _enable_keepalive(stream)
    return stream


def _enable_keepalive(stream: anyio.abc.ByteStream) -> None:
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


async def receive_some(stream: anyio.abc.ByteStream, max_bytes: int = 65536) -> bytes:
    """The next bytes of ``stream``, ``b""`` at its end (trio's convention: anyio
    raises :class:`anyio.EndOfStream` instead)."""
    try:
        return bytes(await stream.receive(max_bytes))
    except anyio.EndOfStream:
        return b""


@dataclass(frozen=True, slots=True)
class Response:
    """A complete REST answer."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: str) -> str | None:
        key = name.lower().encode("ascii")
        for k, v in self.headers:
            if k == key:
                return v.decode("latin-1")
        return None

    def json(self) -> Any:
        """The body parsed as JSON (``None`` for an empty body).

        Raises:
            ProtocolError: not JSON.
        """
        if not self.body:
            return None
        return decode_json(self.body)


def error_from_response(response: Response) -> BrokerRequestError:
    """The :class:`BrokerRequestError` a non-2xx answer stands for."""
    code, message = "http_error", response.body.decode("utf-8", "replace")[:500]
    try:
        body = response.json()
    except ProtocolError:
        body = None
    if isinstance(body, dict):
        code = str(body.get("error", code))
        message = str(body.get("message", message))
    retry_after: float | None = None
    try:
        retry_after = float(response.header("retry-after") or "")
    except ValueError:
        pass  # absent, or an HTTP date (the broker sends seconds)
    return BrokerRequestError(response.status, code, message, retry_after)


def _is_chunked(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """The response body is chunked (h11 has checked that a ``Transfer-Encoding``
    of a response it accepted is exactly ``chunked``)."""
    return any(name == b"transfer-encoding" for name, _ in headers)


async def _aclose_quietly(stream: anyio.abc.AsyncResource) -> None:
    await anyio.aclose_forcefully(stream)


class HTTPConnection:
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, stream: anyio.abc.ByteStream, endpoint: Endpoint) -> None:
        self._stream = stream
        self._endpoint = endpoint
        self._h11 = h11.Connection(h11.CLIENT)
        self.got_response_bytes = False

    @property
    def reusable(self) -> bool:
        """Idle and allowed to carry another request."""
        return self._h11.our_state is h11.IDLE and self._h11.their_state is h11.IDLE

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Response:
        """Send one request and read its whole answer.

        Raises:
            OSError, anyio.BrokenResourceError, h11.ProtocolError: the connection broke.
            ProtocolError: the answer is larger than the client accepts.
        """
        self.got_response_bytes = False
        all_headers = [
            ("Host", self._endpoint.host_header),
            ("User-Agent", USER_AGENT),
            ("Accept", "application/json"),
            *headers,
        ]
        if self._endpoint.authorization is not None:
            all_headers.append(("Authorization", self._endpoint.authorization))
        if body or method in ("POST", "PUT", "PATCH"):
            all_headers.append(("Content-Length", str(len(body))))
        data = self._h11.send(h11.Request(method=method, target=target, headers=all_headers))
        if body:
            data = (data or b"") + (self._h11.send(h11.Data(data=body)) or b"")
        data = (data or b"") + (self._h11.send(h11.EndOfMessage()) or b"")
        await self._stream.send(data)

        status = 0
        response_headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                response_headers = list(event.headers)
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_RESPONSE_BYTES:
                    raise ProtocolError(f"response larger than {MAX_RESPONSE_BYTES} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise anyio.BrokenResourceError("connection closed before the response")
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        return Response(status, response_headers, b"".join(chunks))

    async def _next_event(self) -> Any:
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await receive_some(self._stream, RECEIVE_BYTES)
            if data:
                self.got_response_bytes = True
            self._h11.receive_data(data)

    def tls_refused(self, exc: BaseException) -> TLSRefused | None:
        """See :func:`~client.diagnosis.tls_refused` (for a request that got no byte
        of an answer)."""
        return tls_refused(self._stream, str(self._endpoint), exc)

    async def aclose(self) -> None:
        await _aclose_quietly(self._stream)


class RestClient:
    """One-shot REST requests over a small pool of keep-alive connections."""

    def __init__(
        self,
        endpoint: Endpoint,
        opener: StreamOpener,
        *,
        timeout_s: float,
        max_idle: int = 4,
    ) -> None:
        self._endpoint = endpoint
        self._opener = opener
        self._timeout_s = timeout_s
        self._max_idle = max_idle
        self._idle: list[HTTPConnection] = []
        self._closed = False

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
    ) -> Response:
        """Send a request; return the answer whatever its status.

        Raises:
            ConnectionLost: the broker could not be reached or the connection broke
                (also on timeout).
            ProtocolError: the answer is not valid HTTP or too large.
        """
        target = self._endpoint.target(path, query)
        headers = list(headers)
        try:
            with anyio.fail_after(self._timeout_s):
                return await self._request_with_retry(method, target, headers, body)
        except TimeoutError:
            raise ConnectionLost(
                f"{method} {target}: no answer from {self._endpoint} within {self._timeout_s} s"
            ) from None

    async def _request_with_retry(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> Response:
        while True:
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._open()
            keep = False
            try:
                response = await conn.request(method, target, headers=headers, body=body)
                keep = conn.reusable
            except NETWORK_ERRORS as exc:
                if reused and not conn.got_response_bytes:
                    continue  # stale keep-alive connection: retry on a fresh one
                refused = None if conn.got_response_bytes else conn.tls_refused(exc)
                if refused is not None:
                    raise refused from exc
                raise ConnectionLost(f"{method} {target} to {self._endpoint}: {network_error_text(exc)}") from exc
            finally:
                if keep and not self._closed and len(self._idle) < self._max_idle:
                    self._idle.append(conn)
                else:
                    await conn.aclose()
            return response

    async def _open(self) -> HTTPConnection:
        try:
            stream = await self._opener(self._endpoint)
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {self._endpoint}: {exc}") from exc
        return HTTPConnection(stream, self._endpoint)

    async def aclose(self) -> None:
        """Close the idle connections."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()


class DuplexExchange:
    """A full-duplex HTTP/1.1 exchange: chunked request body out, chunked response in.

    Exactly one task may call :meth:`send`/:meth:`end` and one task
    :meth:`receive_some` at a time (byte streams allow one sender and one receiver
    concurrently).
    """

    def __init__(self, stream: anyio.abc.ByteStream, conn: h11.Connection) -> None:
        self._stream = stream
        self._h11 = conn
        # The socket :meth:`write_nowait` writes to: only a plain TCP stream has one
        # (a TLS stream must encrypt, a test's memory stream has no descriptor), only
        # on POSIX, where a socket is a file descriptor that write(2) takes, and only
        # under trio, whose socket stream sends straight to the socket: asyncio's
        # transport keeps a write buffer of its own that a direct write would overtake.
        self._socket = (
            stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
            if isinstance(stream, anyio.abc.SocketStream) and os.name == "posix" and running_trio()
            else None
        )
        # Set once a chunked 200 response head was read: the body is decoded here,
        # starting with the bytes h11 had received past the head.
        self._body: ChunkedDecoder | None = None
        self._pending = b""

    @classmethod
    async def open(
        cls,
        stream: anyio.abc.ByteStream,
        endpoint: Endpoint,
        target: str,
        *,
        method: str = "POST",
        headers: Iterable[tuple[str, str]] = (),
    ) -> DuplexExchange:
        """Send the request head on ``stream`` and wait for the response head.

        On success the exchange owns ``stream``; on failure ``stream`` is closed.

        Raises:
            BrokerRequestError: the answer is not 200 (its body is read and parsed).
            ConnectionLost: the connection broke first.
        """
        conn = h11.Connection(h11.CLIENT)
        self = cls(stream, conn)
        ok = False
        try:
            head = [
                ("Host", endpoint.host_header),
                ("User-Agent", USER_AGENT),
                ("Transfer-Encoding", "chunked"),
                *headers,
            ]
            if endpoint.authorization is not None:
                head.append(("Authorization", endpoint.authorization))
            try:
                await self._send_event(h11.Request(method=method, target=target, headers=head))
                while True:
                    event = await self._next_event()
                    if isinstance(event, h11.InformationalResponse):
                        continue  # 100 Continue
                    if isinstance(event, h11.Response):
                        break
                    raise ConnectionLost(f"the connection closed before the response ({type(event).__name__})")
            except ConnectionLost as exc:
                refused = tls_refused(stream, str(endpoint), exc.__cause__ or exc)
                if refused is not None:
                    raise refused from exc
                raise
            if event.status_code != 200:
                body = await self._read_rest()
                raise error_from_response(Response(event.status_code, list(event.headers), body))
            if _is_chunked(event.headers):
                self._body = ChunkedDecoder()
                self._pending = self._h11.trailing_data[0]
            ok = True
            return self
        finally:
            if not ok:
                await _aclose_quietly(stream)

    async def _read_rest(self) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while size < MAX_RESPONSE_BYTES:
            data = await self.receive_some()
            if not data:
                break
            size += len(data)
            chunks.append(data)
        return b"".join(chunks)

    async def _send_event(self, event: Any) -> None:
        try:
            data = self._h11.send(event)
            if data:
                await self._stream.send(data)
        except NETWORK_ERRORS as exc:
            raise ConnectionLost(f"channel connection broke while sending: {network_error_text(exc)}") from exc

    async def _next_event(self) -> Any:
        try:
            while True:
                event = self._h11.next_event()
                if event is not h11.NEED_DATA:
                    return event
                self._h11.receive_data(await receive_some(self._stream, RECEIVE_BYTES))
        except NETWORK_ERRORS as exc:
            raise ConnectionLost(f"channel connection broke while receiving: {network_error_text(exc)}") from exc

    async def send(self, data: bytes) -> None:
        """Send ``data`` as one chunk of the request body.

        Raises:
            ConnectionLost: the connection broke.
        """
        if data:
            # h11 frames only the head and the last chunk: its state does not count
            # the chunks of a chunked body, so framing them here keeps it consistent.
            try:
                await self._stream.send(encode_chunk(data))
            except NETWORK_ERRORS as exc:
                raise ConnectionLost(f"channel connection broke while sending: {network_error_text(exc)}") from exc

    @property
    def can_write_nowait(self) -> bool:
        """:meth:`write_nowait` can write (the stream is a plain TCP socket)."""
        return self._socket is not None

    def write_nowait(self, data: bytes) -> bytes:
        """Frame ``data`` as one chunk and write what the socket takes right now,
        without waiting and without a schedule point; return the framed bytes it did
        not take (usually none), which must go out with :meth:`send_framed` before
        anything else. Only when :attr:`can_write_nowait`, and only while no
        :meth:`send` is in progress (the caller keeps one writer at a time).

        This is how a lone op leaves in its producer's own step: handing it to a
        writer task costs a pass of trio's run loop, and the tasks woken with the
        writer (a confirm being read, say) may run before it. The socket is already
        non-blocking (trio made it so); a plain ``write(2)`` on it is what trio's own
        send does, minus the schedule point.

        Raises:
            ConnectionLost: the connection broke (or was closed).
        """
        assert self._socket is not None, "write_nowait needs a plain TCP stream"
        framed = encode_chunk(data)
        try:
            # fileno() is -1 once the socket is closed: EBADF, never another file.
            written = os.write(self._socket.fileno(), framed)
        except BlockingIOError:
            return framed
        except OSError as exc:
            raise ConnectionLost(f"channel connection broke while sending: {network_error_text(exc)}") from exc
        return framed[written:]

    async def send_framed(self, framed: bytes) -> None:
        """Send bytes already framed (what :meth:`write_nowait` left over).

        Raises:
            ConnectionLost: the connection broke.
        """
        try:
            await self._stream.send(framed)
        except NETWORK_ERRORS as exc:
            raise ConnectionLost(f"channel connection broke while sending: {network_error_text(exc)}") from exc

    async def end(self) -> None:
        """End the request body (the response may go on).

        Raises:
            ConnectionLost: the connection broke.
        """
        if self._h11.our_state is h11.SEND_BODY:
            await self._send_event(h11.EndOfMessage())

    async def receive_some(self) -> bytes:
        """The next bytes of the response body; ``b""`` once the response has ended.

        Raises:
            ConnectionLost: the connection broke, or the response was cut short.
            ProtocolError: the chunked framing of the response is malformed.
        """
        body = self._body
        if body is not None:
            while not body.done:
                data, self._pending = self._pending, b""
                if not data:
                    try:
                        data = await receive_some(self._stream, RECEIVE_BYTES)
                    except NETWORK_ERRORS as exc:
                        raise ConnectionLost(
                            f"channel connection broke while receiving: {network_error_text(exc)}"
                        ) from exc
                    if not data:
                        raise ConnectionLost("channel connection closed inside the response body")
                payload = body.feed(data)
                if payload:
                    return payload
            return b""
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return b""
            elif event is h11.PAUSED:
                return b""

    async def aclose(self) -> None:
        """Close the connection at once."""
        await _aclose_quietly(self._stream)

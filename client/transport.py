"""A minimal HTTP/1.1 client for REST calls (h11 over anyio byte streams: trio or
asyncio), and the pieces the channel's exchange (:mod:`client.duplex`) shares with it.

:class:`RestClient` sends one-shot requests with ``Content-Length`` bodies over a small
pool of keep-alive connections (:class:`HTTPConnection`). A request that fails on a
*reused* connection before any byte of the answer arrived is retried once on a fresh
connection: the server may have closed an idle keep-alive connection just as we
reused it (RFC 9112 §9.3.1 allows that retry for idempotent requests; ackbus's REST
calls are idempotent or lease-based, so a retried ``get`` at worst leases a message
that comes back when its lease expires).

Network failures surface as :class:`~client.errors.ConnectionLost` with the cause
chained; a non-2xx answer is a :class:`Response` the caller turns into a
:class:`~client.errors.BrokerRequestError` with :func:`error_from_response`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import h11

from ._version import __version__
from .codec import decode_json
from .diagnosis import network_error_text, tls_refused
from .endpoint import Endpoint, StreamOpener
from .errors import BrokerRequestError, ConnectionLost, ProtocolError, TLSRefused
from .failover import FailoverOpener, unavailable_here

__all__ = [
    "Response",
    "HTTPConnection",
    "RestClient",
    "error_from_response",
    "receive_some",
    "aclose_quietly",
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



async def aclose_quietly(stream: anyio.abc.AsyncResource) -> None:
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
        await aclose_quietly(self._stream)


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
                response = await self._request_with_retry(method, target, headers, body)
        except TimeoutError:
            raise ConnectionLost(
                f"{method} {target}: no answer from {self._endpoint} within {self._timeout_s} s"
            ) from None
        if response.status == 503 and isinstance(self._opener, FailoverOpener):
            await self._move_on_if_unavailable(self._opener, response)
        return response

    async def _move_on_if_unavailable(self, opener: FailoverOpener, response: Response) -> None:
        """A ``503`` saying this node cannot serve the queue while another node may
        (``client/failover.py``): the next request goes to the next node."""
        try:
            body = response.json()
        except ProtocolError:
            return
        if not isinstance(body, dict):
            return
        if not unavailable_here(str(body.get("error", ""))) and not unavailable_here(str(body.get("reason", ""))):
            return
        opener.move_on(opener.endpoint)
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()

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

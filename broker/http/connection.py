"""One HTTP/1.1 server connection: h11 drives the protocol, this module moves the bytes.

Theory of operation
-------------------

h11's ``Connection`` is the protocol state machine; it never touches the socket. A
:class:`_Connection` owns one stream and one h11 state machine and runs one task, the
*connection loop*:

1. read a request head (timeouts: ``header_timeout_s`` for a head in progress,
   ``idle_timeout_s`` between keep-alive requests);
2. build a :class:`Request` and a :class:`Response` and await the app (a ``Router``)
   in the same task -- no task spawn per request;
3. finish the cycle: make sure a response went out (500 if not), discard a small
   unread request body or decide to close, and ``start_next_cycle()``.

Pipelined requests (RFC 9112 section 9.3.2) need nothing special: h11 keeps the bytes
of the next request in its buffer and step 1 finds them there, so responses go out in
request order because requests are handled one after another.

Rules that make full duplex safe
--------------------------------

* **One reader.** Body reads (``Request.receive_chunk`` and friends) may happen in any
  task of the handler, but only one at a time (a second concurrent reader gets
  ``trio.BusyResourceError``). Between requests only the connection loop reads.
* **One writer at a time.** Every write takes the connection's FIFO send lock, and the
  h11 ``send()`` that produces the bytes happens *under* that lock, so bytes reach the
  socket in the same order h11 saw the events. The reader writes too (``100 Continue``),
  which is why the lock is needed even with one writer task.
* h11 allows the server to send its response while the client's body is still arriving
  (the two halves of its state machine are independent), so a handler can ``start()``
  a streaming response, spawn a reader task and keep writing: that is the channel.
* **Writes without a schedule point.** ``Response.send_nowait`` frames a chunk itself
  and writes it with a non-blocking ``write(2)`` in the caller's own step, when nobody
  holds the send lock and nothing is left over (plain TCP, POSIX, chunked coding
  only). Whatever the socket did not take is kept and goes out under the lock before
  anything else. h11 keeps no state per chunk it writes, so skipping it for these
  chunks leaves its state machine right. This is how a delivery leaves in the step of
  the publish that caused it, instead of a pass of trio's run loop later.

Failure rules
-------------

* Anything malformed or over a limit before the handler runs: a JSON error
  (400/408/431/501), ``Connection: close``, lingering close.
* An ``HTTPError`` (or an exception the server's ``error_translator`` maps to one)
  escaping the handler before the response started: that error as JSON; the connection is kept if the request body can be drained cheaply.
* Any other exception: logged on ``ackbus.http``, 500 ``internal_error`` if the
  response had not started, connection closed. Other connections are unaffected.
* The client leaving mid-exchange surfaces in the handler as ``ClientDisconnected``.

Why one module of ~1,200 lines
------------------------------

:class:`Request`, :class:`Response` and :class:`_Connection` are three views of one
h11 state machine and one socket: the request reads body events the connection loop
would otherwise read, the response writes under the connection's send lock and its
direct-write path touches the connection's left-over bytes, and the loop finishes what
both leave behind. Split across modules they would reach into each other's private
state; kept together, every rule above is enforced in one place.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final, TypeAlias, cast

import h11
import orjson
import trio

from broker.http.errors import (
    ClientDisconnected,
    HeaderFieldsTooLarge,
    HTTPError,
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    protocol_error,
)
from broker.http.headers import Headers
from broker.http.limits import Limits
from broker.http.query import QueryParams

__all__ = [
    "ErrorTranslator",
    "Handler",
    "LIMIT",
    "BodyIterator",
    "HeaderInput",
    "Request",
    "Response",
]

#: What a route (and the server's ``app``) is: an async callable answering one request.
Handler: TypeAlias = "Callable[[Request, Response], Awaitable[None]]"
#: Maps an exception a handler raised to the error response it means (None: a 500).
ErrorTranslator: TypeAlias = "Callable[[BaseException], HTTPError | None]"


def no_translation(exc: BaseException) -> HTTPError | None:
    """The default ``ErrorTranslator``: only ``HTTPError`` has a meaning."""
    return None

log = logging.getLogger("ackbus.http")

#: Response headers a handler may add: a mapping or ``(name, value)`` pairs.
HeaderInput: TypeAlias = Mapping[str, str] | Iterable[tuple[str, str]] | None


class _Default(enum.Enum):
    LIMIT = "limit"


#: Default for ``max_bytes`` / ``timeout_s`` arguments: use the server's ``Limits``.
#: ``None`` means no limit.
LIMIT: Final = _Default.LIMIT


class _NoDefault(enum.Enum):
    MISSING = "missing"


_JSON: Final = b"application/json"
_NO_BODY_STATUSES: Final = frozenset({204, 304})
_CLOSE_HEADER: Final = (b"connection", b"close")
_GONE: Final = (trio.BrokenResourceError, trio.ClosedResourceError)
#: Reason phrases are optional (RFC 9112 section 4) but humans reading curl -i like them.
_REASONS: Final = {status.value: status.phrase.encode("ascii") for status in HTTPStatus}


_date_second = 0
_date_value = b""


def _http_date() -> bytes:
    """The ``Date`` header value (RFC 9110 section 6.6.1: an origin server with a clock
    MUST send it), formatted at most once per second."""
    global _date_second, _date_value
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_value = formatdate(now, usegmt=True).encode("ascii")
    return _date_value


def _encode_headers(headers: HeaderInput) -> list[tuple[bytes, bytes]]:
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(name.encode("ascii"), value.encode("latin-1")) for name, value in items]


class _Shared:
    """State every connection of one server sees: the app, the limits, the shutdown
    flag, counters, and the registry of live connections."""

    __slots__ = (
        "app",
        "closing",
        "connections",
        "error_translator",
        "limits",
        "requests_served",
        "send_watchdog",
    )

    def __init__(self, app: Handler, limits: Limits, error_translator: ErrorTranslator) -> None:
        self.app = app
        self.limits = limits
        self.error_translator = error_translator
        self.closing = trio.Event()
        self.requests_served = 0
        self.connections: set[_Connection] = set()
        #: A server task enforces ``send_timeout_s`` (see ``_Connection.abort_stalled_send``)
        #: so that writes need no cancel scope of their own.
        self.send_watchdog = False


class Request:
    """One request as a handler sees it.

    Attributes: ``method`` (``"GET"``), ``target`` (as sent), ``path`` (still
    percent-encoded, no query), ``path_params`` (decoded, filled by the router),
    ``http_version`` (``"1.1"``), and lazily ``headers`` and ``query``.

    The body is read on demand with :meth:`read_body`, :meth:`read_json`,
    :meth:`iter_body` or :meth:`receive_chunk`. Their ``max_bytes`` and ``timeout_s``
    default to the server's ``Limits.max_body_bytes`` / ``body_timeout_s``; pass
    ``None`` for no limit (a long-lived channel).
    """

    __slots__ = (
        "_body_done",
        "_body_received",
        "_conn",
        "_event",
        "_headers",
        "_query",
        "http_version",
        "method",
        "path",
        "path_params",
        "principal",
        "query_string",
        "target",
    )

    def __init__(self, conn: _Connection, event: h11.Request) -> None:
        self._conn = conn
        self._event = event
        self.method: str = event.method.decode("ascii")
        target = event.target.decode("ascii")  # h11 admits only visible ASCII here
        self.target: str = target
        if target[:1] != "/" and "://" in target:
            # absolute-form (RFC 9112 section 3.2.2): a server MUST accept it.
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        path, _, query = target.partition("?")
        self.path: str = path
        self.query_string: str = query
        self.http_version: str = event.http_version.decode("ascii")
        self.path_params: dict[str, str] = {}
        #: Who made the request, as the router's guard found it (None: no guard, or
        #: nobody needed). The server never reads it.
        self.principal: Any = None
        self._headers: Headers | None = None
        self._query: QueryParams | None = None
        self._body_done = False
        self._body_received = 0

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.target}>"

    @property
    def headers(self) -> Headers:
        """Header fields, case-insensitive: ``request.headers.get("content-type")``."""
        if self._headers is None:
            self._headers = Headers(self._event.headers)
        return self._headers

    @property
    def query(self) -> QueryParams:
        """Query parameters with typed getters (``query.get_int("max", 1)``)."""
        if self._query is None:
            self._query = QueryParams(self.query_string)
        return self._query

    @property
    def content_length(self) -> int | None:
        """Declared body length: ``Content-Length``, 0 when the request has neither it
        nor ``Transfer-Encoding`` (RFC 9112 section 6.3), ``None`` when chunked."""
        length = 0
        # Scan h11's lowercased pairs: cheaper than building the Headers index.
        for name, value in self._event.headers:
            if name == b"transfer-encoding":
                return None
            if name == b"content-length":
                # h11 has already rejected malformed or conflicting values.
                length = int(value.partition(b",")[0])
        return length

    @property
    def body_complete(self) -> bool:
        """Whether the whole request body has been read."""
        return self._body_done

    @property
    def remote(self) -> str | None:
        """``"host:port"`` of the client, when the stream is a socket."""
        return self._conn.remote

    @property
    def server_closing(self) -> trio.Event:
        """Set when the server begins a graceful shutdown; a long-lived handler (a
        channel, a streaming consume) can wait on it to say goodbye in-band."""
        return self._conn.shared.closing

    def _limit(self, max_bytes: int | _Default | None) -> int | None:
        return self._conn.limits.max_body_bytes if max_bytes is LIMIT else max_bytes

    def _timeout(self, timeout_s: float | _Default | None) -> float | None:
        return self._conn.limits.body_timeout_s if timeout_s is LIMIT else timeout_s

    async def receive_chunk(
        self,
        *,
        max_bytes: int | _Default | None = LIMIT,
        timeout_s: float | _Default | None = LIMIT,
    ) -> bytes:
        """The next piece of the body as it arrives, or ``b""`` once it has ended.

        ``max_bytes`` bounds the whole body (checked against ``Content-Length`` before
        anything is read, and against the running total). If the client sent
        ``Expect: 100-continue``, the first read answers ``100 Continue`` first.

        Raises: ``PayloadTooLarge`` (413), ``RequestTimeout`` (408, no data for
        ``timeout_s``), ``BadRequest`` (malformed chunk framing),
        ``ClientDisconnected`` (the connection ended before the body did),
        ``trio.BusyResourceError`` (another task is reading).
        """
        if self._body_done:
            return b""
        limit = self._limit(max_bytes)
        if limit is not None and self._body_received == 0:
            declared = self.content_length
            if declared is not None and declared > limit:
                raise PayloadTooLarge(
                    f"request body of {declared} bytes exceeds the limit of {limit} bytes"
                )
        conn = self._conn
        event = await conn.next_body_event(self._timeout(timeout_s))
        if type(event) is h11.EndOfMessage:
            self._body_done = True
            return b""
        data = bytes(event.data)  # type: ignore[union-attr]
        self._body_received += len(data)
        if limit is not None and self._body_received > limit:
            conn.must_close = True
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        return data

    def iter_body(
        self,
        *,
        max_bytes: int | _Default | None = LIMIT,
        timeout_s: float | _Default | None = LIMIT,
    ) -> BodyIterator:
        """``async for chunk in request.iter_body(): ...`` over the body's chunks as
        they arrive (boundaries are arbitrary). Raises as :meth:`receive_chunk`."""
        return BodyIterator(self, max_bytes, timeout_s)

    async def read_body(
        self,
        *,
        max_bytes: int | _Default | None = LIMIT,
        timeout_s: float | _Default | None = LIMIT,
    ) -> bytes:
        """The whole (remaining) body. Raises as :meth:`receive_chunk`."""
        chunks: list[bytes] = []
        while chunk := await self.receive_chunk(max_bytes=max_bytes, timeout_s=timeout_s):
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def read_json(
        self,
        *,
        require_object: bool = True,
        default: object = _NoDefault.MISSING,
        max_bytes: int | _Default | None = LIMIT,
    ) -> Any:
        """The body parsed as JSON (orjson).

        An empty body returns ``default`` if one is given. With ``require_object``
        (the default) the document must be a JSON object.

        Raises: ``InvalidRequest`` with code ``invalid_json`` and the parser's message
        for unparsable input, code ``invalid_argument`` for a non-object; and whatever
        :meth:`read_body` raises.
        """
        body = await self.read_body(max_bytes=max_bytes)
        if default is not _NoDefault.MISSING and not body.strip():
            return default
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(
                f"request body is not valid JSON: {exc}", code="invalid_json"
            ) from None
        if require_object and not isinstance(document, dict):
            raise InvalidRequest(
                f"request body must be a JSON object, not {type(document).__name__}"
            )
        return document

    async def wait_disconnected(self) -> None:
        """Return once the client closes its end of the connection (or it breaks). A
        client that only half-closes (shuts down its sending side) counts as gone.

        For streaming responses without a request body (a streaming consume): run it in
        a task beside the writer to notice a departed client *before* the next write,
        rather than writing a delivery into a dead socket. It becomes the reader, so the
        body must already be complete. Bytes of pipelined requests that arrive meanwhile
        are kept for later, up to ``max_header_bytes``; past that it stops watching.

        Raises: ``RuntimeError`` if the body has not been read to its end.
        """
        if not self._body_done:
            raise RuntimeError("wait_disconnected() needs the request body read to its end")
        await self._conn.wait_peer_eof()


class BodyIterator:
    """Async iterator over a request body's chunks (see ``Request.iter_body``)."""

    __slots__ = ("_max_bytes", "_request", "_timeout_s")

    def __init__(
        self,
        request: Request,
        max_bytes: int | _Default | None,
        timeout_s: float | _Default | None,
    ) -> None:
        self._request = request
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s

    def __aiter__(self) -> BodyIterator:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._request.receive_chunk(
            max_bytes=self._max_bytes, timeout_s=self._timeout_s
        )
        if not chunk:
            raise StopAsyncIteration
        return chunk


class Response:
    """The response to one request: either one complete message (``send_json``,
    ``send_bytes``, ``send_error``, ``send_empty``) or a stream (``start``, ``send``...,
    ``end``) sent with chunked transfer coding (close-delimited to HTTP/1.0 clients).

    Every method raises ``ClientDisconnected`` if the client is gone or stopped reading
    for ``send_timeout_s``, and ``RuntimeError`` when called out of order. The response
    to a ``HEAD`` request silently drops its body (RFC 9110 section 9.3.2).
    """

    __slots__ = ("_chunked", "_conn", "_head", "finished", "started", "status_code")

    def __init__(self, conn: _Connection, request: Request) -> None:
        self._conn = conn
        self._head = request.method == "HEAD"
        # A streamed body goes out in chunks (an HTTP/1.1 client, no Content-Length).
        self._chunked = False
        #: The status line and headers have been handed to the socket.
        self.started = False
        #: The response is complete.
        self.finished = False
        self.status_code: int | None = None

    def __repr__(self) -> str:
        state = "finished" if self.finished else "started" if self.started else "pending"
        return f"<Response {self.status_code} {state}>"

    @property
    def streaming(self) -> bool:
        """A streamed response is under way (started, not ended)."""
        return self.started and not self.finished

    async def send_json(self, status: int, obj: object, *, headers: HeaderInput = None) -> None:
        """Send ``obj`` encoded by orjson as the whole response.

        Raises: ``orjson.JSONEncodeError`` (a ``TypeError``) if ``obj`` is not
        serializable -- before anything is sent; and as the class says.
        """
        await self._send_complete(status, _JSON, orjson.dumps(obj), headers)

    async def send_bytes(
        self,
        status: int,
        body: bytes,
        *,
        content_type: str = "application/octet-stream",
        headers: HeaderInput = None,
    ) -> None:
        """Send ``body`` as the whole response."""
        await self._send_complete(status, content_type.encode("latin-1"), body, headers)

    async def send_empty(self, status: int = 204, *, headers: HeaderInput = None) -> None:
        """Send a response without a body (``204 No Content`` by default)."""
        await self._send_complete(status, None, b"", headers)

    async def send_error(self, exc: HTTPError, *, headers: HeaderInput = None) -> None:
        """Send ``{"error": exc.code, "message": exc.message}`` with ``exc.status``,
        plus the headers the error carries (``Allow`` for a 405)."""
        extra = _encode_headers(headers)
        extra.extend(_encode_headers(exc.headers))
        await self._send_complete(exc.status, _JSON, orjson.dumps(exc.to_json()), extra)

    async def _send_complete(
        self,
        status: int,
        content_type: bytes | None,
        body: bytes,
        headers: HeaderInput | list[tuple[bytes, bytes]],
    ) -> None:
        if self.started:
            raise RuntimeError("the response has already been started")
        conn = self._conn
        fields: list[tuple[bytes, bytes]] = [(b"date", _http_date())]
        if status not in _NO_BODY_STATUSES:
            if content_type is not None:
                fields.append((b"content-type", content_type))
            fields.append((b"content-length", b"%d" % len(body)))
        if headers:
            fields.extend(headers if isinstance(headers, list) else _encode_headers(headers))
        if conn.close_after_response(status):
            fields.append(_CLOSE_HEADER)
        events: list[h11.Event] = [
            h11.Response(status_code=status, headers=fields, reason=_REASONS.get(status, b""))
        ]
        if body and not self._head and status not in _NO_BODY_STATUSES:
            events.append(h11.Data(data=body))
        events.append(h11.EndOfMessage())
        self.started = True
        self.status_code = status
        await conn.send_events(events)
        self.finished = True

    async def start(
        self,
        status: int = 200,
        *,
        content_type: str | None = None,
        headers: HeaderInput = None,
    ) -> None:
        """Send the status line and headers of a streamed response.

        A 2xx/1xx status also answers a pending ``Expect: 100-continue`` first: the
        client is about to be read from while this response streams (full duplex).
        """
        if self.started:
            raise RuntimeError("the response has already been started")
        conn = self._conn
        fields: list[tuple[bytes, bytes]] = [(b"date", _http_date())]
        if content_type is not None:
            fields.append((b"content-type", content_type.encode("latin-1")))
        fields.extend(_encode_headers(headers))
        events: list[h11.Event] = []
        answer_continue = status < 300 and conn.h11.they_are_waiting_for_100_continue
        if answer_continue:
            events.append(h11.InformationalResponse(status_code=100, headers=[]))
        if conn.close_after_response(status, answering_continue=answer_continue):
            fields.append(_CLOSE_HEADER)
        events.append(
            h11.Response(status_code=status, headers=fields, reason=_REASONS.get(status, b""))
        )
        self.started = True
        self.status_code = status
        self._chunked = (
            not self._head
            and conn.h11.their_http_version == b"1.1"
            and not any(name == b"content-length" for name, _ in fields)
        )
        await conn.send_events(events)

    def can_send_nowait(self) -> bool:
        """:meth:`send_nowait` may be called now: a chunked stream is under way on a
        plain TCP socket, no write is in progress and nothing is left over."""
        conn = self._conn
        return (
            self._chunked
            and not self.finished
            and conn.socket is not None
            and not conn.unsent
            and not conn.broken
            and not conn.send_lock_held()
        )

    def send_nowait(self, data: bytes) -> bool:
        """Send one piece (one chunk) without a schedule point; only when
        :meth:`can_send_nowait`. Returns True when part of it is left over: it goes out
        first with the next :meth:`send`, :meth:`flush` or :meth:`end`, so the caller
        must make sure one follows. Never raises for a broken connection: that shows
        in the next send."""
        assert self.can_send_nowait(), "send_nowait() needs can_send_nowait()"
        return self._conn.write_nowait(b"%x\r\n%b\r\n" % (len(data), data))

    async def flush(self) -> None:
        """Send what :meth:`send_nowait` left over (if anything)."""
        if self._conn.unsent:
            await self._conn.send_events([])

    async def send(self, data: bytes) -> None:
        """Send one piece of a streamed response (as one chunk). Empty data is a no-op."""
        if not self.started or self.finished:
            raise RuntimeError("send() needs a started, unfinished response")
        if data and not self._head:
            await self._conn.send_events([h11.Data(data=data)])

    async def end(self) -> None:
        """Finish a streamed response (the terminating zero-length chunk)."""
        if not self.started:
            raise RuntimeError("end() before start()")
        if self.finished:
            return
        self.finished = True
        await self._conn.send_events([h11.EndOfMessage()])


class _Connection:
    """One client connection: the connection loop plus the IO primitives the
    ``Request`` and ``Response`` objects use. See the module docstring for the rules."""

    __slots__ = (
        "_broken",
        "_eof",
        "_head_scope",
        "_pending",
        "_reading",
        "_send_lock",
        "_send_started",
        "_send_timed_out",
        "_served",
        "_waiting_idle",
        "accepted_at",
        "h11",
        "limits",
        "must_close",
        "request",
        "response",
        "scope",
        "shared",
        "socket",
        "stream",
        "unsent",
    )

    def __init__(self, shared: _Shared, stream: trio.abc.Stream) -> None:
        self.shared = shared
        self.limits = shared.limits
        self.stream = stream
        # h11 bounds the *incomplete* head it buffers; a complete head is re-checked
        # in _check_head (RFC 9110 section 5.4 leaves the limit to the server).
        self.h11 = h11.Connection(
            h11.SERVER, max_incomplete_event_size=shared.limits.max_header_bytes
        )
        self.scope = trio.CancelScope()
        self.accepted_at = trio.current_time()
        #: Close after the current response (set by limits and errors mid-exchange).
        self.must_close = False
        self.request: Request | None = None
        self.response: Response | None = None
        self._send_lock = trio.StrictFIFOLock()
        self._reading = False
        self._eof = False
        self._broken = False
        self._served = 0
        self._head_scope: trio.CancelScope | None = None
        self._waiting_idle = False
        self._send_started: float | None = None
        self._send_timed_out = False
        #: What :meth:`write_nowait` writes to: only a plain TCP stream has one (not
        #: TLS, not a test's memory stream), and only on POSIX, where write(2) takes it.
        self.socket = (
            stream.socket if isinstance(stream, trio.SocketStream) and os.name == "posix" else None
        )
        #: Bytes a :meth:`write_nowait` left over: they go out before any other.
        self.unsent = b""
        #: A body event (or parse error) pulled from h11 ahead of the handler's read.
        self._pending: h11.Data | h11.RemoteProtocolError | None = None

    @property
    def remote(self) -> str | None:
        stream = self.stream
        if isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        sock = getattr(stream, "socket", None)
        if sock is None:
            return None
        try:
            peer = sock.getpeername()
        except OSError:
            return None
        if isinstance(peer, tuple):
            return f"{peer[0]}:{peer[1]}"
        return str(peer)

    @property
    def idle(self) -> bool:
        """Waiting for a request that has not begun to arrive."""
        return self._head_scope is not None and self._waiting_idle

    async def abort_stalled_send(self, now: float) -> None:
        """Called by the server's watchdog: if a write has been blocked longer than
        ``send_timeout_s`` (the client stopped reading), close the stream so that the
        write fails and the handler sees ``ClientDisconnected``."""
        started = self._send_started
        timeout_s = self.limits.send_timeout_s
        if started is not None and timeout_s is not None and now - started > timeout_s:
            self._send_timed_out = True
            await trio.aclose_forcefully(self.stream)

    def close_idle(self) -> bool:
        """Close this connection now if it is idle; say whether it was."""
        if self.idle:
            assert self._head_scope is not None
            self._head_scope.cancel()
            return True
        return False

    # -- the connection loop -------------------------------------------------------

    async def run(self) -> None:
        """Serve requests until the connection ends; never raises except Cancelled."""
        try:
            while True:
                event = await self._read_head()
                if event is None:
                    break
                if not await self._exchange(event):
                    break
                self._served += 1
        except Exception:
            log.exception("HTTP connection from %s failed", self.remote)
        finally:
            await self._close()

    async def _read_head(self) -> h11.Request | None:
        """The next request head, or ``None`` to close (after answering if need be)."""
        h = self.h11
        event: h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED] | None
        try:
            event = h.next_event()
            if event is h11.NEED_DATA:
                event = await self._await_head()
            if type(event) is h11.Request:
                return event
            return None  # ConnectionClosed: the client ended a keep-alive connection
        except h11.RemoteProtocolError as exc:
            if self._eof and not h.trailing_data[0]:
                return None
            log.debug("bad request head from %s: %s", self.remote, exc)
            await self._answer_without_handler(protocol_error(exc))
        except RequestTimeout as exc:
            await self._answer_without_handler(exc)
        except ClientDisconnected:
            pass
        return None

    async def _await_head(
        self,
    ) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED] | None:
        """Read until h11 has a whole head, under the header/idle deadlines."""
        h = self.h11
        limits = self.limits
        partial = bool(h.trailing_data[0])
        if not partial and self.shared.closing.is_set():
            return None  # shutting down: no new request on this connection
        if self._served == 0:
            deadline = self.accepted_at + limits.header_timeout_s
        elif partial:
            deadline = trio.current_time() + limits.header_timeout_s
        else:
            deadline = trio.current_time() + limits.idle_timeout_s
        seen_bytes = partial
        with trio.CancelScope(deadline=deadline) as scope:
            self._head_scope = scope
            self._waiting_idle = not partial
            try:
                while True:
                    data = await self._receive(None)
                    if data and not seen_bytes:
                        seen_bytes = True
                        self._waiting_idle = False
                        if self._served:
                            scope.deadline = trio.current_time() + limits.header_timeout_s
                    event = h.next_event()
                    if event is not h11.NEED_DATA:
                        return event
            finally:
                self._head_scope = None
                self._waiting_idle = False
        if not seen_bytes:
            return None  # idle timeout, or closed by a graceful shutdown
        raise RequestTimeout(f"request head not complete within {limits.header_timeout_s:g} s")

    async def _exchange(self, event: h11.Request) -> bool:
        """Run the app for one request; return whether to keep the connection."""
        request = Request(self, event)
        response = Response(self, request)
        self.request = request
        self.response = response
        self._pending = None
        # Peek at the body without IO: a body-less request (most of them) is then known
        # complete from the start, which the drain, the close decision and
        # wait_disconnected() rely on; a body already buffered is kept for the reader.
        try:
            first = self.h11.next_event()
        except h11.RemoteProtocolError as exc:
            self._pending = exc
        else:
            if type(first) is h11.EndOfMessage:
                request._body_done = True
            elif type(first) is h11.Data:
                self._pending = first
        try:
            problem = self._check_head(event)
            if problem is not None:
                self.must_close = True
                await response.send_error(problem)
                return False
            try:
                await self.shared.app(request, response)
            except Exception as exc:
                return await self._handler_failed(request, response, exc)
            if not response.started:
                log.error(
                    "handler for %s %s returned without responding", request.method, request.path
                )
                await response.send_error(HTTPError("the handler did not produce a response"))
            elif not response.finished:
                await response.end()
            return await self._finish_cycle()
        except ClientDisconnected:
            return False
        finally:
            self.shared.requests_served += 1
            self.request = None
            self.response = None

    def _check_head(self, event: h11.Request) -> HTTPError | None:
        """Limits h11 cannot check: header count, and the size of a head that arrived
        complete in one read (h11 only bounds an incomplete one)."""
        limits = self.limits
        headers = event.headers
        if len(headers) > limits.max_headers:
            return HeaderFieldsTooLarge(
                f"request has {len(headers)} header fields; the limit is {limits.max_headers}"
            )
        size = len(event.target) + len(event.method) + 12
        for name, value in headers:
            size += len(name) + len(value) + 4
        if size > limits.max_header_bytes:
            return HeaderFieldsTooLarge(
                f"request head exceeds the limit of {limits.max_header_bytes} bytes"
            )
        return None

    async def _handler_failed(self, request: Request, response: Response, exc: Exception) -> bool:
        """Turn an exception escaping the handler into a response (or a close)."""
        if _only(exc, ClientDisconnected):
            log.debug("client left during %s %s", request.method, request.path)
            return False
        leaf: BaseException | None = _single_leaf(exc)
        if leaf is not None and not isinstance(leaf, HTTPError):
            leaf = self.shared.error_translator(leaf)
        if isinstance(leaf, HTTPError):
            if not response.started:
                await response.send_error(leaf)
                return await self._finish_cycle()
            log.warning(
                "%s %s failed after its response started: %s",
                request.method,
                request.path,
                leaf.message,
            )
            self.must_close = True
            return False
        log.error(
            "unhandled error in handler for %s %s", request.method, request.path, exc_info=exc
        )
        self.must_close = True
        if not response.started:
            await response.send_error(HTTPError("internal server error"))
        return False

    async def _finish_cycle(self) -> bool:
        """After a complete response: keep the connection for another request?"""
        h = self.h11
        if self._broken or self.must_close or self.shared.closing.is_set():
            return False
        if h.our_state is not h11.DONE:
            return False  # MUST_CLOSE: Connection: close, HTTP/1.0, or an error
        if h.their_state is h11.SEND_BODY and not await self._drain_body():
            return False
        if h.their_state is not h11.DONE:
            return False
        h.start_next_cycle()
        return True

    async def _drain_body(self) -> bool:
        """Discard an unread request body if it is small; say whether it was.

        The common case -- a body-less GET whose end h11 has not reported yet -- costs
        one ``next_event()`` and no IO.
        """
        request = self.request
        assert request is not None
        budget = self.limits.max_drain_bytes
        checked_declared = False
        try:
            while True:
                event = self._pull()
                if type(event) is h11.EndOfMessage:
                    request._body_done = True
                    return True
                if type(event) is h11.Data:
                    budget -= len(event.data)
                    if budget < 0:
                        return False
                    continue
                if event is not h11.NEED_DATA:
                    return False
                if not checked_declared:
                    checked_declared = True
                    declared = request.content_length
                    if (
                        declared is None
                        or declared - request._body_received > self.limits.max_drain_bytes
                    ):
                        return False
                await self._receive(self.limits.body_timeout_s)
        except (h11.RemoteProtocolError, HTTPError, ClientDisconnected):
            return False

    async def _answer_without_handler(self, exc: HTTPError) -> None:
        """Answer a request that never reached a handler, then close."""
        self.must_close = True
        h = self.h11
        if h.our_state is not h11.IDLE and h.our_state is not h11.SEND_RESPONSE:
            return
        fields = [
            (b"date", _http_date()),
            (b"content-type", _JSON),
            (b"connection", b"close"),
        ]
        body = orjson.dumps(exc.to_json())
        fields.append((b"content-length", b"%d" % len(body)))
        try:
            await self.send_events(
                [
                    h11.Response(
                        status_code=exc.status,
                        headers=fields,
                        reason=_REASONS.get(exc.status, b""),
                    ),
                    h11.Data(data=body),
                    h11.EndOfMessage(),
                ]
            )
        except (ClientDisconnected, h11.LocalProtocolError):
            pass
        self.shared.requests_served += 1

    async def _close(self) -> None:
        """Close the stream, lingering first if the client may still be sending.

        Closing a TCP socket with unread input makes the kernel send RST, and a client
        still writing its request then loses our response (RFC 9112 section 9.6 asks
        for a half-close and a short wait instead). So: shut down our send side, read
        and discard until the client closes, bounded by ``linger_s`` and
        ``max_linger_bytes``; then close.
        """
        stream = self.stream
        h = self.h11
        # The client may still be sending if its body is unfinished, its input was
        # malformed, or bytes of a further request are already here.
        may_be_sending = (
            h.their_state is h11.SEND_BODY
            or h.their_state is h11.ERROR
            or bool(h.trailing_data[0])
        )
        try:
            if may_be_sending and not (self._eof or self._broken) and self.limits.linger_s > 0:
                with trio.move_on_after(self.limits.linger_s):
                    if isinstance(stream, trio.abc.HalfCloseableStream):
                        await stream.send_eof()
                    discarded = 0
                    while discarded <= self.limits.max_linger_bytes:
                        data = await stream.receive_some(self.limits.read_chunk_bytes)
                        if not data:
                            break
                        discarded += len(data)
        except (*_GONE, trio.BusyResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    # -- IO primitives used by Request and Response --------------------------------

    def close_after_response(self, status: int, *, answering_continue: bool = False) -> bool:
        """Decide, as a response starts, whether it must announce ``Connection: close``.

        Yes when shutting down, when a limit or error already doomed the connection,
        when the client waits for ``100 Continue`` it will not get (RFC 9110 section
        10.1.1: say whether the body will be read), and for an error response when the
        unread body is too large (or unknown) to drain.
        """
        if self.must_close or self.shared.closing.is_set():
            return True
        if self.h11.they_are_waiting_for_100_continue and not answering_continue:
            self.must_close = True
            return True
        if status >= 400 and not self._body_drainable():
            self.must_close = True
            return True
        return False

    def _body_drainable(self) -> bool:
        request = self.request
        if request is None or request._body_done:
            return True
        declared = request.content_length
        return (
            declared is not None
            and declared - request._body_received <= self.limits.max_drain_bytes
        )

    async def next_body_event(self, timeout_s: float | None) -> h11.Data | h11.EndOfMessage:
        """The next body event, reading from the stream as needed.

        Raises: ``RequestTimeout``, ``BadRequest`` & co. (via ``protocol_error``),
        ``ClientDisconnected``, ``trio.BusyResourceError``.
        """
        h = self.h11
        while True:
            try:
                event = self._pull()
            except h11.RemoteProtocolError as exc:
                self.must_close = True
                if self._eof:
                    raise ClientDisconnected(
                        "the client closed the connection before the request body ended"
                    ) from exc
                raise protocol_error(exc) from exc
            if event is h11.NEED_DATA:
                if h.they_are_waiting_for_100_continue:
                    # RFC 9110 section 10.1.1: the handler wants the body, so invite it.
                    await self.send_events(
                        [h11.InformationalResponse(status_code=100, headers=[])]
                    )
                await self._receive(timeout_s)
                continue
            if type(event) is h11.Data or type(event) is h11.EndOfMessage:
                return event
            raise AssertionError(f"unexpected h11 event while reading a body: {event!r}")

    def _pull(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """The next h11 event, the peeked one first. Raises ``h11.RemoteProtocolError``."""
        pending = self._pending
        if pending is None:
            return self.h11.next_event()
        self._pending = None
        if isinstance(pending, h11.RemoteProtocolError):
            raise pending
        return pending

    async def _receive(self, timeout_s: float | None) -> bytes | bytearray:
        """Read once from the stream into h11; ``b""`` means end of stream.

        Raises: ``RequestTimeout`` (only with a timeout), ``ClientDisconnected``,
        ``trio.BusyResourceError``.
        """
        if self._reading:
            raise trio.BusyResourceError("another task is already reading this request")
        if self._eof:
            return b""
        self._reading = True
        try:
            if timeout_s is None:
                data = await self.stream.receive_some(self.limits.read_chunk_bytes)
            else:
                with trio.move_on_after(timeout_s) as scope:
                    data = await self.stream.receive_some(self.limits.read_chunk_bytes)
                if scope.cancelled_caught:
                    self.must_close = True
                    raise RequestTimeout(f"no request data received for {timeout_s:g} s")
        except _GONE as exc:
            self._broken = True
            raise ClientDisconnected("the connection to the client broke") from exc
        finally:
            self._reading = False
        self.h11.receive_data(cast(bytes, data))  # h11 takes any bytes-like object
        if not data:
            self._eof = True
        return data

    async def wait_peer_eof(self) -> None:
        """Read (keeping pipelined bytes in h11's buffer) until the client closes."""
        buffered = 0
        while not self._eof and not self._broken:
            if buffered > self.limits.max_header_bytes:
                await trio.sleep_forever()
            try:
                data = await self._receive(None)
            except ClientDisconnected:
                return
            buffered += len(data)

    @property
    def broken(self) -> bool:
        return self._broken

    def send_lock_held(self) -> bool:
        return self._send_lock.locked()

    def write_nowait(self, framed: bytes) -> bool:
        """Write what the socket takes now (the caller checked that no write is in
        progress and nothing is left over); keep the rest in ``unsent``. True if some
        is left. A failed write keeps everything: the next send reports the failure."""
        assert self.socket is not None
        try:
            # fileno() is -1 once the socket is closed: EBADF, never another file.
            written = os.write(self.socket.fileno(), framed)
        except OSError:  # BlockingIOError included
            written = 0
        if written < len(framed):
            self.unsent = framed[written:]
            return True
        return False

    async def send_events(self, events: list[h11.Event]) -> None:
        """Serialize ``events`` with h11 and write them, holding the send lock; what
        :meth:`write_nowait` left over goes first. No events: only that.

        Raises: ``ClientDisconnected``; ``h11.LocalProtocolError`` for a handler bug
        (such as more data than the declared Content-Length).
        """
        lock = self._send_lock
        try:
            lock.acquire_nowait()  # fast path: no scheduler round-trip when free
        except trio.WouldBlock:
            await lock.acquire()
        try:
            if self._broken:
                raise ClientDisconnected("the connection to the client is closed")
            h = self.h11
            if len(events) == 1:
                payload = h.send(events[0])
            else:
                payload = b"".join([h.send(event) or b"" for event in events])
            assert payload is not None
            if self.unsent:
                payload = self.unsent + payload
                self.unsent = b""
            await self._send_all(payload)
        finally:
            lock.release()

    async def _send_all(self, payload: bytes) -> None:
        """Write ``payload``, enforcing ``send_timeout_s``.

        A cancel scope per write costs about as much as h11's work for a small response,
        so when the server runs a watchdog task the write is only timestamped and the
        watchdog closes the stream of a stalled one (the blocked write then fails with
        ``ClosedResourceError``). A lone ``serve_stream`` uses a scope instead.
        """
        timeout_s = self.limits.send_timeout_s
        try:
            if timeout_s is None or self.shared.send_watchdog:
                self._send_started = trio.current_time()
                try:
                    await self.stream.send_all(payload)
                finally:
                    self._send_started = None
                return
            with trio.move_on_after(timeout_s):
                await self.stream.send_all(payload)
                return
        except _GONE as exc:
            self._broken = True
            self.h11.send_failed()
            if self._send_timed_out:
                raise ClientDisconnected(
                    f"the client stopped reading: a write made no progress for {timeout_s:g} s"
                ) from exc
            raise ClientDisconnected("the connection to the client broke") from exc
        except BaseException:
            # Cancelled mid-write: an unknown prefix went out, the stream is unusable.
            self._broken = True
            self.h11.send_failed()
            raise
        self._broken = True
        self.h11.send_failed()
        raise ClientDisconnected(
            f"the client stopped reading: a write made no progress for {timeout_s:g} s"
        )


def _only(exc: BaseException, cls: type[BaseException]) -> bool:
    """``exc`` is ``cls``, or a (nested) exception group of nothing but ``cls``."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only(inner, cls) for inner in exc.exceptions)
    return isinstance(exc, cls)


def _single_leaf(exc: BaseException) -> BaseException:
    """Unwrap exception groups holding exactly one exception (a handler's nursery)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc

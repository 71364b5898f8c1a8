"""The reading half of one HTTP/1.1 connection: requests and their bodies.

One job: take bytes from the socket into h11 and hand the events to whoever reads.

* :class:`Request` is what a handler reads from: method, target, path, headers, query,
  and the body on demand (``read_body``, ``read_json``, ``iter_body``,
  ``receive_chunk``), each bounded by ``max_bytes`` and ``timeout_s`` (the server's
  ``Limits`` unless given; ``None``: no limit, a long-lived channel).
* :class:`RequestReader` owns the reading state of the connection. **One reader:**
  body reads may happen in any task of the handler, but only one at a time (a second
  concurrent reader gets ``trio.BusyResourceError``); between requests only the
  connection loop reads. A body event peeked before the handler ran (``begin``) is
  kept for the first read. If the client sent ``Expect: 100-continue``, the first read
  answers ``100 Continue`` through the writing half (``writing.py``).
* h11 allows the server to send while the client's body still arrives (the halves of
  its state machine are independent), so a handler can ``start()`` a streaming
  response, read in one task and write in another: that is the channel.
"""

from __future__ import annotations

import enum
from typing import Any, Final, cast

import h11
import orjson
import trio

from broker.http.errors import (
    ClientDisconnected,
    HTTPError,
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    protocol_error,
)
from broker.http.headers import Headers
from broker.http.query import QueryParams
from broker.http.wire import GONE, Wire
from broker.http.writing import ResponseWriter

__all__ = ["LIMIT", "BodyIterator", "Request", "RequestReader"]


class _Default(enum.Enum):
    LIMIT = "limit"


#: Default for ``max_bytes`` / ``timeout_s`` arguments: use the server's ``Limits``.
#: ``None`` means no limit.
LIMIT: Final = _Default.LIMIT


class _NoDefault(enum.Enum):
    MISSING = "missing"


class RequestReader:
    """Reads one connection's bytes into h11: request heads (for the connection loop)
    and bodies (for the handler), one reader at a time."""

    __slots__ = ("_pending", "_reading", "_writer", "closing", "eof", "h11", "limits", "stream", "wire")

    def __init__(self, wire: Wire, writer: ResponseWriter, closing: trio.Event) -> None:
        self.wire = wire
        self.h11 = wire.h11
        self.stream = wire.stream
        self.limits = wire.limits
        self._writer = writer
        #: Set when the server begins a graceful shutdown.
        self.closing = closing
        self._reading = False
        #: The client closed its sending side (or the connection ended).
        self.eof = False
        #: A body event (or parse error) pulled from h11 ahead of the handler's read.
        self._pending: h11.Data | h11.RemoteProtocolError | None = None

    def begin(self, request: Request) -> None:
        """A request's head was read: peek at its body without IO. A body-less request
        (most of them) is then known complete from the start, which the drain, the
        close decision and ``wait_disconnected()`` rely on; a body already buffered is
        kept for the first read."""
        self._pending = None
        try:
            first = self.h11.next_event()
        except h11.RemoteProtocolError as exc:
            self._pending = exc
        else:
            if type(first) is h11.EndOfMessage:
                request._body_done = True
            elif type(first) is h11.Data:
                self._pending = first

    async def next_body_event(self, timeout_s: float | None) -> h11.Data | h11.EndOfMessage:
        """The next body event, reading from the stream as needed.

        Raises: ``RequestTimeout``, ``BadRequest`` & co. (via ``protocol_error``),
        ``ClientDisconnected``, ``trio.BusyResourceError``.
        """
        h = self.h11
        while True:
            try:
                event = self.pull()
            except h11.RemoteProtocolError as exc:
                self.wire.must_close = True
                if self.eof:
                    raise ClientDisconnected(
                        "the client closed the connection before the request body ended"
                    ) from exc
                raise protocol_error(exc) from exc
            if event is h11.NEED_DATA:
                if h.they_are_waiting_for_100_continue:
                    # RFC 9110 section 10.1.1: the handler wants the body, so invite it.
                    await self._writer.send_events(
                        [h11.InformationalResponse(status_code=100, headers=[])]
                    )
                await self.receive(timeout_s)
                continue
            if type(event) is h11.Data or type(event) is h11.EndOfMessage:
                return event
            raise AssertionError(f"unexpected h11 event while reading a body: {event!r}")

    def pull(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """The next h11 event, the peeked one first. Raises ``h11.RemoteProtocolError``."""
        pending = self._pending
        if pending is None:
            return self.h11.next_event()
        self._pending = None
        if isinstance(pending, h11.RemoteProtocolError):
            raise pending
        return pending

    async def receive(self, timeout_s: float | None) -> bytes | bytearray:
        """Read once from the stream into h11; ``b""`` means end of stream.

        Raises: ``RequestTimeout`` (only with a timeout), ``ClientDisconnected``,
        ``trio.BusyResourceError``.
        """
        if self._reading:
            raise trio.BusyResourceError("another task is already reading this request")
        if self.eof:
            return b""
        self._reading = True
        try:
            if timeout_s is None:
                data = await self.stream.receive_some(self.limits.read_chunk_bytes)
            else:
                with trio.move_on_after(timeout_s) as scope:
                    data = await self.stream.receive_some(self.limits.read_chunk_bytes)
                if scope.cancelled_caught:
                    self.wire.must_close = True
                    raise RequestTimeout(f"no request data received for {timeout_s:g} s")
        except GONE as exc:
            self.wire.broken = True
            raise ClientDisconnected("the connection to the client broke") from exc
        finally:
            self._reading = False
        self.h11.receive_data(cast(bytes, data))  # h11 takes any bytes-like object
        if not data:
            self.eof = True
        return data

    async def wait_peer_eof(self) -> None:
        """Read (keeping pipelined bytes in h11's buffer) until the client closes."""
        buffered = 0
        while not self.eof and not self.wire.broken:
            if buffered > self.limits.max_header_bytes:
                await trio.sleep_forever()
            try:
                data = await self.receive(None)
            except ClientDisconnected:
                return
            buffered += len(data)

    async def drain_body(self, request: Request) -> bool:
        """Discard an unread request body if it is small; say whether it was.

        The common case -- a body-less GET whose end h11 has not reported yet -- costs
        one ``next_event()`` and no IO.
        """
        budget = self.limits.max_drain_bytes
        checked_declared = False
        try:
            while True:
                event = self.pull()
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
                await self.receive(self.limits.body_timeout_s)
        except (h11.RemoteProtocolError, HTTPError, ClientDisconnected):
            return False


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
        "_event",
        "_reader",
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

    def __init__(self, reader: RequestReader, event: h11.Request) -> None:
        self._reader = reader
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

    def unread_body_fits(self, max_bytes: int) -> bool:
        """The rest of the body is read, or known (``Content-Length``) to be at most
        ``max_bytes``: cheap enough to discard and keep the connection."""
        if self._body_done:
            return True
        declared = self.content_length
        return declared is not None and declared - self._body_received <= max_bytes

    @property
    def remote(self) -> str | None:
        """``"host:port"`` of the client, when the stream is a socket."""
        return self._reader.wire.remote

    @property
    def server_closing(self) -> trio.Event:
        """Set when the server begins a graceful shutdown; a long-lived handler (a
        channel, a streaming consume) can wait on it to say goodbye in-band."""
        return self._reader.closing

    def _limit(self, max_bytes: int | _Default | None) -> int | None:
        return self._reader.limits.max_body_bytes if max_bytes is LIMIT else max_bytes

    def _timeout(self, timeout_s: float | _Default | None) -> float | None:
        return self._reader.limits.body_timeout_s if timeout_s is LIMIT else timeout_s

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
        reader = self._reader
        event = await reader.next_body_event(self._timeout(timeout_s))
        if type(event) is h11.EndOfMessage:
            self._body_done = True
            return b""
        data = bytes(event.data)  # type: ignore[union-attr]
        self._body_received += len(data)
        if limit is not None and self._body_received > limit:
            reader.wire.must_close = True
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
        await self._reader.wait_peer_eof()


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

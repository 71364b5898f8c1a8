"""The writing half of one HTTP/1.1 connection: responses, and the bytes under them.

One job: get a handler's response onto the socket in the order h11 produced it.

* :class:`Response` is what a handler writes to: one complete message (``send_json``,
  ``send_bytes``, ``send_error``, ``send_empty``) or a stream (``start``, ``send``...,
  ``end``) in chunked coding (close-delimited to HTTP/1.0 clients).
* :class:`ResponseWriter` moves the bytes. **One writer at a time:** every write takes
  the connection's FIFO send lock, and the h11 ``send()`` that produces the bytes
  happens *under* that lock, so bytes reach the socket in the order h11 saw the events
  (the reading half writes too: ``100 Continue``).
* **Writes without a schedule point.** ``Response.send_nowait`` frames a chunk itself
  and writes it with a non-blocking ``write(2)`` in the caller's own step, when nobody
  holds the send lock and nothing is left over (plain TCP, POSIX, chunked coding only).
  Whatever the socket did not take is kept (``unsent``) and goes out under the lock
  before anything else. h11 keeps no state per chunk it writes, so skipping it for
  these chunks leaves its state machine right.
* **Send timeout.** A write that makes no progress for ``send_timeout_s`` fails with
  ``ClientDisconnected``: the server's watchdog task closes the stream of a stalled
  write (:meth:`ResponseWriter.abort_stalled_send`), or, without one, a cancel scope
  bounds it.

Whether a response must announce ``Connection: close`` is the connection's decision
(:class:`ClosePolicy`, ``connection.py``): it knows the request's body and the server's
state.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Final, Protocol, TypeAlias

import h11
import orjson
import trio

from broker.http.errors import ClientDisconnected, HTTPError
from broker.http.wire import GONE, Wire

__all__ = [
    "JSON_TYPE",
    "REASONS",
    "ClosePolicy",
    "HeaderInput",
    "Response",
    "ResponseWriter",
    "SendWatchdog",
    "encode_headers",
    "http_date",
]

#: Response headers a handler may add: a mapping or ``(name, value)`` pairs.
HeaderInput: TypeAlias = Mapping[str, str] | Iterable[tuple[str, str]] | None

JSON_TYPE: Final = b"application/json"
_NO_BODY_STATUSES: Final = frozenset({204, 304})
_CLOSE_HEADER: Final = (b"connection", b"close")
#: Reason phrases are optional (RFC 9112 section 4) but humans reading curl -i like them.
REASONS: Final = {status.value: status.phrase.encode("ascii") for status in HTTPStatus}


_date_second = 0
_date_value = b""


def http_date() -> bytes:
    """The ``Date`` header value (RFC 9110 section 6.6.1: an origin server with a clock
    MUST send it), formatted at most once per second."""
    global _date_second, _date_value
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_value = formatdate(now, usegmt=True).encode("ascii")
    return _date_value


def encode_headers(headers: HeaderInput) -> list[tuple[bytes, bytes]]:
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(name.encode("ascii"), value.encode("latin-1")) for name, value in items]


class ClosePolicy(Protocol):
    """Decides, as a response starts, whether the connection closes after it."""

    def close_after_response(self, status: int, *, answering_continue: bool = False) -> bool: ...


class SendWatchdog(Protocol):
    """Says whether a server task enforces ``send_timeout_s`` for every connection."""

    send_watchdog: bool


class ResponseWriter:
    """Writes one connection's bytes: h11 events under the send lock, or a chunk now."""

    __slots__ = (
        "_send_lock",
        "_send_started",
        "_send_timed_out",
        "_watchdog",
        "h11",
        "limits",
        "socket",
        "stream",
        "unsent",
        "wire",
    )

    def __init__(self, wire: Wire, watchdog: SendWatchdog) -> None:
        self.wire = wire
        self.h11 = wire.h11
        self.stream = wire.stream
        self.limits = wire.limits
        #: A server task enforces ``send_timeout_s`` (see :meth:`abort_stalled_send`)
        #: so that writes need no cancel scope of their own.
        self._watchdog = watchdog
        self._send_lock = trio.StrictFIFOLock()
        self._send_started: float | None = None
        self._send_timed_out = False
        stream = wire.stream
        #: What :meth:`write_nowait` writes to: only a plain TCP stream has one (not
        #: TLS, not a test's memory stream), and only on POSIX, where write(2) takes it.
        self.socket = (
            stream.socket if isinstance(stream, trio.SocketStream) and os.name == "posix" else None
        )
        #: Bytes a :meth:`write_nowait` left over: they go out before any other.
        self.unsent = b""

    async def abort_stalled_send(self, now: float) -> None:
        """Called by the server's watchdog: if a write has been blocked longer than
        ``send_timeout_s`` (the client stopped reading), close the stream so that the
        write fails and the handler sees ``ClientDisconnected``."""
        started = self._send_started
        timeout_s = self.limits.send_timeout_s
        if started is not None and timeout_s is not None and now - started > timeout_s:
            self._send_timed_out = True
            await trio.aclose_forcefully(self.stream)

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
            if self.wire.broken:
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
            if timeout_s is None or self._watchdog.send_watchdog:
                self._send_started = trio.current_time()
                try:
                    await self.stream.send_all(payload)
                finally:
                    self._send_started = None
                return
            with trio.move_on_after(timeout_s):
                await self.stream.send_all(payload)
                return
        except GONE as exc:
            self.wire.broken = True
            self.h11.send_failed()
            if self._send_timed_out:
                raise ClientDisconnected(
                    f"the client stopped reading: a write made no progress for {timeout_s:g} s"
                ) from exc
            raise ClientDisconnected("the connection to the client broke") from exc
        except BaseException:
            # Cancelled mid-write: an unknown prefix went out, the stream is unusable.
            self.wire.broken = True
            self.h11.send_failed()
            raise
        self.wire.broken = True
        self.h11.send_failed()
        raise ClientDisconnected(
            f"the client stopped reading: a write made no progress for {timeout_s:g} s"
        )


class Response:
    """The response to one request: either one complete message (``send_json``,
    ``send_bytes``, ``send_error``, ``send_empty``) or a stream (``start``, ``send``...,
    ``end``) sent with chunked transfer coding (close-delimited to HTTP/1.0 clients).

    Every method raises ``ClientDisconnected`` if the client is gone or stopped reading
    for ``send_timeout_s``, and ``RuntimeError`` when called out of order. The response
    to a ``HEAD`` request silently drops its body (RFC 9110 section 9.3.2).
    """

    __slots__ = ("_chunked", "_head", "_policy", "_writer", "finished", "started", "status_code")

    def __init__(self, writer: ResponseWriter, policy: ClosePolicy, *, head: bool) -> None:
        self._writer = writer
        self._policy = policy
        self._head = head
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
        await self._send_complete(status, JSON_TYPE, orjson.dumps(obj), headers)

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
        extra = encode_headers(headers)
        extra.extend(encode_headers(exc.headers))
        await self._send_complete(exc.status, JSON_TYPE, orjson.dumps(exc.to_json()), extra)

    async def _send_complete(
        self,
        status: int,
        content_type: bytes | None,
        body: bytes,
        headers: HeaderInput | list[tuple[bytes, bytes]],
    ) -> None:
        if self.started:
            raise RuntimeError("the response has already been started")
        fields: list[tuple[bytes, bytes]] = [(b"date", http_date())]
        if status not in _NO_BODY_STATUSES:
            if content_type is not None:
                fields.append((b"content-type", content_type))
            fields.append((b"content-length", b"%d" % len(body)))
        if headers:
            fields.extend(headers if isinstance(headers, list) else encode_headers(headers))
        if self._policy.close_after_response(status):
            fields.append(_CLOSE_HEADER)
        events: list[h11.Event] = [
            h11.Response(status_code=status, headers=fields, reason=REASONS.get(status, b""))
        ]
        if body and not self._head and status not in _NO_BODY_STATUSES:
            events.append(h11.Data(data=body))
        events.append(h11.EndOfMessage())
        self.started = True
        self.status_code = status
        await self._writer.send_events(events)
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
        writer = self._writer
        fields: list[tuple[bytes, bytes]] = [(b"date", http_date())]
        if content_type is not None:
            fields.append((b"content-type", content_type.encode("latin-1")))
        fields.extend(encode_headers(headers))
        events: list[h11.Event] = []
        answer_continue = status < 300 and writer.h11.they_are_waiting_for_100_continue
        if answer_continue:
            events.append(h11.InformationalResponse(status_code=100, headers=[]))
        if self._policy.close_after_response(status, answering_continue=answer_continue):
            fields.append(_CLOSE_HEADER)
        events.append(
            h11.Response(status_code=status, headers=fields, reason=REASONS.get(status, b""))
        )
        self.started = True
        self.status_code = status
        self._chunked = (
            not self._head
            and writer.h11.their_http_version == b"1.1"
            and not any(name == b"content-length" for name, _ in fields)
        )
        await writer.send_events(events)

    def can_send_nowait(self) -> bool:
        """:meth:`send_nowait` may be called now: a chunked stream is under way on a
        plain TCP socket, no write is in progress and nothing is left over."""
        writer = self._writer
        return (
            self._chunked
            and not self.finished
            and writer.socket is not None
            and not writer.unsent
            and not writer.wire.broken
            and not writer.send_lock_held()
        )

    def send_nowait(self, data: bytes) -> bool:
        """Send one piece (one chunk) without a schedule point; only when
        :meth:`can_send_nowait`. Returns True when part of it is left over: it goes out
        first with the next :meth:`send`, :meth:`flush` or :meth:`end`, so the caller
        must make sure one follows. Never raises for a broken connection: that shows
        in the next send."""
        assert self.can_send_nowait(), "send_nowait() needs can_send_nowait()"
        return self._writer.write_nowait(b"%x\r\n%b\r\n" % (len(data), data))

    async def flush(self) -> None:
        """Send what :meth:`send_nowait` left over (if anything)."""
        if self._writer.unsent:
            await self._writer.send_events([])

    async def send(self, data: bytes) -> None:
        """Send one piece of a streamed response (as one chunk). Empty data is a no-op."""
        if not self.started or self.finished:
            raise RuntimeError("send() needs a started, unfinished response")
        if data and not self._head:
            await self._writer.send_events([h11.Data(data=data)])

    async def end(self) -> None:
        """Finish a streamed response (the terminating zero-length chunk)."""
        if not self.started:
            raise RuntimeError("end() before start()")
        if self.finished:
            return
        self.finished = True
        await self._writer.send_events([h11.EndOfMessage()])

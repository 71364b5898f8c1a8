"""One HTTP/1.1 server connection: its lifecycle and limits, the loop that serves it.

Theory of operation
-------------------

h11's ``Connection`` is the protocol state machine; it never touches the socket. A
:class:`_Connection` owns one stream and one h11 state machine (its :class:`Wire`),
a reading half (``reading.py``: :class:`Request`, :class:`RequestReader`) and a
writing half (``writing.py``: :class:`Response`, :class:`ResponseWriter`), and runs
one task, the *connection loop*:

1. read a request head (timeouts: ``header_timeout_s`` for a head in progress,
   ``idle_timeout_s`` between keep-alive requests);
2. build a :class:`Request` and a :class:`Response` and await the app (a ``Router``)
   in the same task -- no task spawn per request;
3. finish the cycle: make sure a response went out (500 if not), discard a small
   unread request body or decide to close, and ``start_next_cycle()``.

Pipelined requests (RFC 9112 section 9.3.2) need nothing special: h11 keeps the bytes
of the next request in its buffer and step 1 finds them there, so responses go out in
request order because requests are handled one after another.

This module holds what is the connection's own: the loop, the head limits h11 cannot
check, what to answer when a handler fails, whether the connection survives a response
(:meth:`_Connection.close_after_response`, which the response asks), idleness for a
graceful shutdown, and the lingering close. The rules of reading (one reader at a time,
``100 Continue``) are in ``reading.py``; those of writing (one writer at a time under
the send lock, writes without a schedule point, the send timeout) in ``writing.py``.

Failure rules
-------------

* Anything malformed or over a limit before the handler runs: a JSON error
  (400/408/431/501), ``Connection: close``, lingering close.
* An ``HTTPError`` (or an exception the server's ``error_translator`` maps to one)
  escaping the handler before the response started: that error as JSON; the connection is kept if the request body can be drained cheaply.
* Any other exception: logged on ``ackbus.http``, 500 ``internal_error`` if the
  response had not started, connection closed. Other connections are unaffected.
* The client leaving mid-exchange surfaces in the handler as ``ClientDisconnected``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeAlias

import h11
import orjson
import trio

from broker.http.errors import (
    ClientDisconnected,
    HeaderFieldsTooLarge,
    HTTPError,
    RequestTimeout,
    protocol_error,
)
from broker.http.limits import Limits
from broker.http.reading import LIMIT, BodyIterator, Request, RequestReader
from broker.http.wire import GONE, Wire
from broker.http.writing import (
    JSON_TYPE,
    REASONS,
    HeaderInput,
    Response,
    ResponseWriter,
    http_date,
)

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


class _Connection:
    """One client connection: the connection loop, its limits and its close decision,
    over a reading and a writing half. See the module docstring for the rules."""

    __slots__ = (
        "_head_scope",
        "_served",
        "_waiting_idle",
        "accepted_at",
        "limits",
        "reader",
        "request",
        "response",
        "scope",
        "shared",
        "wire",
        "writer",
    )

    def __init__(self, shared: _Shared, stream: trio.abc.Stream) -> None:
        self.shared = shared
        self.limits = shared.limits
        self.wire = Wire(stream, shared.limits)
        self.writer = ResponseWriter(self.wire, shared)
        self.reader = RequestReader(self.wire, self.writer, shared.closing)
        self.scope = trio.CancelScope()
        self.accepted_at = trio.current_time()
        self.request: Request | None = None
        self.response: Response | None = None
        self._served = 0
        self._head_scope: trio.CancelScope | None = None
        self._waiting_idle = False

    @property
    def remote(self) -> str | None:
        return self.wire.remote

    @property
    def idle(self) -> bool:
        """Waiting for a request that has not begun to arrive."""
        return self._head_scope is not None and self._waiting_idle

    async def abort_stalled_send(self, now: float) -> None:
        """Called by the server's watchdog: close the stream of a write blocked longer
        than ``send_timeout_s`` (see ``ResponseWriter.abort_stalled_send``)."""
        await self.writer.abort_stalled_send(now)

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
        h = self.wire.h11
        event: h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED] | None
        try:
            event = h.next_event()
            if event is h11.NEED_DATA:
                event = await self._await_head()
            if type(event) is h11.Request:
                return event
            return None  # ConnectionClosed: the client ended a keep-alive connection
        except h11.RemoteProtocolError as exc:
            if self.reader.eof and not h.trailing_data[0]:
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
        h = self.wire.h11
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
                    data = await self.reader.receive(None)
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
        request = Request(self.reader, event)
        response = Response(self.writer, self, head=request.method == "HEAD")
        self.request = request
        self.response = response
        self.reader.begin(request)
        try:
            problem = self._check_head(event)
            if problem is not None:
                self.wire.must_close = True
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
            self.wire.must_close = True
            return False
        log.error(
            "unhandled error in handler for %s %s", request.method, request.path, exc_info=exc
        )
        self.wire.must_close = True
        if not response.started:
            await response.send_error(HTTPError("internal server error"))
        return False

    async def _finish_cycle(self) -> bool:
        """After a complete response: keep the connection for another request?"""
        wire = self.wire
        h = wire.h11
        if wire.broken or wire.must_close or self.shared.closing.is_set():
            return False
        if h.our_state is not h11.DONE:
            return False  # MUST_CLOSE: Connection: close, HTTP/1.0, or an error
        if h.their_state is h11.SEND_BODY and not await self._drain_request_body():
            return False
        if h.their_state is not h11.DONE:
            return False
        h.start_next_cycle()
        return True

    async def _drain_request_body(self) -> bool:
        """Discard an unread request body if it is small; say whether it was."""
        request = self.request
        assert request is not None
        return await self.reader.drain_body(request)

    async def _answer_without_handler(self, exc: HTTPError) -> None:
        """Answer a request that never reached a handler, then close."""
        self.wire.must_close = True
        h = self.wire.h11
        if h.our_state is not h11.IDLE and h.our_state is not h11.SEND_RESPONSE:
            return
        fields = [
            (b"date", http_date()),
            (b"content-type", JSON_TYPE),
            (b"connection", b"close"),
        ]
        body = orjson.dumps(exc.to_json())
        fields.append((b"content-length", b"%d" % len(body)))
        try:
            await self.writer.send_events(
                [
                    h11.Response(
                        status_code=exc.status,
                        headers=fields,
                        reason=REASONS.get(exc.status, b""),
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
        wire = self.wire
        stream = wire.stream
        h = wire.h11
        # The client may still be sending if its body is unfinished, its input was
        # malformed, or bytes of a further request are already here.
        may_be_sending = (
            h.their_state is h11.SEND_BODY
            or h.their_state is h11.ERROR
            or bool(h.trailing_data[0])
        )
        try:
            if may_be_sending and not (self.reader.eof or wire.broken) and self.limits.linger_s > 0:
                with trio.move_on_after(self.limits.linger_s):
                    if isinstance(stream, trio.abc.HalfCloseableStream):
                        await stream.send_eof()
                    discarded = 0
                    while discarded <= self.limits.max_linger_bytes:
                        data = await stream.receive_some(self.limits.read_chunk_bytes)
                        if not data:
                            break
                        discarded += len(data)
        except (*GONE, trio.BusyResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    # -- the close decision (ClosePolicy, asked by Response) ---------------------

    def close_after_response(self, status: int, *, answering_continue: bool = False) -> bool:
        """Decide, as a response starts, whether it must announce ``Connection: close``.

        Yes when shutting down, when a limit or error already doomed the connection,
        when the client waits for ``100 Continue`` it will not get (RFC 9110 section
        10.1.1: say whether the body will be read), and for an error response when the
        unread body is too large (or unknown) to drain.
        """
        wire = self.wire
        if wire.must_close or self.shared.closing.is_set():
            return True
        if wire.h11.they_are_waiting_for_100_continue and not answering_continue:
            wire.must_close = True
            return True
        if status >= 400 and not self._body_drainable():
            wire.must_close = True
            return True
        return False

    def _body_drainable(self) -> bool:
        request = self.request
        return request is None or request.unread_body_fits(self.limits.max_drain_bytes)


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

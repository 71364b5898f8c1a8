"""Accept connections, bound their number, and shut down gracefully.

:class:`HTTPServer` owns the listeners and a registry of live connections; each
connection runs in its own task (see ``broker.http.connection``) under its own cancel
scope, inside a nursery owned by ``serve_listeners`` -- or by the caller, for
``serve_stream``.

Shutdown, in the order the broker drives it:

1. ``stop_accepting()`` closes the listeners; ``closing`` becomes true and
   ``Request.server_closing`` is set, so long-lived handlers (channels) can send their
   in-band ``closing`` event. ``active_exchanges()`` lists who is mid-request.
2. ``close_idle()`` closes keep-alive connections waiting for a request; every other
   connection closes after its current response (which says ``Connection: close`` if
   it has not started yet).
3. ``shutdown(grace_s)`` does 1 and 2, waits for the connections to finish, and
   cancels whatever is left when the grace period ends.
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
from collections.abc import Sequence
from functools import partial
from typing import Final

import orjson
import trio

from broker.http.connection import (
    ErrorTranslator,
    Handler,
    Request,
    Response,
    _Connection,
    _Shared,
    no_translation,
)
from broker.http.errors import ServiceUnavailable
from broker.http.limits import Limits

__all__ = ["HTTPServer", "ServerStatistics", "serve_http"]

log = logging.getLogger("ackbus.http")

_GONE: Final = (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError)


def _rejection() -> bytes:
    body = orjson.dumps(ServiceUnavailable("too many connections; try again later").to_json())
    return (
        b"HTTP/1.1 503 Service Unavailable\r\n"
        b"content-type: application/json\r\n"
        b"content-length: %d\r\n"
        b"connection: close\r\n"
        b"retry-after: 1\r\n"
        b"\r\n" % len(body)
    ) + body


#: Pre-built, so turning a connection away costs one write and no parsing.
_REJECTION: Final = _rejection()
#: How long a turned-away connection may linger (see ``_Connection._close``).
_REJECT_LINGER_S: Final = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class ServerStatistics:
    """A snapshot of the server's counters (trio's ``statistics()`` convention)."""

    #: Connections being served now.
    open_connections: int
    #: Connections accepted since start, including those turned away.
    total_accepted: int
    #: Connections answered ``503`` because ``max_connections`` was reached.
    rejected_connections: int
    #: Requests that reached a response (including error responses).
    requests_served: int
    #: Requests whose handler is running now.
    active_requests: int
    #: Streamed responses under way now (channels, streaming consumes).
    streaming_responses: int
    #: TLS handshakes that failed or timed out.
    tls_handshake_failures: int = 0


class HTTPServer:
    """An HTTP/1.1 server running ``app`` (a ``Router`` or any ``Handler``).

    One instance serves any number of listeners and streams; ``limits`` apply to each
    connection, ``max_connections`` to all of them together.
    """

    def __init__(
        self,
        app: Handler,
        *,
        limits: Limits | None = None,
        error_translator: ErrorTranslator = no_translation,
    ) -> None:
        """``error_translator`` maps the exceptions of the app's own error types to the
        responses they mean; without one, only ``HTTPError`` is answered as such."""
        self._shared = _Shared(app, limits or Limits(), error_translator)
        self._accept_scope: trio.CancelScope | None = None
        self._stopped = False
        self._listeners: list[trio.abc.Listener[trio.abc.Stream]] = []
        self._total_accepted = 0
        self._rejected = 0
        self._drained: trio.Event | None = None
        #: A socket with a descriptor at or above this leaves fewer than
        #: ``limits.reserved_fds`` free (descriptors are allocated lowest first).
        self._fd_ceiling = _soft_nofile_limit() - self._shared.limits.reserved_fds
        #: Open connections by client address (``max_connections_per_address``).
        self._per_address: dict[str, int] = {}
        self._ssl_context: ssl.SSLContext | None = None
        self._tls_failures = 0

    def set_ssl_context(self, context: ssl.SSLContext | None) -> None:
        """Serve TLS with ``context`` from the next accepted connection on (None:
        plain HTTP). Open connections keep the context they were accepted with."""
        self._ssl_context = context

    @property
    def tls(self) -> bool:
        return self._ssl_context is not None

    @property
    def limits(self) -> Limits:
        return self._shared.limits

    @property
    def closing(self) -> bool:
        """Whether a graceful shutdown has begun."""
        return self._shared.closing.is_set()

    @property
    def listeners(self) -> list[trio.abc.Listener[trio.abc.Stream]]:
        """The listeners being served (empty before serving starts)."""
        return list(self._listeners)

    @property
    def ports(self) -> list[int]:
        """The bound TCP ports (useful after listening on port 0)."""
        ports: list[int] = []
        for listener in self._listeners:
            if isinstance(listener, trio.SocketListener):
                ports.append(int(listener.socket.getsockname()[1]))
        return ports

    # -- serving -------------------------------------------------------------------

    async def serve_tcp(
        self,
        port: int,
        *,
        host: str | None = "127.0.0.1",
        backlog: int | None = None,
        task_status: trio.TaskStatus[list[trio.abc.Listener[trio.abc.Stream]]] = (
            trio.TASK_STATUS_IGNORED
        ),
    ) -> None:
        """Listen on ``host:port`` and serve until cancelled or shut down.

        ``task_status.started()`` receives the listeners (see also ``ports``), so
        ``await nursery.start(server.serve_tcp, 0)`` works with an ephemeral port.

        Raises: ``OSError`` if the address cannot be bound.
        """
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=backlog)
        await self.serve_listeners(list(listeners), task_status=task_status)

    async def serve_listeners(
        self,
        listeners: Sequence[trio.abc.Listener[trio.abc.Stream]],
        *,
        task_status: trio.TaskStatus[list[trio.abc.Listener[trio.abc.Stream]]] = (
            trio.TASK_STATUS_IGNORED
        ),
    ) -> None:
        """Accept on ``listeners`` and serve each connection in its own task.

        Returns once ``stop_accepting()`` has closed the listeners and every connection
        has ended (``shutdown()`` makes sure they do). Cancelling it cancels them all.
        """
        if self._accept_scope is not None:
            raise RuntimeError("this HTTPServer is already serving listeners")
        self._listeners = list(listeners)
        self._accept_scope = trio.CancelScope()
        if self._stopped:
            self._accept_scope.cancel()
        async with trio.open_nursery() as connections:
            watchdog = trio.CancelScope()
            if self.limits.send_timeout_s is not None:
                self._shared.send_watchdog = True
                connections.start_soon(self._watch_sends, watchdog)
            with self._accept_scope:
                # trio.serve_listeners closes each listener when its accept loop ends,
                # and rides out EMFILE-style accept errors by pausing.
                await trio.serve_listeners(
                    self.serve_stream,
                    self._listeners,
                    handler_nursery=connections,
                    task_status=task_status,
                )
            for listener in self._listeners:
                await listener.aclose()  # already closed unless never started; idempotent
            await self._wait_drained()
            watchdog.cancel()
            self._shared.send_watchdog = False

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one already-open stream (a socket, or a ``trio.testing`` memory
        stream) until the connection ends; then close it. Never raises except
        ``Cancelled``."""
        shared = self._shared
        self._total_accepted += 1
        address = _address_of(stream)
        per_address = self._per_address
        if (
            len(shared.connections) >= shared.limits.max_connections
            or self._stopped
            or _fd_of(stream) >= self._fd_ceiling
            or (address and per_address.get(address, 0) >= shared.limits.max_connections_per_address)
        ):
            self._rejected += 1
            if self._ssl_context is not None:
                # A TLS client cannot read a plain-text 503, and a handshake would
                # spend the CPU a flood is after: close at once.
                await trio.aclose_forcefully(stream)
            else:
                await _turn_away(stream)
            return
        per_address[address] = per_address.get(address, 0) + 1
        try:
            context = self._ssl_context
            if context is not None:
                tls_stream = await self._handshake(stream, context)
                if tls_stream is None:
                    return
                stream = tls_stream
            conn = _Connection(shared, stream)
            shared.connections.add(conn)
            try:
                with conn.scope:
                    await conn.run()
            finally:
                shared.connections.discard(conn)
                if not shared.connections and self._drained is not None:
                    self._drained.set()
        finally:
            left = per_address[address] - 1
            if left:
                per_address[address] = left
            else:
                del per_address[address]

    async def _handshake(self, stream: trio.abc.Stream, context: ssl.SSLContext) -> trio.SSLStream[trio.abc.Stream] | None:
        """The TLS handshake of a new connection, within ``header_timeout_s`` (a client
        that never finishes it is a slowloris too). None (and the stream closed) if it
        failed: a plain-HTTP client, an untrusted client certificate, a timeout."""
        # https_compatible: a client may close without TLS close_notify, as HTTP allows.
        tls_stream = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
        try:
            with trio.fail_after(self.limits.header_timeout_s):
                await tls_stream.do_handshake()
        except (trio.TooSlowError, *_GONE) as exc:
            self._tls_failures += 1
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            log.info("TLS handshake failed from %s: %s", address_or_unknown(stream), cause)
            await trio.aclose_forcefully(stream)
            return None
        return tls_stream

    async def _watch_sends(self, scope: trio.CancelScope) -> None:
        """Enforce ``send_timeout_s`` for every connection: a few times per timeout
        period, abort writes that have been blocked for longer than it."""
        timeout_s = self.limits.send_timeout_s
        assert timeout_s is not None
        with scope:
            while True:
                await trio.sleep(timeout_s / 4)
                now = trio.current_time()
                for conn in list(self._shared.connections):
                    await conn.abort_stalled_send(now)

    # -- shutdown ------------------------------------------------------------------

    def stop_accepting(self) -> None:
        """Close the listeners and enter the closing state (idempotent).

        Connections already open keep being served; responses started from now on
        carry ``Connection: close`` and ``Request.server_closing`` is set.
        """
        self._stopped = True
        self._shared.closing.set()
        if self._accept_scope is not None:
            self._accept_scope.cancel()

    def close_idle(self) -> int:
        """Close every keep-alive connection that is waiting for a request; return how
        many. Connections mid-request close after their response."""
        return sum(conn.close_idle() for conn in list(self._shared.connections))

    def active_exchanges(self) -> list[tuple[Request, Response]]:
        """The requests whose handlers are running now, with their responses;
        ``response.streaming`` tells the long-lived ones."""
        found: list[tuple[Request, Response]] = []
        for conn in self._shared.connections:
            if conn.request is not None and conn.response is not None:
                found.append((conn.request, conn.response))
        return found

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop accepting, close idle connections, wait up to ``grace_s`` for the rest
        to finish, then cancel whatever remains and wait for it to unwind."""
        self.stop_accepting()
        self.close_idle()
        with trio.move_on_after(grace_s):
            await self._wait_drained()
        for conn in list(self._shared.connections):
            conn.scope.cancel()
        await self._wait_drained()

    async def _wait_drained(self) -> None:
        while self._shared.connections:
            if self._drained is None or self._drained.is_set():
                self._drained = trio.Event()
            await self._drained.wait()

    # -- introspection -------------------------------------------------------------

    def statistics(self) -> ServerStatistics:
        """Counters for monitoring and tests."""
        connections = self._shared.connections
        active = streaming = 0
        for conn in connections:
            if conn.response is not None:
                active += 1
                streaming += conn.response.streaming
        return ServerStatistics(
            open_connections=len(connections),
            total_accepted=self._total_accepted,
            rejected_connections=self._rejected,
            requests_served=self._shared.requests_served,
            active_requests=active,
            streaming_responses=streaming,
            tls_handshake_failures=self._tls_failures,
        )


def _soft_nofile_limit() -> int:
    """The process's soft limit on open descriptors (no limit where unknown)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return 1 << 62
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 62


def _address_of(stream: trio.abc.Stream) -> str:
    """The client's IP address ("" for a stream that is not a socket)."""
    if isinstance(stream, trio.SocketStream):
        try:
            peer = stream.socket.getpeername()
        except OSError:
            return ""
        if isinstance(peer, tuple):
            return str(peer[0])
    return ""


def address_or_unknown(stream: trio.abc.Stream) -> str:
    return _address_of(stream) or "unknown"


def _fd_of(stream: trio.abc.Stream) -> int:
    """The descriptor of a socket stream (-1 for other streams)."""
    if isinstance(stream, trio.SocketStream):
        return stream.socket.fileno()
    return -1


async def _turn_away(stream: trio.abc.Stream) -> None:
    """Answer ``503`` to a connection over ``max_connections`` and close it, lingering
    briefly so the client reads the answer rather than a reset."""
    try:
        with trio.move_on_after(_REJECT_LINGER_S):
            await stream.send_all(_REJECTION)
            if isinstance(stream, trio.abc.HalfCloseableStream):
                await stream.send_eof()
            discarded = 0
            while discarded < 64 * 1024:
                data = await stream.receive_some(16 * 1024)
                if not data:
                    break
                discarded += len(data)
    except _GONE:
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def serve_http(
    app: Handler,
    *,
    host: str | None = "127.0.0.1",
    port: int = 8080,
    limits: Limits | None = None,
    task_status: trio.TaskStatus[HTTPServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` over TCP until cancelled or shut down.

    ``task_status.started()`` receives the :class:`HTTPServer` -- the handle for
    ``ports``, ``statistics()`` and ``shutdown()``::

        server = await nursery.start(partial(serve_http, router, port=0))
        port = server.ports[0]
    """
    server = HTTPServer(app, limits=limits)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(server.serve_tcp, port, host=host))
        task_status.started(server)

"""The AMQP listener's IO: sockets, tasks and time, around the sans-IO connection.

:class:`AMQPServer` listens (plain or TLS) and runs one task per accepted connection
in its own nursery. A connection's task reads bytes into the state machine and hands
its events to the session; what they queue is written in the step that queued it
while the writer task is idle (plain TCP: the deliveries of a pump at its end, the
reader's replies after each read; ``_Output``), else, and for what the socket did not
take, by a writer task, woken only then (either gives back the delivery credit the
socket took); a timer task does heartbeats and watches the broker's publish refusal
(``connection.blocked``). However a connection ends, its
session closes its core channels once, and a failure in one connection is logged and
touches no other.
"""

from __future__ import annotations

import logging
import math
import os
import ssl
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from broker import __version__
from broker.amqp.bridge import RuntimeBridge
from broker.amqp.connection import AMQPConnection, State, TuneLimits
from broker.amqp.methods import handle
from broker.amqp.replies import CONNECTION_FORCED
from broker.amqp.session import AMQPSession
from broker.runtime import BrokerRuntime

__all__ = ["AMQPServer", "server_properties"]

log = logging.getLogger("ackbus.amqp")

READ_BYTES = 1 << 16
#: How long a connection we closed waits for the client's close-ok.
CLOSE_WAIT_S = 2.0
#: How long a closing connection (broker shutdown) waits for its confirms to go out.
DRAIN_S = 5.0
#: How often the timer task looks at the broker's publish refusal.
BLOCKED_POLL_S = 0.5


def server_properties() -> dict[str, Any]:
    """``connection.start``'s server-properties: the capabilities table is what
    pika, aio-pika, py-amqp and kombu look at before using confirms and the rest."""
    return {
        "product": "ackbus",
        "version": __version__,
        "platform": "Python/trio",
        "copyright": "ackbus authors",
        "information": "https://github.com/ackbus (AMQP 0-9-1 listener; docs/amqp.md)",
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "consumer_priorities": False,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "direct_reply_to": False,
        },
        "cluster_name": "ackbus",
    }


def _is_loopback(remote: Any) -> bool:
    host = remote[0] if isinstance(remote, tuple) and remote else ""
    return isinstance(host, str) and (host.startswith("127.") or host == "::1" or host.startswith("::ffff:127."))


class AMQPServer:
    """One AMQP listener (plain or TLS) of a broker."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        *,
        login: Callable[[str, str, str | None], Awaitable[Any]],
        limits: TuneLimits | None = None,
        ssl_context: Callable[[], ssl.SSLContext | None] = lambda: None,
        max_connections: int = 10000,
        max_connections_per_address: int = 1000,
    ) -> None:
        self.bridge = RuntimeBridge(runtime)
        self.login = login
        self.limits = limits or TuneLimits(max_body_bytes=self.bridge.max_body_bytes)
        self.ssl_context = ssl_context
        self.ports: list[int] = []
        self.connections = 0
        self._properties = server_properties()
        self._accepting = trio.CancelScope()
        self.max_connections = max_connections
        self.max_per_address = max_connections_per_address
        self._per_address: dict[str, int] = {}
        #: Connections closed at once for being over a cap.
        self.refused = 0

    async def serve(self, host: str, port: int, *, task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``host:port`` until cancelled. Raises OSError naming the address."""
        try:
            listeners = await trio.open_tcp_listeners(port, host=host or None)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen for AMQP on {host}:{port}: {exc.strerror or exc}") from exc
        self.ports = [ls.socket.getsockname()[1] for ls in listeners]
        async with trio.open_nursery() as nursery:
            with self._accepting:
                task_status.started(self.ports)
                await trio.serve_listeners(partial(self._accepted, nursery), listeners, handler_nursery=nursery)
            for listener in listeners:
                await listener.aclose()

    def stop_accepting(self) -> None:
        """Close the listening sockets; open connections go on (graceful shutdown)."""
        self._accepting.cancel()

    async def _accepted(self, nursery: trio.Nursery, stream: trio.SocketStream) -> None:
        remote = None
        try:
            remote = stream.socket.getpeername()
        except OSError:
            pass
        address = remote[0] if isinstance(remote, tuple) and remote else ""
        if self.connections >= self.max_connections or self._per_address.get(address, 0) >= self.max_per_address:
            # over the HTTP server's caps (max_connections, max_connections_per_address):
            # closed before the protocol header is read, as RabbitMQ past connection_max
            self.refused += 1
            log.warning("amqp connection refused: too many connections", extra={"fields": {"remote": address}})
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            return
        self._per_address[address] = self._per_address.get(address, 0) + 1
        try:
            await self._serve_accepted(stream, remote)
        finally:
            left = self._per_address.pop(address, 1) - 1
            if left:
                self._per_address[address] = left

    async def _serve_accepted(self, stream: trio.SocketStream, remote: Any) -> None:
        context = self.ssl_context()
        wrapped: trio.abc.Stream = stream
        if context is not None:
            wrapped = trio.SSLStream(stream, context, server_side=True, https_compatible=False)
        await self.serve_stream(wrapped, remote)

    async def serve_stream(self, stream: trio.abc.Stream, remote: Any = None) -> None:
        """Serve one AMQP connection on ``stream`` until it ends (for tests: any trio
        stream, a memory stream pair included)."""
        remote_text = f"{remote[0]}:{remote[1]}" if isinstance(remote, tuple) and len(remote) >= 2 else None
        conn = AMQPConnection(self.limits, self._properties, now=trio.current_time())
        state = {"wakeup": trio.Event(), "room": trio.Event()}
        output = _Output(stream)

        def wake() -> None:
            state["wakeup"].set()
            state["room"].set()

        def write_nowait() -> bool:
            if not output.write_nowait(conn):
                return False
            state["room"].set()
            return True

        views = self.bridge.views
        session = AMQPSession(
            conn, self.bridge, remote=remote_text, loopback=_is_loopback(remote) or remote is None,
            login=self.login, has_users=lambda: bool(views.user_infos()), wake=wake,
        )
        session.credit.write_nowait = write_nowait
        self.connections += 1
        stop_flow_events = self.bridge.subscribe_flow(session.flow_changed)
        try:
            async with trio.open_nursery() as nursery:
                session.tasks = nursery
                nursery.start_soon(self._writer, stream, output, conn, session, state, nursery.cancel_scope)
                nursery.start_soon(self._timers, conn, session, wake, nursery.cancel_scope)
                reading = trio.CancelScope()
                session.stop_reading = reading.cancel
                with reading:
                    await self._reader(stream, conn, session, wake, write_nowait, state)
                if session.closing_reason is not None and conn.state is State.OPEN:
                    await self._close_for_shutdown(conn, session, wake)
                # the connection is over (or closing): flush, wait for close-ok
                with trio.move_on_after(CLOSE_WAIT_S):
                    while conn.state is State.CLOSING:
                        data = await _receive(stream)
                        if not data:
                            break
                        conn.receive_data(data, trio.current_time())
                        await _drain_events(conn, session)
                # over (no close-ok came, or the client left): the writer sends what is
                # queued, then cancels this nursery; a client that does not read
                # cannot hold it past CLOSE_WAIT_S
                conn.abandon()
                wake()
                with trio.move_on_after(CLOSE_WAIT_S):
                    await trio.sleep_forever()
                nursery.cancel_scope.cancel()
        except Exception:
            log.exception("amqp connection failed", extra={"fields": {"remote": remote_text}})
        finally:
            stop_flow_events()
            self.connections -= 1
            session.release_all("connection closed")
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                    pass

    async def _reader(
        self, stream: trio.abc.Stream, conn: AMQPConnection, session: AMQPSession, wake: Callable[[], None],
        write_nowait: Callable[[], bool], state: dict[str, trio.Event],
    ) -> None:
        bridge = self.bridge
        while not conn.closed and conn.state is not State.CLOSING:
            if session.closing_reason is not None:
                return
            data = await _receive(stream)
            if not data:
                session.release_all("client disconnected")
                conn.receive_data(b"", trio.current_time())
                return
            conn.receive_data(data, trio.current_time())
            await _drain_events(conn, session)
            session.run_failures()
            bridge.flush()  # deliveries the acks made room for go out in its step
            session.update_blocked()
            # replies, or output the pump could not send: written here if the writer
            # is idle, else by the writer (woken only then, or to end the connection)
            if conn.closed or (conn.pending_output() and not write_nowait()):
                wake()
            elif session.credit.pending:
                session.credit.grant()
            # Back-pressure: stop reading while confirms or output are over their bounds
            # (each confirm and each write wakes this up).
            while session.must_pause() and not conn.closed and session.closing_reason is None:
                state["room"] = trio.Event()
                await state["room"].wait()
                session.update_blocked()

    async def _close_for_shutdown(self, conn: AMQPConnection, session: AMQPSession, wake: Callable[[], None]) -> None:
        """Broker shutdown: let the confirms of what was published go out, then close
        with 320 (RabbitMQ's CONNECTION_FORCED)."""
        with trio.move_on_after(DRAIN_S):
            while session.unconfirmed_bytes > 0:
                confirmed = session.confirmed = trio.Event()
                self.bridge.flush()
                wake()
                await confirmed.wait()
        conn.close(CONNECTION_FORCED, f"broker forced connection closure with reason '{session.closing_reason}'")
        session.release_all("broker shut down")
        wake()

    async def _writer(
        self, stream: trio.abc.Stream, output: _Output, conn: AMQPConnection, session: AMQPSession,
        state: dict[str, trio.Event], scope: trio.CancelScope,
    ) -> None:
        while True:
            session.run_failures()  # channels to close (an operator's close, an ack timeout)
            data = output.take_unsent() + conn.data_to_send(trio.current_time())
            if not data:
                if conn.closed:
                    scope.cancel()
                    return
                state["wakeup"] = trio.Event()
                await state["wakeup"].wait()
                continue
            output.busy = True
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                session.release_all("client disconnected")
                scope.cancel()
                return
            finally:
                output.busy = False
            state["room"].set()
            session.credit.grant()
            session.run_failures()

    async def _timers(self, conn: AMQPConnection, session: AMQPSession, wake: Callable[[], None], scope: trio.CancelScope) -> None:
        while not conn.closed:
            due = conn.next_timer()
            wait_until = min(due if due is not None else math.inf, trio.current_time() + BLOCKED_POLL_S)
            await trio.sleep_until(wait_until)
            conn.check_timers(trio.current_time())
            if session.closing_reason is None and conn.state is State.OPEN:
                session.update_blocked()
            wake()
        if conn.ended is not None:
            log.info("amqp connection ended", extra={"fields": {"remote": session.remote, "reason": conn.ended.text}})
        session.release_all("connection ended")
        scope.cancel()


class _Output:
    """A connection's socket as written outside its writer task: from the runtime's
    pump (``AMQPSession.flush_nowait``) and the reader, one write of everything queued
    in their own step instead of a wake-up of the writer and its ``send_all`` (as the
    HTTP channel's ``write_nowait``). Plain TCP only: TLS goes through the writer."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._fileno = stream.socket.fileno if isinstance(stream, trio.SocketStream) else None
        #: The writer task is in ``send_all``: nothing may be written around it.
        self.busy = False
        #: What the socket did not take of a write here: the writer sends it first.
        self.unsent = b""

    def write_nowait(self, conn: AMQPConnection) -> bool:
        """Write the connection's queued output if the writer is idle; True if the
        socket took all of it (or there was none). A failed write keeps it all for
        the writer, whose ``send_all`` reports the failure."""
        if self._fileno is None or self.busy or self.unsent:
            return False
        data = conn.data_to_send(trio.current_time())
        if not data:
            return True
        try:
            # a closed socket's fileno() is -1: EBADF, never another file
            written = os.write(self._fileno(), data)
        except OSError:  # BlockingIOError included
            written = 0
        if written < len(data):
            self.unsent = data[written:]
            return False
        return True

    def take_unsent(self) -> bytes:
        unsent, self.unsent = self.unsent, b""
        return unsent


async def _receive(stream: trio.abc.Stream) -> bytes:
    try:
        return bytes(await stream.receive_some(READ_BYTES))
    except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
        return b""


async def _drain_events(conn: AMQPConnection, session: AMQPSession) -> None:
    """Hand every event the received bytes completed to the session, in order; the
    per-message ones without a coroutine each."""
    next_event = conn.next_event
    handle_nowait = session.handle_nowait
    event = next_event()
    while event is not None:
        if not handle_nowait(event):
            await handle(session, event)
        event = next_event()

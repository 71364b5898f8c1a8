"""Timeouts and in-handler behaviour, over trio memory streams with a virtual clock.

``autojump_clock`` makes a 60-second idle timeout take no real time: whenever every
task is blocked, the clock jumps to the next deadline. The times asserted are the
virtual times at which the server acted.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.http.connection import Request, Response
from broker.http.errors import ClientDisconnected
from broker.http.limits import Limits
from broker.http.router import Router
from broker.http.server import HTTPServer

GET = b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n"


def make_app(log: list[Any], *, firehose: bool = True) -> Router:
    """The test app; ``firehose=False`` leaves out the endless writer, which would
    never block (and so never let virtual time pass) on an unbounded memory stream."""
    router = Router()

    @router.route("GET", "/ok")
    async def ok(request: Request, response: Response) -> None:
        await response.send_json(200, {"ok": True})

    @router.route("POST", "/body")
    async def body(request: Request, response: Response) -> None:
        data = await request.read_body()
        log.append(await request.read_body())  # after the end: end-of-body again
        await response.send_json(200, {"size": len(data)})

    async def endless(request: Request, response: Response) -> None:
        await response.start(200)
        try:
            while True:
                await response.send(b"x" * 65536)
        except ClientDisconnected as exc:
            log.append((trio.current_time(), str(exc)))
            raise

    if firehose:
        router.add("GET", "/firehose", endless)

    @router.route("POST", "/two-readers")
    async def two_readers(request: Request, response: Response) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(request.read_body)
            await trio.testing.wait_all_tasks_blocked()
            try:
                await request.read_body()
            except trio.BusyResourceError as exc:
                log.append(exc)
            nursery.cancel_scope.cancel()
        await response.send_json(200, {})

    @router.route("GET", "/misuse")
    async def misuse(request: Request, response: Response) -> None:
        await response.send(b"not started")

    return router


@asynccontextmanager
async def served(
    limits: Limits | None = None, *, lockstep: bool = False
) -> AsyncIterator[tuple[trio.abc.Stream, HTTPServer, list[Any]]]:
    log: list[Any] = []
    server = HTTPServer(make_app(log), limits=limits)
    client: trio.abc.Stream
    server_side: trio.abc.Stream
    if lockstep:
        client, server_side = trio.testing.lockstep_stream_pair()
    else:
        client, server_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_stream, server_side)
        yield client, server, log
        nursery.cancel_scope.cancel()


async def read_until_eof(stream: trio.abc.Stream) -> bytes:
    out = bytearray()
    while data := await stream.receive_some():
        out += data
    return bytes(out)


async def test_silent_client_closed_after_header_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as (client, server, _):
        start = trio.current_time()
        assert await read_until_eof(client) == b""  # closed without a word
        assert trio.current_time() - start == pytest.approx(10.0)
        await trio.testing.wait_all_tasks_blocked()
        assert server.statistics().open_connections == 0


async def test_slowloris_gets_408_after_header_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as (client, _, _):
        start = trio.current_time()

        async def drip() -> None:
            await client.send_all(b"GET /ok HTTP/1.1\r\n")
            for byte in b"X-Slow: 1111111111111111111":
                await trio.sleep(3)  # each byte well inside any per-read timeout
                await client.send_all(bytes([byte]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drip)
            reply = await read_until_eof(client)
            nursery.cancel_scope.cancel()
        assert reply.startswith(b"HTTP/1.1 408 ")
        assert b'"error":"request_timeout"' in reply
        assert b"connection: close" in reply
        assert trio.current_time() - start == pytest.approx(10.0)


async def test_idle_keep_alive_connection_closed_after_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as (client, _, _):
        await client.send_all(GET)
        first = await client.receive_some()
        assert first.startswith(b"HTTP/1.1 200 ")
        idle_from = trio.current_time()
        with trio.move_on_after(59.9):
            assert await client.receive_some() == b"never"  # still open
        assert await client.receive_some() == b""
        assert trio.current_time() - idle_from == pytest.approx(60.0)


async def test_a_second_request_restarts_the_idle_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as (client, _, _):
        for pause in (0, 50, 50, 50):
            await trio.sleep(pause)
            await client.send_all(GET)
            assert (await client.receive_some()).startswith(b"HTTP/1.1 200 ")


async def test_slow_body_gets_408_and_close(autojump_clock: trio.testing.MockClock) -> None:
    async with served() as (client, _, _):
        await client.send_all(
            b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n" + b"a" * 10
        )
        start = trio.current_time()
        reply = await read_until_eof(client)
        assert reply.startswith(b"HTTP/1.1 408 ")
        assert b'"error":"request_timeout"' in reply
        assert b"connection: close" in reply
        assert trio.current_time() - start == pytest.approx(30.0)


async def test_body_that_keeps_making_progress_is_not_timed_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as (client, _, log):
        await client.send_all(b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n")
        for byte in b"abcde":
            await trio.sleep(20)  # 100 s in all, but never 30 s without progress
            await client.send_all(bytes([byte]))
        reply = await client.receive_some()
        assert reply.startswith(b"HTTP/1.1 200 ")
        assert reply.endswith(b'{"size":5}')
        assert log == [b""]  # reading past the end returns end-of-body


async def test_client_that_stops_reading_is_disconnected_after_send_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served(Limits(send_timeout_s=5), lockstep=True) as (client, _, log):
        await client.send_all(b"GET /firehose HTTP/1.1\r\nHost: t\r\n\r\n")
        await client.receive_some()  # the head, then the client never reads again
        start = trio.current_time()
        while not log:
            await trio.sleep(1)
        when, message = log[0]
        assert when - start == pytest.approx(5.0)
        assert "stopped reading" in message


class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """Hands the server streams pushed by the test: TCP-free ``serve_listeners``."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[trio.abc.Stream](0)

    async def connect(self, *, lockstep: bool = False) -> trio.abc.Stream:
        pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
        client, server_side = pair()
        await self.send.send(server_side)
        return client

    async def accept(self) -> trio.abc.Stream:
        return await self.receive.receive()

    async def aclose(self) -> None:
        self.receive.close()
        await trio.lowlevel.checkpoint()


async def test_send_watchdog_of_a_listening_server(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With listeners, a watchdog task (not a cancel scope per write) enforces the
    send timeout; the handler still sees ClientDisconnected."""
    log: list[Any] = []
    server = HTTPServer(make_app(log), limits=Limits(send_timeout_s=8))
    listener = MemoryListener()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve_listeners, [listener])
        client = await listener.connect(lockstep=True)
        await client.send_all(b"GET /firehose HTTP/1.1\r\nHost: t\r\n\r\n")
        await client.receive_some()
        start = trio.current_time()
        while not log:
            await trio.sleep(1)
        when, message = log[0]
        assert 8.0 <= when - start <= 8.0 + 8.0 / 4 + 1  # checked every timeout/4
        assert "stopped reading" in message
        await server.shutdown(grace_s=1)


async def test_shutdown_of_a_listening_server_closes_idle_connections(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = HTTPServer(make_app([]))
    listener = MemoryListener()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve_listeners, [listener])
        client = await listener.connect()
        await client.send_all(GET)
        assert (await client.receive_some()).startswith(b"HTTP/1.1 200 ")
        await trio.testing.wait_all_tasks_blocked()
        assert server.close_idle() == 1
        assert await client.receive_some() == b""
        await server.shutdown(grace_s=30)
        assert trio.current_time() < 1  # nothing waited for a timeout


async def test_concurrent_body_readers_are_refused() -> None:
    async with served() as (client, _, log):
        await client.send_all(
            b"POST /two-readers HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n"
        )
        assert (await client.receive_some()).startswith(b"HTTP/1.1 200 ")
        assert isinstance(log[0], trio.BusyResourceError)


async def test_response_misuse_is_a_500() -> None:
    async with served() as (client, _, _):
        await client.send_all(b"GET /misuse HTTP/1.1\r\nHost: t\r\n\r\n")
        reply = await read_until_eof(client)
        assert reply.startswith(b"HTTP/1.1 500 ")


# -- robustness: arbitrary bytes never crash or hang the server ---------------------

_PIECES = [
    b"GET /ok HTTP/1.1\r\n",
    b"POST /body HTTP/1.1\r\n",
    b"GET /ok HTTP/1.0\r\n",
    b"Host: t\r\n",
    b"Content-Length: 5\r\n",
    b"Content-Length: 99999999999\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip\r\n",
    b"Expect: 100-continue\r\n",
    b"Connection: close\r\n",
    b"\r\n",
    b"5\r\nhello\r\n",
    b"0\r\n\r\n",
    b"ffffffffffffffffff\r\n",
    b"abcde",
    b"\x00\xff",
]


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@settings(
    max_examples=150,
    deadline=None,
    # the clock is stateless enough to share between examples
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(st.one_of(st.sampled_from(_PIECES), st.binary(max_size=40)), max_size=12),
    st.booleans(),
)
async def test_arbitrary_input_never_crashes_or_hangs(
    autojump_clock: trio.testing.MockClock, pieces: list[bytes], close: bool
) -> None:
    errors = _Errors()
    logger = logging.getLogger("ackbus.http")
    logger.addHandler(errors)
    try:
        server = HTTPServer(
            make_app([], firehose=False), limits=Limits(send_timeout_s=5, linger_s=1)
        )
        client, server_side = trio.testing.memory_stream_pair()
        with trio.fail_after(1000):  # virtual seconds: every timeout fires well within
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.serve_stream, server_side)
                try:
                    for piece in pieces:
                        await client.send_all(piece)
                except trio.BrokenResourceError:
                    pass  # the server closed the connection (e.g. after an HTTP/1.0 reply)
                if close:
                    await client.send_stream.aclose()
                with trio.move_on_after(200):
                    while await client.receive_some():
                        pass
                nursery.cancel_scope.cancel()
    finally:
        logger.removeHandler(errors)
    assert not errors.records, [r.getMessage() for r in errors.records]

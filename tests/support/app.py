"""The one in-process broker of the tests: :func:`open_broker_app`.

A memory-only broker (``data_dir=None`` unless the options say otherwise) serving real
HTTP on an ephemeral loopback port (``app.port``), ready when the block starts, torn
down by cancellation when it ends. :func:`open_tcp_broker` is the same with options as
keyword arguments; :func:`open_memory_broker` reaches the same broker through
``trio.testing`` memory streams instead of sockets, so that ``autojump_clock`` can
drive time (ack timeouts, leases) deterministically. The fixtures built on it live in
``tests/conftest.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import trio
import trio.testing

from broker.app import BrokerApp
from broker.http import Limits
from broker.runtime import BrokerRuntime, RuntimeOptions

__all__ = ["MemoryBroker", "open_broker_app", "open_memory_broker", "open_tcp_broker"]


@asynccontextmanager
async def open_broker_app(
    limits: Limits | None = None,
    options: RuntimeOptions | None = None,
    memory_probe: Callable[[], int] | None = None,
) -> AsyncIterator[BrokerApp]:
    """A memory-only broker serving on ``127.0.0.1:<ephemeral>`` until the block ends
    (``memory_probe``: a fake reading of its resident size, for the memory alarm)."""
    runtime = BrokerRuntime(options or RuntimeOptions(data_dir=None), memory_probe=memory_probe)
    app = BrokerApp(runtime, limits or Limits())
    async with trio.open_nursery() as nursery:
        await nursery.start(app.serve, "127.0.0.1", 0)
        await runtime.ready_event.wait()
        yield app
        nursery.cancel_scope.cancel()




@asynccontextmanager
async def open_tcp_broker(
    limits: Limits | None = None, **options: Any
) -> AsyncIterator[BrokerApp]:
    """:func:`open_broker_app` with ``RuntimeOptions(**options)`` (``data_dir=None``
    unless given) and, by default, a short lingering close."""
    options.setdefault("data_dir", None)
    async with open_broker_app(limits or Limits(linger_s=0.2), RuntimeOptions(**options)) as app:
        yield app


class MemoryBroker:
    """A broker reached through ``trio.testing`` memory streams (no sockets)."""

    def __init__(self, app: BrokerApp, nursery: trio.Nursery) -> None:
        self.app = app
        self.runtime = app.runtime
        self._nursery = nursery

    def connect(self) -> trio.abc.Stream:
        """A new client stream, served by the broker's HTTP server."""
        client, server = trio.testing.memory_stream_pair()
        self._nursery.start_soon(self.app.server.serve_stream, server)
        return client

    def connect_client(self) -> TrioByteStream:
        """:meth:`connect` as the client library takes a stream (anyio's; the client
        runs on trio here, as the broker does)."""
        return TrioByteStream(self.connect())


class TrioByteStream(anyio.abc.ByteStream):
    """A trio stream seen as an anyio byte stream (both sides on trio), its errors
    as anyio's (what the client library handles)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            data = await self.stream.receive_some(max_bytes)
        except trio.ClosedResourceError:
            raise anyio.ClosedResourceError from None
        except trio.BrokenResourceError as exc:
            raise anyio.BrokenResourceError from exc
        if not data:
            raise anyio.EndOfStream
        return bytes(data)

    async def send(self, item: bytes) -> None:
        try:
            await self.stream.send_all(item)
        except trio.ClosedResourceError:
            raise anyio.ClosedResourceError from None
        except trio.BrokenResourceError as exc:
            raise anyio.BrokenResourceError from exc

    async def send_eof(self) -> None:
        raise NotImplementedError("a memory stream does not half-close")

    async def aclose(self) -> None:
        await self.stream.aclose()


@asynccontextmanager
async def open_memory_broker(
    limits: Limits | None = None, memory_probe: Callable[[], int] | None = None, **options: Any
) -> AsyncIterator[MemoryBroker]:
    """:func:`open_broker_app` reached through memory streams (see the module docstring);
    no send timeout by default, since virtual time may jump past it."""
    options.setdefault("data_dir", None)
    async with open_broker_app(limits or Limits(send_timeout_s=None), RuntimeOptions(**options), memory_probe) as app:
        async with trio.open_nursery() as nursery:
            try:
                yield MemoryBroker(app, nursery)
            finally:
                nursery.cancel_scope.cancel()

"""Graceful shutdown on SIGINT/SIGTERM.

Usage (the block is the whole life of the program's broker work)::

    async with client.open_graceful_shutdown() as shutdown:
        async with client.connect(url) as conn:
            shutdown.attach(conn)
            async with conn.channel() as ch, ch.consume("jobs") as messages:
                async for msg in messages:
                    await handle(msg)
                    await msg.ack()

On the first signal, in this order:

1. every consumer of every attached connection is cancelled (``cancel`` sent; the
   messages it buffered but had not yielded are requeued); each ``async for`` ends at
   its next iteration, so
2. the handler running now finishes and settles its message, and the blocks unwind:
3. leaving ``conn.channel()`` waits for pending confirms (up to ``close_timeout_s``),
4. closes the channel, and leaving ``connect()`` disconnects;
5. the block of ``open_graceful_shutdown`` then returns normally: exit status 0.

Producers see :attr:`GracefulShutdown.requested` (or ``await wait_requested()``) and
stop starting new work. On a second signal (or when ``grace_s`` has passed since the
first) the whole block is cancelled: handlers are interrupted before they ack, channels
are dropped without waiting, and the broker requeues every unacked delivery. Either way
no message is acked unless its handler completed: the library never acks on its own.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

import anyio

from ._nursery import open_service_nursery
from .connection import Connection

__all__ = ["GracefulShutdown", "open_graceful_shutdown"]

DEFAULT_SIGNALS = (_signal.SIGINT, _signal.SIGTERM)


class GracefulShutdown:
    """The shutdown state of an :func:`open_graceful_shutdown` block."""

    def __init__(self, cancel_scope: anyio.CancelScope, grace_s: float | None) -> None:
        self._cancel_scope = cancel_scope
        self._grace_s = grace_s
        self._connections: list[Connection] = []
        self._callbacks: list[Callable[[], object]] = []
        self._requested = anyio.Event()
        self._aborted = False
        self.signal: int | None = None

    @property
    def requested(self) -> bool:
        """A shutdown was requested (signal or :meth:`request`): stop new work."""
        return self._requested.is_set()

    @property
    def aborted(self) -> bool:
        """The block was cancelled by a second signal or the grace period."""
        return self._aborted

    async def wait_requested(self) -> None:
        """Wait until a shutdown is requested."""
        await self._requested.wait()

    def on_request(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` (synchronously) when a shutdown is requested; at once if
        it already was."""
        if self.requested:
            callback()
        else:
            self._callbacks.append(callback)

    def attach(self, conn: Connection) -> Connection:
        """Stop ``conn``'s consumers on shutdown (now, if already requested)."""
        self._connections.append(conn)
        if self.requested:
            conn.stop_consuming()
        return conn

    def request(self, signum: int | None = None) -> None:
        """Start a graceful shutdown, as the first signal does; a second request
        aborts."""
        if self.requested:
            self.abort()
            return
        self.signal = signum
        self._requested.set()
        for conn in self._connections:
            conn.stop_consuming()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def abort(self) -> None:
        """Cancel the block now (what a second signal does)."""
        self._aborted = True
        self._cancel_scope.cancel()


@asynccontextmanager
async def open_graceful_shutdown(
    *,
    signals: Iterable[int] = DEFAULT_SIGNALS,
    grace_s: float | None = None,
) -> AsyncIterator[GracefulShutdown]:
    """Handle ``signals`` (default SIGINT and SIGTERM) for the duration of the block;
    see the module docstring for what happens on them. ``grace_s`` bounds the graceful
    part: that long after the first signal, the block is aborted as if signalled
    twice. Must run in the main thread (signal handlers).

    The block returns normally after a graceful or an aborted shutdown (check
    :attr:`GracefulShutdown.aborted` to exit with another status).
    """
    handled = tuple(_signal.Signals(s) for s in signals)
    with anyio.CancelScope() as scope:
        shutdown = GracefulShutdown(scope, grace_s)
        with anyio.open_signal_receiver(*handled) as receiver:
            async with open_service_nursery() as nursery:
                nursery.start_soon(_watch_signals, receiver, shutdown)
                if grace_s is not None:
                    nursery.start_soon(_enforce_grace, shutdown, grace_s)
                try:
                    yield shutdown
                finally:
                    nursery.cancel_scope.cancel()


async def _watch_signals(receiver: AsyncIterator[int], shutdown: GracefulShutdown) -> None:
    async for signum in receiver:
        shutdown.request(signum)


async def _enforce_grace(shutdown: GracefulShutdown, grace_s: float) -> None:
    await shutdown.wait_requested()
    await anyio.sleep(grace_s)
    shutdown.abort()

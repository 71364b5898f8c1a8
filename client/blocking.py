"""The blocking client: the async client driven from ordinary threads.

    with client.connect_blocking("http://127.0.0.1:8080") as conn:
        with conn.channel() as ch:
            ch.declare_queue("jobs")
            ch.publish("", "jobs", b"hello")            # returns once confirmed
            with ch.consume("jobs", prefetch=10) as messages:
                for msg in messages:
                    ...
                    msg.ack()

Not a second implementation: :func:`connect_blocking` starts an event loop in a
background thread (an anyio blocking portal, trio by default) and runs the async
client (:func:`client.connect`) there. Each object handed out (connection, channel,
message stream, message, pending publish) is a thin proxy whose methods run the
async method of the same name in that loop and wait for its result, so every
guarantee of the async client holds unchanged: confirms, resend with deduplication
after reconnects, consumer recovery, graceful close. The proxies may be used from any
thread, one call at a time per object; keyword arguments and exceptions are those of
the async methods.

Interrupting a blocked call (``KeyboardInterrupt``) leaves the ``with`` blocks with
that exception, which aborts the channel: its unacked deliveries go back to their
queues and unconfirmed publishes fail, as with the async client's cancellation. For a
graceful stop, call :meth:`BlockingConnection.stop_consuming` (from a signal handler
or another thread): every consumer's iteration then ends, and the blocks close
normally, waiting for pending confirms.

Blocks a program never leaves (a kombu channel nobody closes, a connection kept in a
global) are closed at interpreter exit, gracefully and newest first, while the loop
thread still runs (an :mod:`atexit` hook): the loop thread is a daemon, frozen once
the interpreter finalizes, so a block closed only by the garbage collector then would
wait for it forever. A block whose close comes after that (or twice) does nothing.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    contextmanager,
)
from types import TracebackType
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal

from .connection import DEFAULT_URL, Connection, connect
from .consumer import Message, MessageStream
from .publisher import PendingPublish
from .rest import LeasedMessage

__all__ = [
    "connect_blocking",
    "BlockingConnection",
    "BlockingChannel",
    "BlockingMessageStream",
    "BlockingProxy",
]

log = logging.getLogger("ackbus.client.blocking")


class BlockingProxy:
    """Runs the methods of an async-client object in the portal's loop and waits.

    Coroutine methods are awaited there; plain methods are called there too (the
    client's objects belong to their loop); attributes that are not callable are read
    directly. Results that are client objects (messages, pending publishes, lists of
    them) come back wrapped in proxies themselves.
    """

    def __init__(self, portal: BlockingPortal, target: Any) -> None:
        self._portal = portal
        self._target = target

    @property
    def target(self) -> Any:
        """The async-client object behind this proxy (use it only in the loop)."""
        return self._target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value
        return self._blocking(value)

    def _blocking(self, method: Callable[..., Any]) -> Callable[..., Any]:
        portal = self._portal

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            if inspect.iscoroutinefunction(method):
                result = portal.call(functools.partial(method, *args, **kwargs))
            else:
                result = portal.call(functools.partial(_call_sync, method, args, kwargs))
            return _wrap(portal, result)

        return call

    def __repr__(self) -> str:
        return f"<blocking {self._target!r}>"


async def _call_sync(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return method(*args, **kwargs)


class BlockingPendingPublish(BlockingProxy):
    """A publish in flight (:meth:`BlockingChannel.start_publish`): :meth:`wait` for
    its confirm."""

    def wait(self, timeout_s: float | None = None) -> str:
        """Wait for the confirm; return the message id (raises like ``publish``)."""
        handle: PendingPublish = self._target
        result: str = self._portal.call(_wait_handle, handle, timeout_s)
        return result


async def _wait_handle(handle: PendingPublish, timeout_s: float | None) -> str:
    import anyio

    with anyio.fail_after(timeout_s):
        return await handle.wait()


def _wrap(portal: BlockingPortal, value: Any) -> Any:
    if isinstance(value, (Message, LeasedMessage)):
        return BlockingProxy(portal, value)
    if isinstance(value, PendingPublish):
        return BlockingPendingPublish(portal, value)
    if isinstance(value, list) and value and isinstance(value[0], (Message, LeasedMessage)):
        return [BlockingProxy(portal, v) for v in value]
    return value


class _OpenBlock(AbstractContextManager[Any]):
    """A context manager of the loop (the portal itself, or an async one run through
    it) entered from a thread, closed at most once: by its ``with`` block, or at
    interpreter exit if the program never left the block (see the module's doc)."""

    def __init__(self, inner: AbstractContextManager[Any]) -> None:
        self._inner = inner

    def __enter__(self) -> Any:
        value = self._inner.__enter__()
        _OPEN_BLOCKS.add(self)
        return value

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if not _OPEN_BLOCKS.take(self) or sys.is_finalizing():
            # closed already (at exit), or the loop thread is frozen: nothing to wait for
            return None
        return self._inner.__exit__(exc_type, exc, tb)


class _OpenBlocks:
    """The blocks open right now, oldest first, for the close at interpreter exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[int, _OpenBlock] = {}  # insertion order: oldest first

    def add(self, block: _OpenBlock) -> None:
        with self._lock:
            self._blocks[id(block)] = block

    def take(self, block: _OpenBlock) -> bool:
        """Forget ``block``; whether it was open (so its caller is the one to close it)."""
        with self._lock:
            return self._blocks.pop(id(block), None) is not None

    def close_all(self) -> None:
        """Close every block still open, newest first (a channel before its
        connection, the connection before its loop thread)."""
        while True:
            with self._lock:
                if not self._blocks:
                    return
                block = next(reversed(self._blocks.values()))
            try:
                block.__exit__(None, None, None)
            except Exception as exc:  # at exit: say it, and close the rest
                log.warning("closing an ackbus block left open at exit failed: %r", exc)
                self.take(block)


_OPEN_BLOCKS = _OpenBlocks()
atexit.register(_OPEN_BLOCKS.close_all)


@contextmanager
def _loop_thread(backend: str) -> Iterator[BlockingPortal]:
    """An event loop in a daemon thread and its portal, for the ``with`` block.

    As anyio's ``start_blocking_portal``, except that an interrupt (Ctrl-C) while the
    loop starts does not leave the thread running and the caller joining it forever.
    """
    started: Future[BlockingPortal] = Future()

    async def serve_portal() -> None:
        async with BlockingPortal() as portal:
            started.set_result(portal)
            await portal.sleep_until_stopped()

    def run_loop() -> None:
        try:
            anyio.run(serve_portal, backend=backend)
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)

    thread = threading.Thread(target=run_loop, daemon=True, name=f"ackbus-{backend}-loop")
    thread.start()
    try:
        portal = started.result()
    except BaseException:
        _stop_when_started(started)
        raise
    cancel_remaining = False
    try:
        yield portal
    except BaseException:
        cancel_remaining = True
        raise
    finally:
        try:
            portal.call(portal.stop, cancel_remaining)
        except RuntimeError:
            pass  # the portal stopped already
        thread.join()


def _stop_when_started(started: Future[BlockingPortal]) -> None:
    """Stop a loop whose start was interrupted, once it has started (a thread left
    behind if it does not within seconds, or on a second interrupt)."""
    try:
        portal = started.result(timeout=10)
        portal.start_task_soon(portal.stop, True)
    except BaseException:  # noqa: BLE001 - a daemon thread left running is the fallback
        pass


@contextmanager
def _enter(portal: BlockingPortal, cm: AbstractAsyncContextManager[Any]) -> Iterator[Any]:
    with _OpenBlock(portal.wrap_async_context_manager(cm)) as value:
        yield value


class BlockingMessageStream(BlockingProxy):
    """A consumer's messages: ``for msg in messages`` (ends once the consumer is
    stopped), or :meth:`receive` with a timeout."""

    def __iter__(self) -> Iterator[BlockingProxy]:
        return self

    def __next__(self) -> BlockingProxy:
        stream: MessageStream = self._target
        try:
            message = self._portal.call(stream.__anext__)
        except StopAsyncIteration:
            raise StopIteration from None
        return BlockingProxy(self._portal, message)

    def receive(self, timeout_s: float | None = None) -> BlockingProxy | None:
        """The next message, or ``None`` when ``timeout_s`` passed first.

        Raises:
            anyio.EndOfStream: the consumer was stopped.
            ConsumerCancelled, ConnectionLost, ClientClosed: as for the async stream.
        """
        message = self._portal.call(_receive_within, self._target, timeout_s)
        return None if message is None else BlockingProxy(self._portal, message)


async def _receive_within(stream: MessageStream, timeout_s: float | None) -> Message | None:
    import anyio

    with anyio.move_on_after(timeout_s):
        return await stream.receive()
    return None


class BlockingChannel(BlockingProxy):
    """A :class:`~client.Channel` for threads: the same methods, blocking."""

    @contextmanager
    def consume(self, queue: str, **kwargs: Any) -> Iterator[BlockingMessageStream]:
        """``with ch.consume(queue, prefetch=...) as messages: for msg in messages``;
        leaving the block cancels the consumer (see ``Channel.consume``)."""
        with _enter(self._portal, self._target.consume(queue, **kwargs)) as stream:
            yield BlockingMessageStream(self._portal, stream)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """See ``Channel.transaction``."""
        with _enter(self._portal, self._target.transaction()):
            yield


class BlockingConnection(BlockingProxy):
    """A :class:`~client.Connection` for threads: REST methods block; channels come
    from :meth:`channel`."""

    @contextmanager
    def channel(self, **kwargs: Any) -> Iterator[BlockingChannel]:
        """``with conn.channel() as ch``: see ``Connection.channel``."""
        connection: Connection = self._target
        with _enter(self._portal, connection.channel(**kwargs)) as channel:
            yield BlockingChannel(self._portal, channel)

    @property
    def portal(self) -> BlockingPortal:
        """The portal of the loop thread (``portal.call(async_fn, ...)`` runs any
        coroutine function there)."""
        return self._portal


@contextmanager
def connect_blocking(
    url: str = DEFAULT_URL, *, backend: str = "trio", **overrides: Any
) -> Iterator[BlockingConnection]:
    """Connect for the duration of the ``with`` block, from ordinary (non-async) code.

    Starts the event loop thread (``backend``: ``"trio"`` or ``"asyncio"``), runs
    :func:`client.connect` there with ``url`` and ``overrides`` (the same keyword
    arguments), and stops the thread when the block ends.

    Raises:
        ValueError: a bad URL or setting.
    """
    with _OpenBlock(_loop_thread(backend)) as portal:
        with _enter(portal, connect(url, **overrides)) as conn:
            yield BlockingConnection(portal, conn)

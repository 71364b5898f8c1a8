"""A TCP proxy to etcd that can go silent (:class:`SilentProxy`), in the test's own
trio run or in a thread of its own for the tests that drive subprocesses
(:func:`silent_proxies`): a node whose etcd endpoint is such a proxy is cut off from
etcd the way an nftables rule cuts it off in the fault test, without namespaces."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

__all__ = ["SilentProxy", "silent_proxies"]


class SilentProxy:
    """A TCP proxy to etcd that can go silent, as a member behind a firewall that drops
    every packet: connections stay open (new ones are even accepted), nothing gets
    through either way, nothing is closed. What is held back meanwhile goes through
    once ``silent`` is cleared again (TCP would retransmit it after the cut heals)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        #: set (from any thread) to cut, cleared to heal
        self.silent = False

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._carry, listeners)

    async def _carry(self, downstream: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        except OSError:
            await downstream.aclose()
            return
        async with downstream, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pipe, downstream, upstream, nursery.cancel_scope)
            nursery.start_soon(self._pipe, upstream, downstream, nursery.cancel_scope)

    async def _pipe(self, source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope) -> None:
        """Carry ``source`` to ``sink``; at its end, end the other direction too."""
        try:
            while True:
                await self._while_silent()
                data = await source.receive_some(65536)
                if not data:
                    break
                await self._while_silent()  # (read just before the cut: held, not lost)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        both.cancel()

    async def _while_silent(self) -> None:
        while self.silent:  # a flag the test sets from its own thread: polled
            await trio.sleep(0.02)


@contextmanager
def silent_proxies(target_port: int, count: int) -> Iterator[list[SilentProxy]]:
    """``count`` proxies to ``target_port``, served by a trio run in a thread of its
    own (stopped and joined on the way out); set a proxy's ``silent`` to cut it."""
    proxies = [SilentProxy(target_port) for _ in range(count)]
    ready = threading.Event()
    run: dict[str, Any] = {}

    async def serve() -> None:
        run["token"] = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            run["scope"] = scope
            async with trio.open_nursery() as nursery:
                for proxy in proxies:
                    await nursery.start(proxy.serve)
                ready.set()
                await trio.sleep_forever()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    try:
        if not ready.wait(10):
            raise RuntimeError("the etcd proxies did not start")
        yield proxies
    finally:
        if "scope" in run:
            trio.from_thread.run_sync(run["scope"].cancel, trio_token=run["token"])
        thread.join(10)

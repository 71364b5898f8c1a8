"""Assembles one broker: settings -> runtime (core + log) -> API routes -> HTTP server,
and runs the serve/shutdown sequence."""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

import trio

from broker.api import BrokerMetrics, build_router, http_error, protect
from broker.config import Settings
from broker.http import HTTPServer, Limits
from broker.runtime import BrokerRuntime, RuntimeOptions

__all__ = ["BrokerApp", "build_app", "build_router", "http_limits", "runtime_options"]

log = logging.getLogger("ackbus.app")

#: How long past the shutdown deadline the final checkpoint may still take.
FINAL_CHECKPOINT_GRACE_S = 30.0


class BrokerApp:
    """A runtime and its HTTP server, started and stopped together."""

    def __init__(self, runtime: BrokerRuntime, limits: Limits, *, metrics_handler: Any = None) -> None:
        self.runtime = runtime
        self.server = HTTPServer(
            protect(build_router(runtime, metrics_handler=metrics_handler)),
            limits=limits,
            error_translator=http_error,
        )
        self._scope: trio.CancelScope | None = None

    async def serve(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[BrokerApp] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen, recover and serve until :meth:`shutdown` (or cancellation).

        The socket is bound first, so that a busy address fails before recovery
        begins; requests during recovery get ``503 not_ready``.

        Raises: ``OSError`` naming the address when it cannot be bound; whatever
        recovery raises (``broker.storage.StorageError`` for a corrupt log).
        """
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            try:
                await nursery.start(partial(self.server.serve_tcp, port, host=host))
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
            log.info("listening", extra={"fields": {"host": host, "port": self.server.ports[0]}})
            await nursery.start(self.runtime.serve)
            task_status.started(self)

    @property
    def port(self) -> int:
        return self.server.ports[0]

    async def shutdown(self, timeout_s: float) -> bool:
        """Graceful shutdown: stop accepting, send ``closing`` to every channel, let
        in-flight publishes reach disk and get their confirms, end every channel
        (unacked deliveries go back to their queues), write a final checkpoint, close
        the log. Returns whether the clients were drained within ``timeout_s``.

        ``timeout_s`` bounds the wait for clients: 80 % of it for the log to sync what
        was received, the rest for connections to finish their responses; then they
        are cut. The final checkpoint follows (it is not cut short before
        ``FINAL_CHECKPOINT_GRACE_S`` more: skipping it would lose nothing, as the log
        holds everything, but makes the next start replay the whole log).

        Before recovery has finished there is nothing to drain or checkpoint: the
        broker stops at once (recovery itself runs to its end in its worker thread).
        """
        deadline = trio.current_time() + timeout_s
        self.server.stop_accepting()
        if not self.runtime.ready:
            log.info("recovery still running: stopping once it has finished")
            await self.server.shutdown(grace_s=0)
            if self._scope is not None:
                self._scope.cancel()
            return True
        # Parked long-poll gets answer (empty) now rather than after the drain.
        self.runtime.shutting_down = True
        self.runtime.wake_getters()
        drained = await self.runtime.drain(timeout_s * 0.8)
        self.runtime.wake_getters()  # any that parked again meanwhile
        await self.server.shutdown(grace_s=max(0.0, deadline - trio.current_time()))
        with trio.move_on_at(deadline + FINAL_CHECKPOINT_GRACE_S if math.isfinite(deadline) else math.inf):
            await self.runtime.aclose(checkpoint=True)
        if self._scope is not None:
            self._scope.cancel()
        return drained


def runtime_options(settings: Settings) -> RuntimeOptions:
    """The runtime's (and the core's) options from ``settings``."""
    return settings.section(RuntimeOptions)


def http_limits(settings: Settings) -> Limits:
    """The HTTP server's limits from ``settings``."""
    return settings.section(Limits)


def build_app(settings: Settings) -> BrokerApp:
    """A broker with metrics, built from ``settings`` (not started)."""
    metrics = BrokerMetrics()
    runtime = BrokerRuntime(runtime_options(settings), metrics=metrics)
    app = BrokerApp(runtime, http_limits(settings), metrics_handler=metrics.handler(runtime))
    metrics.bind(runtime, app.server)
    return app

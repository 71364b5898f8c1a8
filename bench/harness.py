"""What a workload is and what it works with, shared by ``workloads.py`` and ``growth.py``.

The server a workload drives (:class:`Server`: ackbus, RabbitMQ or Redis), the
:class:`Context` it runs in (parameters, log directory, status line, worker
processes), :class:`BenchError` for numbers that cannot be trusted, the
:class:`Workload` record of the registry, and the steps more than one workload takes
(:func:`fanout_step`, :func:`kill_and_restart`). Both workload modules import this one
and not each other's private names.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from bench.params import Params
from bench.procs import run_workers
from bench.servers import rss_bytes
from bench.stats import Figure

__all__ = [
    "MiB",
    "BenchError",
    "Context",
    "Server",
    "Workload",
    "fanout_step",
    "ignore_start",
    "kill_and_restart",
]

MiB = 1024 * 1024


class Server(Protocol):
    side: str

    @property
    def pid(self) -> int: ...
    def client_spec(self) -> dict[str, Any]: ...
    def queue_messages(self, queue: str) -> int: ...
    def kill9(self) -> None: ...
    def spawn(self) -> None: ...
    def wait_queue(self, queue: str, expected: int, timeout_s: float) -> None: ...
    def wal_bytes_written(self) -> int | None: ...


class BenchError(Exception):
    """A run produced numbers that cannot be trusted (lost messages, reconnects)."""


@dataclasses.dataclass
class Context:
    params: Params
    log_dir: Path
    status: Callable[[str], None]

    def workers(
        self,
        server: Server,
        specs: Sequence[dict[str, Any]],
        run_timeout_s: float,
        go_order: Sequence[int] | None = None,
    ) -> list[dict[str, Any]]:
        full = [{**server.client_spec(), **spec} for spec in specs]
        results = run_workers(
            getattr(server, "worker_side", server.side),  # --amqp: pika workers on ackbus
            full,
            log_dir=self.log_dir,
            ready_timeout_s=self.params.ready_timeout_s,
            run_timeout_s=run_timeout_s,
            go_order=go_order,
        )
        for spec, result in zip(full, results):
            if result.get("reconnects") or result.get("resent") or result.get("failed") or result.get("nacked"):
                raise BenchError(f"{spec['op']} worker saw reconnects, resends, failures or nacks: {result}")
        return results


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    title: str
    figures: Callable[[Params], list[Figure]]
    run: Callable[[Context, Server, float], tuple[dict[str, float], dict[str, Any]]]
    # the most the run itself may take: the sum of its steps' own time limits
    budget_s: Callable[[Params], float]
    # the peers that can run it too (ackbus always runs it); most need RabbitMQ's
    # exchanges, dead letters, priorities or transactions, which Redis Streams lack
    peers: frozenset[str] = frozenset({"rabbitmq"})
    # run against ackbus only (no peer has such a feature): the same as peers=frozenset()
    ackbus_only: bool = False

    def __post_init__(self) -> None:
        if self.ackbus_only:
            object.__setattr__(self, "peers", frozenset())

    def runs_on(self, side: str) -> bool:
        return side == "ackbus" or side in self.peers


def ignore_start(fn: Callable[[Context, Server], Any]) -> Callable[[Context, Server, float], Any]:
    """A run that has no use for the server's start time (most)."""
    return lambda ctx, server, start_s: fn(ctx, server)


def kill_and_restart(server: Server, wait_ready: Callable[[], None]) -> tuple[float, int, int]:
    """kill -9 the broker, start it again: (seconds until ``wait_ready`` returned, RSS
    then, RSS 2 s later)."""
    server.kill9()
    t0 = time.perf_counter()
    server.spawn()
    wait_ready()
    recovery_s = time.perf_counter() - t0
    rss_ready = rss_bytes(server.pid)
    time.sleep(2.0)
    return recovery_s, rss_ready, rss_bytes(server.pid)


def fanout_step(
    ctx: Context, server: Server, exchange: str, queues: Sequence[str], size: int, duration_s: float,
    timeout_s: float,
) -> dict[str, Any]:
    """One pipelined publisher to a fanout exchange bound to ``queues`` (declared and
    bound by the worker before GO) for ``duration_s``; the last queue must hold every
    confirmed message. Returns the worker's result."""
    spec = {"op": "publish_pipelined", "queues": list(queues), "fanout": exchange, "exchange": exchange,
            "routing_key": "", "size": size, "duration_s": duration_s, "window": ctx.params.pipelined_window}
    (result,) = ctx.workers(server, [spec], timeout_s)
    depth = server.queue_messages(queues[-1])
    if depth != result["count"]:
        raise BenchError(f"fan-out to {len(queues)} queues: {result['count']} confirmed but {queues[-1]} holds {depth}")
    return result

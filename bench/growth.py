"""Growth with work: the same workload made 10×, 100×, 1,000× bigger, to see whether
the broker's cost grows no faster than the work.

- ``growth_fanout``: one publisher (window 1,000, 100 B) to a fanout exchange bound to
  1, 10, 100 and 1,000 durable queues. Figures: confirmed msgs/s, and deliveries/s
  (msgs/s × queues: every message is stored in every queue), the work done.
- ``growth_publishers``: 1, 10 and 100 channels publishing at once (100 B, window 100
  per channel) to **one** queue, so that only the number of channels grows (the number
  of queues is ``growth_fanout``'s variable). The channels are spread over at most
  ``growth_publisher_procs`` client processes (a 2-core machine runs 100 channels as
  tasks, not as 100 processes): ``publish_pipelined`` with ``channels: k``.
- ``growth_memory`` (ackbus only): broker RSS, restart-after-``kill -9`` time, RSS after
  recovery and the data directory's size with 1M and then 10M 100-byte messages queued.
  The steps are cumulative on one queue: the 10M step adds 9M to the 1M (already
  recovered once), so the data directory is a broker's that lived through a crash.

Registered in ``bench.workloads.WORKLOADS`` by the last lines of that module
(:func:`growth_workloads`); what both modules share is ``bench.harness``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.harness import (
    BenchError,
    Context,
    MiB,
    Server,
    Workload,
    fanout_step,
    ignore_start,
    kill_and_restart,
)
from bench.params import Params
from bench.servers import AckbusServer, rss_bytes
from bench.stats import Figure

__all__ = ["data_dir_bytes", "growth_workloads", "spread"]

BODY = 100


# --------------------------------------------------------------------------- fan-out to N queues


def _fanout_figures(p: Params) -> list[Figure]:
    out = []
    for n in p.growth_fanout_queues:
        label = f"growth: fan-out publish to {n:,} queue{'s' if n > 1 else ''} (window {p.pipelined_window}), 100 B"
        out += [
            Figure(f"growth_fanout/{n}/msgs_per_s", "growth_fanout", label, "confirmed msgs/s", True),
            Figure(f"growth_fanout/{n}/deliveries_per_s", "growth_fanout", label, "deliveries/s", True),
        ]
    return out


def _fanout_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    """Per queue count, a fresh exchange and queues (declared and bound by the worker
    before GO, untimed), one pipelined publisher for ``growth_fanout_duration_s``; the
    last queue must hold every confirmed message."""
    p = ctx.params
    figures, extra = {}, {}
    for n in p.growth_fanout_queues:
        ctx.status(f"growth: fan-out to {n:,} queues")
        queues = [f"bench.gfan.{n}.{i}" for i in range(n)]
        result = fanout_step(ctx, server, f"bench.growth.fanout.{n}", queues, BODY, p.growth_fanout_duration_s,
                             p.step_timeout_s(p.growth_fanout_duration_s))
        rate = result["count"] / result["elapsed_s"]
        figures[f"growth_fanout/{n}/msgs_per_s"] = rate
        figures[f"growth_fanout/{n}/deliveries_per_s"] = rate * n
        extra[str(n)] = result
    return figures, extra


# --------------------------------------------------------------------------- N publisher channels


def _publishers_figures(p: Params) -> list[Figure]:
    return [
        Figure(f"growth_publishers/{k}/msgs_per_s", "growth_publishers",
               f"growth: {k} publisher channel{'s' if k > 1 else ''} at once to one queue "
               f"(window {p.growth_publisher_window} each), 100 B", "confirmed msgs/s", True)
        for k in p.growth_publisher_channels
    ]


def spread(channels: int, procs: int) -> list[int]:
    """``channels`` over at most ``procs`` processes, as evenly as can be: 10 over 4 is
    [3, 3, 2, 2]."""
    n = min(channels, procs)
    return [channels // n + (i < channels % n) for i in range(n)]


def _publishers_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    """Per channel count k, k channels publish to one queue for the step's duration,
    spread over ``min(k, growth_publisher_procs)`` processes (one connection each);
    the queue must hold every confirmed message."""
    p = ctx.params
    figures, extra = {}, {}
    for k in p.growth_publisher_channels:
        ctx.status(f"growth: {k} publisher channel(s) at once")
        queue = f"bench.growth.pub.{k}"
        specs = [{"op": "publish_pipelined", "queues": [queue], "routing_key": queue, "size": BODY,
                  "duration_s": p.growth_publishers_duration_s, "window": p.growth_publisher_window,
                  "channels": c}
                 for c in spread(k, p.growth_publisher_procs)]
        results = ctx.workers(server, specs, p.step_timeout_s(p.growth_publishers_duration_s))
        confirmed = sum(r["count"] for r in results)
        depth = server.queue_messages(queue)
        if depth != confirmed:
            raise BenchError(f"{k} publisher channels: {confirmed} confirmed but {queue} holds {depth}")
        figures[f"growth_publishers/{k}/msgs_per_s"] = confirmed / max(r["elapsed_s"] for r in results)
        extra[str(k)] = results
    return figures, extra


# --------------------------------------------------------------------------- memory and recovery (ackbus)


def _count_name(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n:,}"


def _memory_figures(p: Params) -> list[Figure]:
    out = []
    for n in p.growth_memory_counts:
        what = f"{_count_name(n)} × 100 B queued"
        out += [
            Figure(f"growth_memory/{n}/rss_filled_mib", "growth_memory", f"growth: broker RSS with {what}",
                   "MiB", False),
            Figure(f"growth_memory/{n}/recovery_s", "growth_memory",
                   f"growth: restart after kill -9 with {what}: start → ready", "s", False),
            Figure(f"growth_memory/{n}/rss_recovered_mib", "growth_memory",
                   f"growth: broker RSS after recovering {what}", "MiB", False),
            Figure(f"growth_memory/{n}/disk_mib", "growth_memory", f"growth: data directory on disk with {what}",
                   "MiB", False),
        ]
    return out


def data_dir_bytes(path: Path) -> int:
    """Bytes allocated on disk to the files under ``path`` (``du``: preallocated WAL
    space counts, holes do not)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:  # a temp file renamed or a segment retired meanwhile
                pass
    return total


def _recovery_timeout_s(p: Params, n: int) -> float:
    return p.slack_s + n / p.growth_memory_min_recovery_rate


def _memory_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    """Fill one queue up to each count in turn (pipelined, confirmed, by
    ``growth_memory_fill_procs`` publishers sharing the messages to add), then: RSS
    1 s after the fill, the data directory's size, ``kill -9``, restart until the queue
    shows every message again, RSS 2 s after that."""
    assert isinstance(server, AckbusServer)  # (ackbus only: its RSS and data directory)
    p = ctx.params
    queue, held = "bench.growth.memory", 0
    figures, extra = {}, {}
    for n in p.growth_memory_counts:
        add = n - held
        procs = p.growth_memory_fill_procs
        ctx.status(f"growth memory: filling {add:,} messages ({_count_name(n)} queued then)")
        specs = [{"op": "publish_pipelined", "queues": [queue], "routing_key": queue, "size": BODY,
                  "count": add // procs + (i < add % procs), "window": p.fill_window} for i in range(procs)]
        t0 = time.perf_counter()
        ctx.workers(server, specs, p.fill_timeout_s(add))
        fill_s = time.perf_counter() - t0
        depth = server.queue_messages(queue)
        if depth != n:
            raise BenchError(f"filled {queue} up to {n:,} confirmed messages but it holds {depth:,}")
        held = n
        time.sleep(1.0)
        rss_filled = rss_bytes(server.pid)
        disk = data_dir_bytes(server.data_dir)
        ctx.status(f"growth memory: kill -9 and restart with {_count_name(n)} messages")
        recovery_s, rss_ready, rss_recovered = kill_and_restart(
            server, lambda: server.wait_queue(queue, n, _recovery_timeout_s(p, n)))
        figures.update({
            f"growth_memory/{n}/rss_filled_mib": rss_filled / MiB,
            f"growth_memory/{n}/recovery_s": recovery_s,
            f"growth_memory/{n}/rss_recovered_mib": rss_recovered / MiB,
            f"growth_memory/{n}/disk_mib": disk / MiB,
        })
        extra[str(n)] = {"fill_s": fill_s, "fill_msgs_per_s": add / fill_s, "rss_at_ready_mib": rss_ready / MiB,
                         "disk_after_recovery_mib": data_dir_bytes(server.data_dir) / MiB}
    return figures, extra


# --------------------------------------------------------------------------- budgets and registry


def _budget_fanout(p: Params) -> float:
    return len(p.growth_fanout_queues) * p.step_timeout_s(p.growth_fanout_duration_s) + 60


def _budget_publishers(p: Params) -> float:
    return len(p.growth_publisher_channels) * p.step_timeout_s(p.growth_publishers_duration_s) + 60


def _budget_memory(p: Params) -> float:
    budget, held = 60.0, 0
    for n in p.growth_memory_counts:
        # fill (workers' readiness included), 1 s settle, kill -9 and recovery, 2 s settle
        budget += p.ready_timeout_s + p.fill_timeout_s(n - held) + 1 + 30 + _recovery_timeout_s(p, n) + 2
        held = n
    return budget


def growth_workloads() -> tuple[Workload, ...]:
    """The growth workloads, for ``bench.workloads.WORKLOADS``."""
    return (
        Workload("growth_fanout", "15. growth: fan-out to 1…1,000 queues", _fanout_figures,
                 ignore_start(_fanout_run), _budget_fanout),
        Workload("growth_publishers", "16. growth: 1…100 publisher channels", _publishers_figures,
                 ignore_start(_publishers_run), _budget_publishers),
        Workload("growth_memory", "17. growth: memory and recovery with 1M and 10M queued (ackbus only)",
                 _memory_figures, ignore_start(_memory_run), _budget_memory, ackbus_only=True),
    )

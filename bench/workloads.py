"""The workloads: what each does to a running server, and the figures it yields.

The six of the benchmark issue, plus ``inflight`` (confirmed publishes per second with
1, 8 and 64 in flight per channel) and the WAL bytes written per message, which the
durability issue asks for.

Every workload gets a freshly started server (fresh data directory, Mnesia
directory or Redis directory) and returns ``(figures, extra)``: ``figures`` maps the keys of
:func:`figures` to numbers, ``extra`` holds what explains them (counts, elapsed
times, sample counts, achieved rates). The same specs drive every side; only the
worker module differs (``bench.worker_ackbus``, ``bench.worker_rabbitmq`` or
``bench.worker_redis``). ``Workload.peers`` says which peers can run a workload.

Every message is persistent, every queue durable, every publish confirmed; ackbus
runs with ``--fsync always``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bench.growth import growth_workloads
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
from bench.servers import AckbusServer, cpu_seconds, rss_bytes
from bench.stats import Figure

__all__ = ["Context", "WORKLOADS", "Workload", "all_figures"]


def size_name(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


# --------------------------------------------------------------------------- 1. one-at-a-time


def _seq_figures(p: Params) -> list[Figure]:
    out = []
    for size in p.body_sizes:
        label = f"one-at-a-time confirmed publish, {size_name(size)}"
        out += [
            Figure(f"publish_seq/{size}/msgs_per_s", "publish_seq", label, "msgs/s", True),
            Figure(f"publish_seq/{size}/p50_ms", "publish_seq", label, "confirm p50 ms", False),
            Figure(f"publish_seq/{size}/p99_ms", "publish_seq", label, "confirm p99 ms", False),
        ]
    return out


def _seq_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    figures, extra = {}, {}
    for size in p.body_sizes:
        ctx.status(f"one-at-a-time publish, {size_name(size)}")
        queue = f"bench.seq.{size}"
        spec = {"op": "publish_seq", "queues": [queue], "routing_key": queue, "size": size,
                "duration_s": p.seq_duration_s, "warmup_s": p.seq_warmup_s}
        (result,) = ctx.workers(server, [spec], p.seq_warmup_s + p.seq_duration_s + p.slack_s)
        figures[f"publish_seq/{size}/msgs_per_s"] = result["count"] / result["elapsed_s"]
        figures[f"publish_seq/{size}/p50_ms"] = result["p50_ms"]
        figures[f"publish_seq/{size}/p99_ms"] = result["p99_ms"]
        extra[str(size)] = result
    return figures, extra


# --------------------------------------------------------------------------- 2. pipelined


def _pipelined_figures(p: Params) -> list[Figure]:
    out = [
        Figure(
            f"publish_pipelined/{size}/x{n}/msgs_per_s", "publish_pipelined",
            f"pipelined publish (window {p.pipelined_window}), {n} publisher{'s' if n > 1 else ''}, {size_name(size)}",
            "confirmed msgs/s", True,
        )
        for size in p.body_sizes
        for n in p.pipelined_procs
    ]
    out += [
        Figure(f"publish_pipelined/{size}/wal_bytes_per_msg", "publish_pipelined",
               f"WAL bytes written per confirmed message (pipelined publish), {size_name(size)}",
               "WAL bytes/msg", False)
        for size in p.body_sizes
    ]
    out.append(Figure("publish_pipelined/broker_cpu_us_per_msg", "publish_pipelined",
                      "broker CPU per confirmed message, pipelined publish (every size and publisher count)",
                      "broker CPU µs/msg", False))
    return out


def _pipelined_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    """Per body size and publisher count, ``n`` pipelined publishers on one queue each
    with its own connection and channel. The WAL bytes per message (ackbus only) are
    the growth of ``wal_bytes_written`` over all steps of one body size divided by the
    messages confirmed in them (queue declares included: a few records among
    thousands)."""
    p = ctx.params
    figures, extra = {}, {}
    cpu_s, messages = 0.0, 0
    for size in p.body_sizes:
        wal_before, confirmed_total = server.wal_bytes_written(), 0
        for n in p.pipelined_procs:
            ctx.status(f"pipelined publish, {n} publisher(s), {size_name(size)}")
            queue = f"bench.pipe.{size}.{n}"
            spec = {"op": "publish_pipelined", "queues": [queue], "routing_key": queue, "size": size,
                    "duration_s": p.pipelined_duration_s, "window": p.pipelined_window}
            cpu0 = cpu_seconds(server.pid)
            results = ctx.workers(server, [spec] * n, p.pipelined_duration_s + p.slack_s)
            cpu_s += cpu_seconds(server.pid) - cpu0
            confirmed = sum(r["count"] for r in results)
            messages += confirmed
            elapsed = max(r["elapsed_s"] for r in results)
            figures[f"publish_pipelined/{size}/x{n}/msgs_per_s"] = confirmed / elapsed
            extra[f"{size}/x{n}"] = results
            confirmed_total += confirmed
        wal_after = server.wal_bytes_written()
        if wal_before is not None and wal_after is not None and confirmed_total:
            figures[f"publish_pipelined/{size}/wal_bytes_per_msg"] = (wal_after - wal_before) / confirmed_total
            extra[f"{size}/wal"] = {"bytes_written": wal_after - wal_before, "messages": confirmed_total}
    _broker_cpu_figure(figures, extra, "publish_pipelined", cpu_s, messages)
    return figures, extra


def _broker_cpu_figure(
    figures: dict[str, float], extra: dict[str, Any], workload: str, cpu_s: float, messages: int
) -> None:
    """The broker's CPU time (``/proc``, user + system) over a workload's timed steps
    divided by the messages they handled: what a message costs the broker alone, apart
    from the client that shares the machine with it."""
    if messages and cpu_s == cpu_s:  # (NaN: the process was gone)
        figures[f"{workload}/broker_cpu_us_per_msg"] = cpu_s * 1e6 / messages
        extra["broker_cpu"] = {"cpu_s": cpu_s, "messages": messages}


# --------------------------------------------------------------------------- 2b. in flight


def _inflight_figures(p: Params) -> list[Figure]:
    return [
        Figure(
            f"inflight/{window}/msgs_per_s", "inflight",
            f"confirmed publish, {window} in flight per channel, {size_name(p.inflight_size)}",
            "confirmed msgs/s", True,
        )
        for window in p.inflight_windows
    ]


def _inflight_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    """One publisher, one channel, at most ``window`` publishes unconfirmed (ackbus: the
    client's ``max_pending``; pika: a confirm window counted by delivery tag)."""
    p = ctx.params
    figures, extra = {}, {}
    for window in p.inflight_windows:
        ctx.status(f"confirmed publish, {window} in flight, {size_name(p.inflight_size)}")
        queue = f"bench.inflight.{window}"
        spec = {"op": "publish_pipelined", "queues": [queue], "routing_key": queue, "size": p.inflight_size,
                "duration_s": p.inflight_duration_s, "window": window}
        (result,) = ctx.workers(server, [spec], p.inflight_duration_s + p.slack_s)
        figures[f"inflight/{window}/msgs_per_s"] = result["count"] / result["elapsed_s"]
        extra[str(window)] = result
    return figures, extra


# --------------------------------------------------------------------------- 3. consume


def _fill(
    ctx: Context, server: Server, queues: Sequence[str], size: int, count: int, procs: int = 1,
    arguments: dict[str, Any] | None = None, also_declare: Sequence[str] = (), priorities: int = 0,
) -> dict[str, Any]:
    """Publish ``count`` messages into each queue (pipelined, confirmed; not timed as a
    figure); ``procs`` publishers per queue share the count. Checks the queue depth.
    ``arguments``: queue name -> the arguments it is declared with; ``also_declare``:
    more queues to declare first (a dead-letter queue)."""
    p = ctx.params
    specs = []
    for queue in queues:
        for i in range(procs):
            share = count // procs + (1 if i < count % procs else 0)
            specs.append({"op": "publish_pipelined", "queues": [*also_declare, queue], "routing_key": queue,
                          "size": size,
                          "count": share, "window": p.fill_window, "queue_arguments": arguments or {},
                          "priorities": priorities})
    t0 = time.perf_counter()
    ctx.workers(server, specs, p.fill_timeout_s(count * len(queues)))
    elapsed = time.perf_counter() - t0
    for queue in queues:
        depth = server.queue_messages(queue)
        if depth != count:
            raise BenchError(f"filled {queue} with {count} confirmed messages but it holds {depth}")
    return {"fill_s": elapsed, "fill_msgs_per_s": count * len(queues) / elapsed}


def _consume_figures(p: Params) -> list[Figure]:
    return [
        Figure(
            f"consume/{size}/prefetch{prefetch}/msgs_per_s", "consume",
            f"consume + ack from {p.consume_count:,} queued, prefetch {prefetch}, {size_name(size)}",
            "msgs/s", True,
        )
        for size in p.body_sizes
        for prefetch in p.consume_prefetch
    ] + [
        Figure("consume/broker_cpu_us_per_msg", "consume",
               "broker CPU per message consumed + acked (every size and prefetch; the fill left out)",
               "broker CPU µs/msg", False),
    ]


def _consume_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    figures, extra = {}, {}
    cpu_s, messages = 0.0, 0
    for size in p.body_sizes:
        queues = {prefetch: f"bench.consume.{size}.p{prefetch}" for prefetch in p.consume_prefetch}
        ctx.status(f"consume: filling {len(queues)} × {p.consume_count:,} messages of {size_name(size)}")
        extra[f"{size}/fill"] = _fill(ctx, server, list(queues.values()), size, p.consume_count)
        for prefetch, queue in queues.items():
            ctx.status(f"consume {p.consume_count:,} × {size_name(size)}, prefetch {prefetch}")
            cpu0 = cpu_seconds(server.pid)
            result = _drain(ctx, server, queue, p.consume_count, prefetch)
            cpu_s += cpu_seconds(server.pid) - cpu0
            messages += result["count"]
            figures[f"consume/{size}/prefetch{prefetch}/msgs_per_s"] = result["count"] / result["elapsed_s"]
            extra[f"{size}/prefetch{prefetch}"] = result
    _broker_cpu_figure(figures, extra, "consume", cpu_s, messages)
    return figures, extra


def _drain(ctx: Context, server: Server, queue: str, count: int, prefetch: int) -> dict[str, Any]:
    """One consumer takes and acks ``count`` messages of ``queue`` (all must come)."""
    spec = {"op": "consume", "queue": queue, "count": count, "prefetch": prefetch}
    (result,) = ctx.workers(server, [spec], ctx.params.fill_timeout_s(count))
    if result["count"] != count:
        raise BenchError(f"consumed {result['count']} of {count}")
    return result


# --------------------------------------------------------------------------- 4. end to end


def _e2e_figures(p: Params) -> list[Figure]:
    out = []
    for size in p.body_sizes:
        label = f"publish→deliver latency at {p.e2e_rate:,} msgs/s, {size_name(size)}"
        out += [
            Figure(f"e2e/{size}/p50_ms", "e2e", label, "p50 ms", False),
            Figure(f"e2e/{size}/p99_ms", "e2e", label, "p99 ms", False),
        ]
    return out


def _e2e_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    figures, extra = {}, {}
    for size in p.body_sizes:
        ctx.status(f"publish→deliver latency at {p.e2e_rate} msgs/s, {size_name(size)}")
        queue = f"bench.e2e.{size}"
        total = round(p.e2e_rate * (p.e2e_warmup_s + p.e2e_duration_s))
        warmup = round(p.e2e_rate * p.e2e_warmup_s)
        run_s = p.e2e_warmup_s + p.e2e_duration_s
        consumer = {"op": "e2e_consume", "queues": [queue], "queue": queue, "prefetch": p.e2e_prefetch,
                    "total": total, "warmup_count": warmup, "timeout_s": run_s + p.slack_s / 2}
        publisher = {"op": "e2e_publish", "queues": [queue], "routing_key": queue, "size": size,
                     "rate": p.e2e_rate, "total": total}
        received, published = ctx.workers(server, [consumer, publisher], run_s + p.slack_s, go_order=[0, 1])
        if received["received"] != total:
            raise BenchError(f"latency run: published {total}, received {received['received']}")
        if published["rate"] < 0.95 * p.e2e_rate:
            raise BenchError(f"latency run: publisher reached only {published['rate']:.0f} msgs/s")
        figures[f"e2e/{size}/p50_ms"] = received["p50_ms"]
        figures[f"e2e/{size}/p99_ms"] = received["p99_ms"]
        extra[str(size)] = {"consumer": received, "publisher": published}
    return figures, extra


# --------------------------------------------------------------------------- 5. recovery


def _recovery_figures(p: Params) -> list[Figure]:
    what = f"{p.recovery_count:,} × {size_name(p.recovery_body_size)} persistent"
    return [
        Figure("recovery/recovery_s", "recovery", f"restart after kill -9 with {what}: start → ready", "s", False),
        Figure("recovery/rss_recovered_mib", "recovery", f"broker RSS after that recovery ({what} loaded)",
               "MiB", False),
        Figure("recovery/rss_filled_mib", "recovery", f"broker RSS after publishing {what} (before kill -9)",
               "MiB", False),
        Figure("recovery/empty_start_s", "recovery", "start → ready, empty data directory", "s", False),
    ]


def _recovery_run(ctx: Context, server: Server, start_s: float) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    count, queue = p.recovery_count, "bench.recovery"
    ctx.status(f"recovery: filling {count:,} messages")
    extra: dict[str, Any] = {"fill": _fill(ctx, server, [queue], p.recovery_body_size, count, p.recovery_fill_procs)}
    time.sleep(1.0)
    rss_filled = rss_bytes(server.pid)
    ctx.status(f"recovery: kill -9 and restart with {count:,} messages")
    recovery_s, rss_ready, rss_settled = kill_and_restart(server, lambda: server.wait_queue(
        queue, count, p.fill_timeout_s(count)))
    extra.update(rss_at_ready_mib=rss_ready / MiB, rss_2s_after_ready_mib=rss_settled / MiB)
    return {
        "recovery/recovery_s": recovery_s,
        "recovery/rss_recovered_mib": rss_settled / MiB,
        "recovery/rss_filled_mib": rss_filled / MiB,
        "recovery/empty_start_s": start_s,
    }, extra


# --------------------------------------------------------------------------- 6. fan-out


def _fanout_figures(p: Params) -> list[Figure]:
    return [
        Figure(
            f"fanout/{size}/msgs_per_s", "fanout",
            f"fan-out publish to {p.fanout_queues} queues (window {p.pipelined_window}), {size_name(size)}",
            "confirmed msgs/s", True,
        )
        for size in p.body_sizes
    ]


def _fanout_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    figures, extra = {}, {}
    for size in p.body_sizes:
        ctx.status(f"fan-out to {p.fanout_queues} queues, {size_name(size)}")
        queues = [f"bench.fan.{size}.{i}" for i in range(p.fanout_queues)]
        result = fanout_step(ctx, server, f"bench.fanout.{size}", queues, size, p.fanout_duration_s,
                             p.fanout_duration_s + p.slack_s)
        figures[f"fanout/{size}/msgs_per_s"] = result["count"] / result["elapsed_s"]
        extra[str(size)] = result
    return figures, extra


# --------------------------------------------------------------------------- 7. failures


def _failures_figures(p: Params) -> list[Figure]:
    n = f"{p.failures_count:,} queued, prefetch {p.failures_prefetch}, 100 B"
    return [
        Figure("failures/retry/msgs_per_s", "failures",
               f"consume + ack, every {p.failures_nack_every}th first delivery nacked back once, {n}",
               "acks/s", True),
        Figure("failures/dead_letter/msgs_per_s", "failures",
               f"consumer rejects everything into a dead-letter queue, {n}", "dead-lettered/s", True),
    ]


def _failures_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    n, figures, extra = p.failures_count, {}, {}
    ctx.status(f"failures: {n:,} messages, a nack-and-retry every {p.failures_nack_every}th")
    queue = "bench.failures.retry"
    extra["retry_fill"] = _fill(ctx, server, [queue], 100, n)
    spec = {"op": "consume", "queue": queue, "count": n, "prefetch": p.failures_prefetch,
            "nack_every": p.failures_nack_every}
    (result,) = ctx.workers(server, [spec], p.fill_timeout_s(n))
    figures["failures/retry/msgs_per_s"] = result["count"] / result["elapsed_s"]
    extra["retry"] = result

    ctx.status(f"failures: {n:,} messages rejected into a dead-letter queue")
    work, dead = "bench.failures.work", "bench.failures.dead"
    arguments = {work: {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}}
    extra["dead_letter_fill"] = _fill(ctx, server, [work], 100, n, arguments=arguments, also_declare=[dead])
    spec = {"op": "consume", "queue": work, "count": n, "prefetch": p.failures_prefetch, "reject_all": True}
    (result,) = ctx.workers(server, [spec], p.fill_timeout_s(n))
    t0 = time.perf_counter()
    server.wait_queue(dead, n, p.fill_timeout_s(n))  # every dead letter is in place
    elapsed = result["elapsed_s"] + time.perf_counter() - t0
    figures["failures/dead_letter/msgs_per_s"] = n / elapsed
    extra["dead_letter"] = result
    return figures, extra


# --------------------------------------------------------------------------- 8. delayed (ackbus)


def _delayed_figures(p: Params) -> list[Figure]:
    what = f"{p.delayed_count:,} × {size_name(p.delayed_body_size)} delayed messages"
    return [
        Figure("delayed/publish_msgs_per_s", "delayed", f"pipelined publish of {what}", "msgs/s", True),
        Figure("delayed/rss_filled_mib", "delayed", f"broker RSS holding {what}", "MiB", False),
        Figure("delayed/recovery_s", "delayed", f"restart after kill -9 with {what}: start → ready", "s", False),
        Figure("delayed/rss_recovered_mib", "delayed", "broker RSS after that recovery", "MiB", False),
    ]


def _delayed_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    n, queue = p.delayed_count, "bench.delayed"
    ctx.status(f"delayed: publishing {n:,} messages delayed by {p.delayed_delay_s:g} s")
    specs = [{"op": "publish_pipelined", "queues": [queue], "routing_key": queue, "size": p.delayed_body_size,
              "count": n // 2 + (i < n % 2), "window": p.fill_window, "delay_s": p.delayed_delay_s}
             for i in range(2)]
    results = ctx.workers(server, specs, p.fill_timeout_s(n))
    publish_s = max(r["elapsed_s"] for r in results)
    assert isinstance(server, AckbusServer)  # (ackbus only: messages_delayed)

    def all_delayed() -> None:
        server.wait_queue(queue, n, p.fill_timeout_s(n), field="messages_delayed")

    all_delayed()
    time.sleep(1.0)
    rss_filled = rss_bytes(server.pid)
    ctx.status(f"delayed: kill -9 and restart with {n:,} delayed messages")
    recovery_s, _rss_ready, rss_recovered = kill_and_restart(server, all_delayed)
    return {
        "delayed/publish_msgs_per_s": n / publish_s,
        "delayed/rss_filled_mib": rss_filled / MiB,
        "delayed/recovery_s": recovery_s,
        "delayed/rss_recovered_mib": rss_recovered / MiB,
    }, {"publishers": results}


# --------------------------------------------------------------------------- 10. get over several queues


def _get_any_figures(p: Params) -> list[Figure]:
    label = (f"publish→get latency, one long poll over {p.get_any_queues} queues, only the last "
             f"has work, {p.get_any_rate} msgs/s, 100 B")
    return [
        Figure("get_any/p50_ms", "get_any", label, "p50 ms", False),
        Figure("get_any/p99_ms", "get_any", label, "p99 ms", False),
    ]


def _get_any_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    queues = [f"bench.any.{i}" for i in range(p.get_any_queues)]
    total = round(p.get_any_rate * (1.0 + p.get_any_duration_s))
    warmup = p.get_any_rate  # the first second
    run_s = 1.0 + p.get_any_duration_s
    ctx.status(f"get over {len(queues)} queues, work on the last only, {p.get_any_rate} msgs/s")
    consumer = {"op": "get_any_consume", "queues": queues, "max": 10, "total": total, "warmup_count": warmup,
                "timeout_s": run_s + p.slack_s / 2}
    publisher = {"op": "e2e_publish", "queues": [queues[-1]], "routing_key": queues[-1], "size": 100,
                 "rate": p.get_any_rate, "total": total}
    received, _published = ctx.workers(server, [consumer, publisher], run_s + p.slack_s, go_order=[0, 1])
    if received["received"] != total:
        raise BenchError(f"get over several queues: published {total}, received {received['received']}")
    return {"get_any/p50_ms": received["p50_ms"], "get_any/p99_ms": received["p99_ms"]}, {"consumer": received}


# --------------------------------------------------------------------------- 11. transactions


def _tx_figures(p: Params) -> list[Figure]:
    return [
        Figure(f"tx/{n}/commits_per_s", "tx", f"transactions of {n} publish{'es' if n > 1 else ''}, 100 B, one after another",
               "commits/s", True)
        for n in p.tx_sizes
    ]


def _tx_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    figures, extra = {}, {}
    for n in p.tx_sizes:
        queue = f"bench.tx.{n}"
        ctx.status(f"transactions of {n} publishes")
        spec = {"op": "tx_publish", "queues": [queue], "routing_key": queue, "size": 100, "per_tx": n,
                "duration_s": p.tx_duration_s}
        (result,) = ctx.workers(server, [spec], p.step_timeout_s(p.tx_duration_s))
        figures[f"tx/{n}/commits_per_s"] = result["commits"] / result["elapsed_s"]
        extra[str(n)] = result
    return figures, extra


# --------------------------------------------------------------------------- 12. priority queues


def _priority_figures(p: Params) -> list[Figure]:
    kinds = {"plain": "a plain queue", "priority": f"an x-max-priority {p.priority_levels} queue"}
    out = [
        Figure(f"priority/publish/{kind}/msgs_per_s", "priority",
               f"pipelined publish (window {p.pipelined_window}) to {what}, priorities 0–{p.priority_levels - 1}"
               " in turn, 100 B", "confirmed msgs/s", True)
        for kind, what in kinds.items()
    ]
    out += [
        Figure(f"priority/consume/{kind}/msgs_per_s", "priority",
               f"consume + ack from {p.priority_count:,} queued in {what}, prefetch {p.priority_prefetch}, 100 B",
               "msgs/s", True)
        for kind, what in kinds.items()
    ]
    return out


def _priority_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    """The same messages (priorities 0..levels-1 in turn) published to and consumed
    from a plain queue and a priority queue, one after the other in each round."""
    p = ctx.params
    figures, extra = {}, {}
    for kind in ("plain", "priority"):
        args = {"x-max-priority": p.priority_levels} if kind == "priority" else None
        queue = f"bench.prio.pub.{kind}"
        ctx.status(f"priority: pipelined publish to a {kind} queue")
        spec = {"op": "publish_pipelined", "queues": [queue], "routing_key": queue, "size": 100,
                "duration_s": p.priority_duration_s, "window": p.pipelined_window,
                "queue_arguments": {queue: args} if args else {}, "priorities": p.priority_levels}
        (result,) = ctx.workers(server, [spec], p.step_timeout_s(p.priority_duration_s))
        figures[f"priority/publish/{kind}/msgs_per_s"] = result["count"] / result["elapsed_s"]
        extra[f"publish/{kind}"] = result
        queue = f"bench.prio.consume.{kind}"
        ctx.status(f"priority: consume {p.priority_count:,} from a {kind} queue")
        extra[f"fill/{kind}"] = _fill(ctx, server, [queue], 100, p.priority_count,
                                      arguments={queue: args} if args else None, priorities=p.priority_levels)
        result = _drain(ctx, server, queue, p.priority_count, p.priority_prefetch)
        figures[f"priority/consume/{kind}/msgs_per_s"] = result["count"] / result["elapsed_s"]
        extra[f"consume/{kind}"] = result
    return figures, extra


def _priority_memory_figures(p: Params) -> list[Figure]:
    what = f"{p.priority_memory_count:,} × 100 B queued over {p.priority_levels} priorities"
    return [
        Figure("priority_memory/rss_filled_mib", "priority_memory", f"broker RSS holding {what}", "MiB", False),
        Figure("priority_memory/recovery_s", "priority_memory", f"restart after kill -9 with {what}: start → ready",
               "s", False),
        Figure("priority_memory/rss_recovered_mib", "priority_memory", "broker RSS after that recovery", "MiB", False),
    ]


def _priority_memory_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    n, queue = p.priority_memory_count, "bench.prio.memory"
    ctx.status(f"priority memory: filling {n:,} messages over {p.priority_levels} priorities")
    fill = _fill(ctx, server, [queue], 100, n, procs=2, arguments={queue: {"x-max-priority": p.priority_levels}},
                 priorities=p.priority_levels)
    time.sleep(1.0)
    rss_filled = rss_bytes(server.pid)
    ctx.status(f"priority memory: kill -9 and restart with {n:,} messages")
    recovery_s, _rss_ready, rss_recovered = kill_and_restart(
        server, lambda: server.wait_queue(queue, n, p.fill_timeout_s(n)))
    return {
        "priority_memory/rss_filled_mib": rss_filled / MiB,
        "priority_memory/recovery_s": recovery_s,
        "priority_memory/rss_recovered_mib": rss_recovered / MiB,
    }, {"fill": fill}


# --------------------------------------------------------------------------- 14. locks


def _locks_figures(p: Params) -> list[Figure]:
    return [Figure("locks/roundtrips_per_s", "locks",
                   "lock acquire + release round trips over REST (conn.lock()), one after another",
                   "round trips/s", True)]


def _locks_run(ctx: Context, server: Server) -> tuple[dict[str, float], dict[str, Any]]:
    p = ctx.params
    ctx.status("lock acquire/release round trips")
    spec = {"op": "lock_roundtrips", "lock": "bench.lock", "owner": "bench-worker", "duration_s": p.locks_duration_s}
    (result,) = ctx.workers(server, [spec], p.step_timeout_s(p.locks_duration_s))
    return {"locks/roundtrips_per_s": result["roundtrips"] / result["elapsed_s"]}, {"worker": result}


# --------------------------------------------------------------------------- registry


def _budget_seq(p: Params) -> float:
    return len(p.body_sizes) * p.step_timeout_s(p.seq_warmup_s + p.seq_duration_s)


def _budget_pipelined(p: Params) -> float:
    return len(p.body_sizes) * len(p.pipelined_procs) * p.step_timeout_s(p.pipelined_duration_s) + 60


def _budget_inflight(p: Params) -> float:
    return len(p.inflight_windows) * p.step_timeout_s(p.inflight_duration_s)


def _budget_consume(p: Params) -> float:
    n = len(p.consume_prefetch)
    fill = p.ready_timeout_s + p.fill_timeout_s(n * p.consume_count)
    drain = n * (p.ready_timeout_s + p.fill_timeout_s(p.consume_count))
    return len(p.body_sizes) * (fill + drain) + 60


def _budget_e2e(p: Params) -> float:
    return len(p.body_sizes) * p.step_timeout_s(p.e2e_warmup_s + p.e2e_duration_s)


def _budget_recovery(p: Params) -> float:
    fill = p.ready_timeout_s + p.fill_timeout_s(p.recovery_count)
    return fill + 1 + 30 + p.fill_timeout_s(p.recovery_count) + 2 + 60


def _budget_fanout(p: Params) -> float:
    return len(p.body_sizes) * p.step_timeout_s(p.fanout_duration_s) + 60


def _budget_failures(p: Params) -> float:
    return 4 * (p.ready_timeout_s + p.fill_timeout_s(p.failures_count)) + 60


def _budget_delayed(p: Params) -> float:
    return 3 * (p.ready_timeout_s + p.fill_timeout_s(p.delayed_count)) + 60


def _budget_get_any(p: Params) -> float:
    return p.step_timeout_s(1.0 + p.get_any_duration_s) + 60


def _budget_tx(p: Params) -> float:
    return len(p.tx_sizes) * p.step_timeout_s(p.tx_duration_s) + 60


def _budget_priority(p: Params) -> float:
    publish = 2 * p.step_timeout_s(p.priority_duration_s)
    consume = 2 * 2 * (p.ready_timeout_s + p.fill_timeout_s(p.priority_count))
    return publish + consume + 60


def _budget_priority_memory(p: Params) -> float:
    return 2 * (p.ready_timeout_s + p.fill_timeout_s(p.priority_memory_count)) + 60


def _budget_locks(p: Params) -> float:
    return p.step_timeout_s(p.locks_duration_s) + 60


# the workloads Redis Streams have an equivalent for
BOTH_PEERS = frozenset({"rabbitmq", "redis"})
# the null AMQP peer (bench.server_nullamqp) runs those of RabbitMQ's that need no
# broker work beyond counting, routing and confirming: not latency at a fixed rate
# (the bodies would have to be carried), recovery, or dead letters
NULL_TOO = frozenset({"null"})


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("publish_seq", "1. one-at-a-time confirmed publish", _seq_figures, ignore_start(_seq_run),
                 _budget_seq, peers=BOTH_PEERS | NULL_TOO),
        Workload("publish_pipelined", "2. pipelined confirmed publish", _pipelined_figures,
                 ignore_start(_pipelined_run), _budget_pipelined, peers=BOTH_PEERS | NULL_TOO),
        Workload("inflight", "3. confirmed publish, 1/8/64 in flight", _inflight_figures,
                 ignore_start(_inflight_run), _budget_inflight, peers=BOTH_PEERS | NULL_TOO),
        Workload("consume", "4. consume with manual ack", _consume_figures, ignore_start(_consume_run),
                 _budget_consume, peers=BOTH_PEERS | NULL_TOO),
        Workload("e2e", "5. end-to-end latency at a fixed rate", _e2e_figures, ignore_start(_e2e_run),
                 _budget_e2e, peers=BOTH_PEERS),
        Workload("recovery", "6. recovery after kill -9", _recovery_figures, _recovery_run, _budget_recovery,
                 peers=BOTH_PEERS),
        Workload("fanout", "7. fan-out to 10 queues", _fanout_figures, ignore_start(_fanout_run),
                 _budget_fanout, peers=frozenset({"rabbitmq"}) | NULL_TOO),
        Workload("failures", "8. failures: retries and dead letters", _failures_figures,
                 ignore_start(_failures_run), _budget_failures),
        Workload("delayed", "9. delayed messages (ackbus only)", _delayed_figures, ignore_start(_delayed_run),
                 _budget_delayed, ackbus_only=True),
        Workload("get_any", "10. one long poll over several queues (ackbus only)", _get_any_figures,
                 ignore_start(_get_any_run), _budget_get_any, ackbus_only=True),
        Workload("tx", "11. transactions of 1 and 100 publishes", _tx_figures, ignore_start(_tx_run),
                 _budget_tx, peers=frozenset({"rabbitmq"}) | NULL_TOO),
        Workload("priority", "12. priority queues beside plain ones", _priority_figures,
                 ignore_start(_priority_run), _budget_priority, peers=frozenset({"rabbitmq"}) | NULL_TOO),
        Workload("priority_memory", "13. priority queue memory and recovery (ackbus only)",
                 _priority_memory_figures, ignore_start(_priority_memory_run), _budget_priority_memory,
                 ackbus_only=True),
        Workload("locks", "14. lock acquire/release round trips (ackbus only)", _locks_figures,
                 ignore_start(_locks_run), _budget_locks, ackbus_only=True),
    )
}


def all_figures(p: Params, names: Sequence[str]) -> list[Figure]:
    return [f for name in names for f in WORKLOADS[name].figures(p)]


# Growth with work (15–17) lives in its own module.
WORKLOADS.update((w.name, w) for w in growth_workloads())

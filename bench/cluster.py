"""``scripts/bench --cluster N [--peer redis,rabbitmq]``: what forwarding between nodes costs,
how total throughput grows with nodes, against one Redis, and what a quorum queue costs
(docs/benchmarks.md, "Cluster").

Each cluster is a private etcd and nodes started with ``scripts/cluster up`` (into a
temporary directory) and stopped by PID with ``scripts/cluster down``; the Redis
server is the benchmark's private one (``bench.server_redis``). Every client is a
worker process of the main benchmark (``bench.procs.run_workers``: all connect and
declare, then start together), so a publisher here is the one of workload 2.

- **forwarding**: one queue owned by node 1; pipelined publishes then a consumer
  (with a prefetch) through node 1 (its owner) and through node 2 (which forwards
  each publish over its channel to node 1 and relays the consumer); the ratio is the
  forwarding cost. Needs N >= 2.
- **scale**: 8 queues placed ``balanced`` on k nodes, for k in 1, 2, 4, 8, ... up to
  N (and N itself); one pipelined publisher per queue connected to that queue's
  owner, all at once, for a fixed time; total confirmed messages per second for each
  k. With ``--peer redis`` the same 8 publishers each ``XADD`` to a stream of their
  own on one Redis (``appendfsync always``, as in the main benchmark). Each row also
  gives the CPU the servers and the clients spent per message and the cores all of
  them kept busy, which is what tells, on a small machine, why the total does not
  grow: the processes share the cores there are.
- **quorum** (N >= 3, ``bench.cluster_quorum``): a 3-replica quorum queue against a
  classic one through the leader's node (with ``--peer rabbitmq``: the same pika
  workload on one RabbitMQ node), and the failover time distribution over K kills
  of the leader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.cluster_nodes import (
    FULL,
    QUICK,
    BenchFailed,
    Cluster,
    ClusterParams,
    _check_clean,
    _request,
)
from bench.cluster_quorum import run_quorum_part
from bench.procs import run_workers
from bench.server_redis import RedisServer
from bench.servers import cpu_seconds

__all__ = ["ClusterParams", "node_counts", "run_cluster_bench", "scale_row"]

QUEUES = 8
BODY = 100


def node_counts(nodes: int) -> list[int]:
    """1, 2, 4, 8, ... up to ``nodes``, and ``nodes`` itself."""
    counts, k = [], 1
    while k < nodes:
        counts.append(k)
        k *= 2
    return [*counts, nodes]


def _publisher(side_spec: dict[str, Any], queue: str, params: ClusterParams, **extra: Any) -> dict[str, Any]:
    return {**side_spec, "op": "publish_pipelined", "queues": [queue], "routing_key": queue, "size": BODY,
            "window": params.window, **extra}


def _timeout(params: ClusterParams, seconds: float) -> float:
    return params.slack_s + seconds


def scale_row(side: str, nodes: int, results: Sequence[dict[str, Any]], server_cpu_s: float) -> dict[str, Any]:
    """One row of the scale table from the publishers' results (each with the CPU
    seconds it spent publishing) and the CPU seconds the servers spent in the step."""
    count = sum(int(r["count"]) for r in results)
    client_cpu_s = sum(float(r["cpu_s"]) for r in results)
    wall = max(float(r["elapsed_s"]) for r in results)
    return {
        "side": side, "nodes": nodes, "count": count, "elapsed_s": wall,
        "msgs_per_s": count / wall,
        "server_cpu_us_per_msg": server_cpu_s / count * 1e6,
        "client_cpu_us_per_msg": client_cpu_s / count * 1e6,
        "cores_busy": (server_cpu_s + client_cpu_s) / wall,
    }


def _measured(step: Callable[[], list[dict[str, Any]]], server_pids: Sequence[int]) -> tuple[list[dict[str, Any]], float]:
    """Run ``step``; its results, and the CPU seconds the servers spent meanwhile (the
    clients' connecting included: little beside the timed publishing)."""
    before = sum(cpu_seconds(p) for p in server_pids)
    results = step()
    return results, sum(cpu_seconds(p) for p in server_pids) - before


def _declare(url: str, queue: str, *, local: bool) -> str:
    args = {"x-queue-leader-locator": "client-local"} if local else {}
    return str(_request(url, "PUT", f"/queues/{queue}", {"durable": True, "arguments": args})["owner"])


def _depth(url: str, queue: str) -> int:
    info = _request(url, "GET", f"/queues/{queue}")
    return int(info["messages_ready"]) + int(info.get("messages_unacked", 0))


def forwarding(params: ClusterParams, log_dir: Path) -> dict[str, float]:
    """msgs/s, publishing and consuming, through the owner and through another node."""
    with Cluster(2) as cluster:
        owner, other = cluster.urls
        _declare(owner, "fwd", local=True)
        result: dict[str, float] = {}
        for label, url in (("owner", owner), ("other node", other)):
            side = {"url": url, "ca_file": None}
            timeout = _timeout(params, params.forward_count / 1000)
            (pub,) = run_workers("ackbus", [_publisher(side, "fwd", params, count=params.forward_count)],
                                 log_dir=log_dir, ready_timeout_s=params.ready_timeout_s, run_timeout_s=timeout)
            (con,) = run_workers("ackbus", [{**side, "op": "consume", "queue": "fwd", "count": params.forward_count,
                                             "prefetch": params.prefetch}],
                                 log_dir=log_dir, ready_timeout_s=params.ready_timeout_s, run_timeout_s=timeout)
            _check_clean([pub, con])
            result[f"publish via {label}"] = pub["count"] / pub["elapsed_s"]
            result[f"consume + ack via {label}"] = con["count"] / con["elapsed_s"]
        return result


def scale_ackbus(nodes: int, params: ClusterParams, log_dir: Path) -> dict[str, Any]:
    """8 publishers, one per queue, each to its queue's owner, the queues balanced
    over ``nodes`` nodes."""
    with Cluster(nodes) as cluster:
        by_name = {f"node-{i + 1}": url for i, url in enumerate(cluster.urls)}
        owners = {f"s{q}": by_name[_declare(cluster.urls[0], f"s{q}", local=False)] for q in range(QUEUES)}
        specs = [_publisher({"url": url, "ca_file": None}, queue, params, duration_s=params.duration_s)
                 for queue, url in owners.items()]
        results, server_s = _measured(
            lambda: run_workers("ackbus", specs, log_dir=log_dir, ready_timeout_s=params.ready_timeout_s,
                                run_timeout_s=_timeout(params, params.duration_s)),
            cluster.pids,
        )
        _check_clean(results)
        for (queue, url), r in zip(owners.items(), results):
            if _depth(url, queue) != r["count"]:
                raise BenchFailed(f"queue {queue} holds {_depth(url, queue)}, {r['count']} were confirmed")
        row = scale_row("ackbus", nodes, results, server_s)
        row["queues_per_node"] = {name: sum(u == url for u in owners.values()) for name, url in by_name.items()}
        return row


def scale_redis(params: ClusterParams, log_dir: Path) -> dict[str, Any]:
    """The same 8 publishers, each ``XADD`` to a stream of its own, on one Redis."""
    workdir = Path(tempfile.mkdtemp(prefix="ackbus-bench-cluster-redis-"))
    server = RedisServer(workdir)
    try:
        server.start(timeout_s=60)
        queues = [f"s{q}" for q in range(QUEUES)]
        specs = [_publisher(server.client_spec(), queue, params, duration_s=params.duration_s) for queue in queues]
        results, server_s = _measured(
            lambda: run_workers("redis", specs, log_dir=log_dir, ready_timeout_s=params.ready_timeout_s,
                                run_timeout_s=_timeout(params, params.duration_s)),
            [server.pid],
        )
        for queue, r in zip(queues, results):
            if server.queue_messages(queue) != r["count"]:
                raise BenchFailed(f"stream {queue} holds {server.queue_messages(queue)}, {r['count']} were confirmed")
        return scale_row("redis", 1, results, server_s)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _scale_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| server | nodes | total confirmed msgs/s over 8 queues | server CPU µs/msg (all nodes) "
             "| client CPU µs/msg | cores busy |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        name = "ackbus" if row["side"] == "ackbus" else "Redis (one server)"
        lines.append(f"| {name} | {row['nodes']} | {row['msgs_per_s']:,.0f} | {row['server_cpu_us_per_msg']:.1f} "
                     f"| {row['client_cpu_us_per_msg']:.1f} | {row['cores_busy']:.2f} |")
    redis = [r for r in rows if r["side"] == "redis"]
    if redis:
        lines += ["", "| nodes | ackbus / Redis |", "| ---: | ---: |"]
        lines += [f"| {r['nodes']} | {r['msgs_per_s'] / redis[0]['msgs_per_s']:.2f} |"
                  for r in rows if r["side"] == "ackbus"]
    return lines


def run_cluster_bench(nodes: int, *, quick: bool, peers: Sequence[str] = (), out_dir: Path | None = None,
                      say: Callable[[str], None] = lambda _text: None) -> tuple[str, dict[str, Any]]:
    """Run the workloads (the Redis side of the scale part with "redis" in ``peers``, the
    RabbitMQ side of the quorum part with "rabbitmq"); the report as
    Markdown, and the results (also written to ``out_dir/cluster-<time>.json``)."""
    params = QUICK if quick else FULL
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = (out_dir or Path(tempfile.gettempdir())) / f"cluster-{stamp}-logs"
    results: dict[str, Any] = {"nodes": nodes, "quick": quick, "peers": list(peers), "cpus": os.cpu_count(),
                               "params": dataclasses.asdict(params), "forwarding": {}, "scale": []}
    lines = [f"## Cluster (up to {nodes} node(s), {os.cpu_count()} CPU(s), {BODY} B bodies)", ""]
    if nodes >= 2:
        say("forwarding: through the owner and through another node")
        results["forwarding"] = fwd = forwarding(params, log_dir)
        lines += [f"Forwarding ({params.forward_count:,} messages each):", "",
                  "| path | msgs/s |", "| --- | ---: |"]
        lines += [f"| {name} | {rate:,.0f} |" for name, rate in fwd.items()]
        lines.append("")
    if "redis" in peers:
        say("scale: 8 publishers on one Redis")
        results["scale"].append(scale_redis(params, log_dir))
    for k in node_counts(nodes):
        say(f"scale: 8 publishers on {k} node(s)")
        results["scale"].append(scale_ackbus(k, params, log_dir))
    lines += [f"Scale: 8 queues, one pipelined publisher each (window {params.window}), {params.duration_s:g} s:", ""]
    lines += _scale_table(results["scale"])
    busy = max(r["cores_busy"] for r in results["scale"])
    if (os.cpu_count() or 1) < 2 * nodes or busy > 0.8 * (os.cpu_count() or 1):
        lines += ["", f"This machine has {os.cpu_count()} CPU(s) for up to {nodes} node(s) and 8 publisher "
                  f"processes, and the steps kept up to {busy:.1f} of them busy: the nodes and the clients share "
                  "the cores, so the total cannot grow with nodes here (flat is expected); run it on a machine "
                  "with a core per node and per client to see growth."]
    if nodes >= 3:
        quorum_lines, results["quorum"] = run_quorum_part(params, quick=quick, peers=peers, log_dir=log_dir, say=say)
        lines += ["", *quorum_lines]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"cluster-{stamp}.json").write_text(json.dumps(results, indent=1))
    return "\n".join(lines) + "\n", results

"""``scripts/bench --cluster N``: what forwarding between nodes costs, and how total
throughput grows with nodes (docs/benchmarks.md, "Cluster").

Each run starts a private etcd and the nodes with ``scripts/cluster up`` (into a
temporary directory) and stops them by PID with ``scripts/cluster down``. Two
workloads, pipelined publishes (a window of unconfirmed ones) and a consumer with a
prefetch, all through the client library, each client in a worker process of its
own:

- **forwarding**: one queue owned by node 1; publish then consume it through node 1
  (its owner) and through node 2 (which forwards each publish over its channel to
  node 1 and relays the consumer); the ratio is the forwarding cost. Needs N >= 2.
- **scale**: 8 queues placed ``balanced`` on k nodes, k = 1..N; one publisher per
  queue connected to that queue's owner, all at once; total published messages per
  second for each k. On a machine with fewer cores than nodes (the 2-core machine
  this was written on) the total cannot grow: say so when reading the numbers.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import client

__all__ = ["run_cluster_bench"]

ROOT = Path(__file__).resolve().parent.parent
QUEUES = 8


def _request(url: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


class Cluster:
    """``scripts/cluster up N`` in a temporary directory; stopped by ``down``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.dir = Path(tempfile.mkdtemp(prefix="ackbus-bench-cluster-"))
        self.urls: list[str] = []

    def __enter__(self) -> Cluster:
        done = subprocess.run(
            [str(ROOT / "scripts" / "cluster"), "up", str(self.count), "--dir", str(self.dir)],
            capture_output=True, text=True, timeout=180,
        )
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0].startswith("node-"):
                self.urls.append(parts[1])
        if done.returncode != 0 or len(self.urls) != self.count:
            self.__exit__()
            raise RuntimeError(f"scripts/cluster up {self.count} failed: {done.stderr.strip()[-500:]}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every node sees every other alive
            views = [_request(url, "GET", "/cluster") for url in self.urls]
            if all(sum(n["alive"] for n in v["nodes"]) == self.count for v in views):
                return self
            time.sleep(0.1)
        raise RuntimeError("the nodes did not all see one another within 30 s")

    def __exit__(self, *exc: object) -> None:
        subprocess.run([str(ROOT / "scripts" / "cluster"), "down", "--dir", str(self.dir)],
                       capture_output=True, timeout=120)


def _publish_worker(url: str, queue: str, count: int, window: int, out: Any) -> None:
    import trio

    async def main() -> None:
        async with client.connect(url) as conn, conn.channel(max_pending=window) as ch:
            body = b"x" * 100
            start = time.time()
            for _ in range(count):
                await ch.start_publish("", queue, body)
            await ch.wait_for_confirms(timeout_s=300)
            out.put(("publish", start, time.time()))

    trio.run(main)


def _consume_worker(url: str, queue: str, count: int, prefetch: int, out: Any) -> None:
    import trio

    async def main() -> None:
        async with client.connect(url) as conn, conn.channel() as ch:
            got = 0
            start = time.time()
            async with ch.consume(queue, prefetch=prefetch) as messages:
                async for message in messages:
                    await message.ack()
                    got += 1
                    if got == count:
                        break
            out.put(("consume", start, time.time()))

    trio.run(main)


def _run_workers(jobs: list[tuple[Any, tuple[Any, ...]]], timeout_s: float) -> tuple[float, float]:
    """Run the workers (a process each); (first start, last end), wall clock."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(*args, out)) for fn, args in jobs]
    for p in procs:
        p.start()
    spans: list[tuple[float, float]] = []
    try:
        for _ in procs:
            _what, start, end = out.get(timeout=timeout_s)
            spans.append((start, end))
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return min(s for s, _e in spans), max(e for _s, e in spans)


def _declare(url: str, queue: str, *, local: bool) -> str:
    args = {"x-queue-leader-locator": "client-local"} if local else {}
    return str(_request(url, "PUT", f"/queues/{queue}", {"arguments": args})["owner"])


def forwarding(count: int, window: int) -> dict[str, float]:
    """msgs/s through the owner and through another node."""
    with Cluster(2) as cluster:
        owner, other = cluster.urls
        _declare(owner, "fwd", local=True)
        result: dict[str, float] = {}
        for label, url in (("owner", owner), ("other node", other)):
            for what, worker in (("publish", _publish_worker), ("consume", _consume_worker)):
                start, end = _run_workers([(worker, (url, "fwd", count, window))], 600)
                result[f"{what} via {label}"] = count / (end - start)
        return result


def scale(nodes: int, count: int, window: int) -> float:
    """Total msgs/s published over 8 queues balanced on ``nodes`` nodes."""
    with Cluster(nodes) as cluster:
        by_name = {f"node-{i + 1}": url for i, url in enumerate(cluster.urls)}
        jobs = []
        for q in range(QUEUES):
            owner = _declare(cluster.urls[0], f"s{q}", local=False)
            jobs.append((_publish_worker, (by_name[owner], f"s{q}", count, window)))
        start, end = _run_workers(jobs, 600)
        return QUEUES * count / (end - start)


def run_cluster_bench(nodes: int, *, quick: bool) -> str:
    """Run both workloads; the report, as Markdown."""
    count, window = (200, 50) if quick else (20000, 500)
    lines = [f"## Cluster ({nodes} node(s) max, {os.cpu_count()} CPU(s), {count} messages per client)", ""]
    if nodes >= 2:
        fwd = forwarding(count, window)
        lines += ["| path | msgs/s |", "| --- | ---: |"]
        lines += [f"| {name} | {rate:,.0f} |" for name, rate in fwd.items()]
        lines.append("")
    lines += ["| nodes | total publish msgs/s over 8 queues |", "| ---: | ---: |"]
    for k in range(1, nodes + 1):
        lines.append(f"| {k} | {scale(k, count, window):,.0f} |")
    if (os.cpu_count() or 1) < 2 * nodes:
        lines += ["", f"This machine has {os.cpu_count()} CPU(s) for {nodes} node(s) and 8 publishers: "
                  "the total cannot grow with nodes here (flat is expected); run it on a machine with a "
                  "core per node and per client to see growth."]
    return "\n".join(lines) + "\n"

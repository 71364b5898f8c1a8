"""The quorum-queue part of ``scripts/bench --cluster N`` (N >= 3; docs/benchmarks.md,
"Cluster"): what replication costs, and how long a failover takes.

- **quorum vs classic**: pipelined confirmed publishes (the scale part's window), then
  a consumer acking each message (with a prefetch), on a 3-replica quorum queue
  (``x-queue-type: quorum``, ``x-quorum-initial-group-size: 3``) and on a classic
  queue owned by the quorum queue's leader, both through the leader's node: the same
  worker processes as the other parts. With ``--peer rabbitmq`` the same pika
  workload on a private three-node RabbitMQ cluster on this machine
  (``bench.rabbit_cluster``), a 3-replica quorum queue against a classic one, both
  through the quorum queue's leader (the node the declare came to). Should the
  cluster not form, on ONE RabbitMQ node instead (its quorum queue then has one
  replica), and the report says so.
- **failover**: one publisher (in this process, the client library under trio,
  connected to every node) publishes one message at a time to the quorum queue, each
  with a message id of its own, resending it until it is confirmed; the queue's
  leader is killed with SIGKILL K times (restarted each time, and the queue's in-sync
  set full again before the next kill). A failover time is fault -> the confirm of the
  first publish sent after the fault.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

import client
from bench.cluster_nodes import (
    ROOT,
    BenchFailed,
    Cluster,
    ClusterParams,
    _check_clean,
    _request,
)
from bench.procs import run_workers
from bench.rabbit_cluster import RabbitCluster
from bench.servers import RabbitServer, ServerError

__all__ = ["QUORUM_ARGS", "percentile", "quorum_tables", "run_quorum_part"]

QUORUM_ARGS: dict[str, Any] = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}
RABBIT_QUORUM_ARGS: dict[str, Any] = {"x-queue-type": "quorum"}
BODY = 100
FULL_KILLS = 5
QUICK_KILLS = 3
STEP_TIMEOUT_S = 90.0  # a failover, a restart, the in-sync set filling up: each bounded


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _workload(side: str, side_spec: dict[str, Any], queue: str, arguments: dict[str, Any] | None,
              params: ClusterParams, log_dir: Path) -> dict[str, Any]:
    """Publish ``forward_count`` pipelined, then consume + ack them all: msgs/s of each."""
    declare = {"queue_arguments": {queue: arguments}} if arguments else {}
    timeout = params.slack_s + params.forward_count / 1000
    (pub,) = run_workers(side, [{**side_spec, "op": "publish_pipelined", "queues": [queue], "routing_key": queue,
                                 "size": BODY, "window": params.window, "count": params.forward_count, **declare}],
                         log_dir=log_dir, ready_timeout_s=params.ready_timeout_s, run_timeout_s=timeout)
    (con,) = run_workers(side, [{**side_spec, "op": "consume", "queue": queue, "count": params.forward_count,
                                 "prefetch": params.prefetch}],
                         log_dir=log_dir, ready_timeout_s=params.ready_timeout_s, run_timeout_s=timeout)
    _check_clean([pub, con])
    return {"count": pub["count"], "publish_msgs_per_s": pub["count"] / pub["elapsed_s"],
            "consume_msgs_per_s": con["count"] / con["elapsed_s"]}


def _replication(url: str, queue: str) -> dict[str, Any]:
    return dict(_request(url, "GET", f"/queues/{queue}")["replication"])


def _leader(url: str, queue: str) -> str:
    """The queue's leader, once it has one and its in-sync set holds all 3 replicas."""
    found: list[str] = []

    def led() -> bool:
        replication = _replication(url, queue)
        found[:] = [replication["leader"]] if replication["leader"] else []
        return bool(found) and len(replication["in_sync"]) == 3

    _wait(f"{queue} led, with 3 replicas in sync", led)
    return found[0]


def _wait(what: str, check: Callable[[], bool], timeout_s: float = STEP_TIMEOUT_S) -> None:
    """Until ``check()`` holds (an error counts as not yet), or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise BenchFailed(f"{what}: not within {timeout_s:g} s")


class Nodes:
    """The cluster's nodes by name: which is alive, kill -9 one, start it again with
    the command line it had (its pid file updated, so ``scripts/cluster down`` stops it)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.urls = {f"node-{i + 1}": url for i, url in enumerate(cluster.urls)}
        self.pids = {f"node-{i + 1}": pid for i, pid in enumerate(cluster.pids)}
        self.restarted: list[subprocess.Popen[bytes]] = []

    def any_alive_url(self, but: str | None = None) -> str:
        return next(url for name, url in self.urls.items() if name != but)

    def kill9(self, name: str) -> list[str]:
        """SIGKILL the node; return its command line, to start it again."""
        pid = self.pids[name]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(pid, signal.SIGKILL)
        return [a.decode() for a in argv]

    def restart(self, name: str, argv: list[str]) -> None:
        with open(self.cluster.dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.restarted.append(proc)
        self.pids[name] = proc.pid
        (self.cluster.dir / f"{name}.pid").write_text(f"{proc.pid}\n")
        _wait(f"{name} answering again", lambda: _request(self.urls[name], "GET", "/healthz") is not None)

    def reap(self) -> None:
        """After ``scripts/cluster down``: collect the restarted processes' exit."""
        for proc in self.restarted:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


class FailoverPublisher:
    """Publishes one message at a time, each with its own message id, resending it
    until it is confirmed; keeps (first sent, confirmed) monotonic times of each."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.confirmed: list[tuple[float, float]] = []
        self.resends = 0
        self.last_error = ""

    async def run(self, urls: Sequence[str]) -> None:
        # every nack during a failover is expected (and resent): not a warning here
        logging.getLogger("ackbus.client").setLevel(logging.ERROR)
        body = b"x" * BODY
        async with client.connect(list(urls)) as conn, conn.channel() as ch:
            seq = 0
            while True:
                props = client.Properties(delivery_mode=2, message_id=f"failover-{seq}")
                first = time.monotonic()
                while True:
                    try:
                        await ch.publish("", self.queue, body, properties=props, timeout_s=2.0)
                        break
                    except (client.PublishFailed, client.ConfirmTimeout, client.ConnectionLost,
                            client.BrokerError) as exc:
                        self.resends += 1
                        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                        await trio.sleep(0.05)
                self.confirmed.append((first, time.monotonic()))
                seq += 1

    def first_confirm_after(self, fault: float) -> float | None:
        """The confirm time of the first publish first sent after ``fault``."""
        return next((done for sent, done in self.confirmed if sent > fault), None)


async def _failovers(nodes: Nodes, queue: str, kills: int, say: Callable[[str], None]) -> dict[str, Any]:
    publisher = FailoverPublisher(queue)
    times: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(publisher.run, list(nodes.urls.values()))
        for k in range(kills):
            before = len(publisher.confirmed)
            with trio.move_on_after(STEP_TIMEOUT_S) as waited:
                while len(publisher.confirmed) < before + 5:
                    await trio.sleep(0.05)
            if waited.cancelled_caught:
                raise BenchFailed("the failover publisher got no confirms")
            leader = await trio.to_thread.run_sync(_leader, nodes.any_alive_url(), queue)
            say(f"failover {k + 1}/{kills}: kill -9 {leader}, the leader")
            fault = time.monotonic()
            argv = nodes.kill9(leader)
            with trio.move_on_after(STEP_TIMEOUT_S) as waited:
                while (done := publisher.first_confirm_after(fault)) is None:
                    await trio.sleep(0.01)
            if waited.cancelled_caught or done is None:
                state = await trio.to_thread.run_sync(_replication, nodes.any_alive_url(but=leader), queue)
                raise BenchFailed(f"failover {k + 1}: no publish confirmed within {STEP_TIMEOUT_S:g} s of killing "
                                  f"{leader} ({publisher.resends} resends, the last after {publisher.last_error}; "
                                  f"the queue's replication: {state})")
            times.append(done - fault)
            await trio.to_thread.run_sync(nodes.restart, leader, argv)
            other = nodes.any_alive_url(but=leader)
            await trio.to_thread.run_sync(_wait, f"{queue}'s in-sync set full again after restarting {leader}",
                                          lambda: len(_replication(other, queue)["in_sync"]) == 3)
        nursery.cancel_scope.cancel()
    held = await trio.to_thread.run_sync(_depth_anywhere, nodes, queue)
    if held < len(publisher.confirmed):
        raise BenchFailed(f"{queue} holds {held} messages, {len(publisher.confirmed)} were confirmed")
    return {"kills": kills, "failover_s": times, "p50_s": percentile(times, 50), "p99_s": percentile(times, 99),
            "max_s": max(times), "confirmed": len(publisher.confirmed), "held": held, "resends": publisher.resends}


def _depth_anywhere(nodes: Nodes, queue: str) -> int:
    info = _request(nodes.any_alive_url(), "GET", f"/queues/{queue}")
    return int(info["messages_ready"]) + int(info.get("messages_unacked", 0))


def quorum_ackbus(params: ClusterParams, kills: int, log_dir: Path,
                  say: Callable[[str], None]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """On a 3-node cluster: the quorum and classic rows, then the failover figures."""
    nodes: Nodes | None = None
    try:
        with Cluster(3) as cluster:
            nodes = Nodes(cluster)
            _request(cluster.urls[0], "PUT", "/queues/qq", {"durable": True, "arguments": QUORUM_ARGS})
            leader = _leader(cluster.urls[0], "qq")
            url = nodes.urls[leader]
            _request(url, "PUT", "/queues/cq", {"durable": True,
                                                 "arguments": {"x-queue-leader-locator": "client-local"}})
            side = {"url": url, "ca_file": None}
            rows = []
            for label, queue, arguments in (("quorum, 3 replicas", "qq", QUORUM_ARGS), ("classic", "cq", None)):
                say(f"quorum: ackbus {label} queue, through the leader's node")
                rows.append({"side": "ackbus", "queue": label, **_workload("ackbus", side, queue, arguments,
                                                                           params, log_dir)})
            _request(url, "PUT", "/queues/fo", {"durable": True, "arguments": QUORUM_ARGS})
            _leader(url, "fo")
            try:
                failover = trio.run(_failovers, nodes, "fo", kills, say)
            except BaseException:  # keep the nodes' and etcd's logs: the directory goes with the cluster
                log_dir.mkdir(parents=True, exist_ok=True)
                for path in cluster.dir.glob("*.log"):
                    shutil.copyfile(path, log_dir / f"failover-{path.name}")
                raise
    finally:
        if nodes is not None:
            nodes.reap()  # after scripts/cluster down stopped them
    return rows, failover


def quorum_rabbitmq(params: ClusterParams, log_dir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """The same pika workload on a private three-node RabbitMQ cluster (one node if
    the cluster does not form): quorum queue, then classic."""
    workdir = Path(tempfile.mkdtemp(prefix="ackbus-bench-cluster-rabbitmq-"))
    cluster = RabbitCluster(workdir / "cluster")
    server: RabbitCluster | RabbitServer = cluster
    replicas = 3
    try:
        try:
            say("quorum: starting a three-node RabbitMQ cluster")
            cluster.start(timeout_s=max(params.slack_s, 120.0))
        except ServerError as exc:
            cluster.stop()
            say(f"quorum: the RabbitMQ cluster did not form ({str(exc).splitlines()[0]}); one RabbitMQ node instead")
            server, replicas = RabbitServer(workdir / "single"), 1
            server.start(timeout_s=params.slack_s)
        rows = []
        arguments = {**RABBIT_QUORUM_ARGS, "x-quorum-initial-group-size": replicas}
        for label, queue, args in ((f"quorum, {replicas} replica(s)", "qq", arguments), ("classic", "cq", None)):
            say(f"quorum: RabbitMQ {label} queue")
            rows.append({"side": "rabbitmq", "queue": label, "nodes": replicas,
                         **_workload("rabbitmq", server.client_spec(), queue, args, params, log_dir)})
        return rows
    finally:
        server.stop()
        if server is not cluster:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def quorum_tables(rows: Sequence[dict[str, Any]], failover: dict[str, Any], params: ClusterParams) -> list[str]:
    """The Markdown of the quorum part: throughput rows, then the failover times."""
    rabbit_nodes = max((int(r.get("nodes", 1)) for r in rows if r["side"] == "rabbitmq"), default=0)
    names = {"ackbus": "ackbus (3 nodes, via the leader)",
             "rabbitmq": "RabbitMQ (3 nodes, via the leader)" if rabbit_nodes == 3 else "RabbitMQ (one node)"}
    lines = [f"Quorum queues ({params.forward_count:,} messages each, window {params.window}, "
             f"prefetch {params.prefetch}):", "",
             "| server | queue | publish msgs/s | consume + ack msgs/s |", "| --- | --- | ---: | ---: |"]
    lines += [f"| {names[r['side']]} | {r['queue']} | {r['publish_msgs_per_s']:,.0f} | {r['consume_msgs_per_s']:,.0f} |"
              for r in rows]
    if rabbit_nodes == 1:
        lines += ["", "RabbitMQ ran as ONE node here (its three-node cluster did not form): its quorum "
                  "queue has one replica, so it shows the cost of its quorum machinery, not of replication."]
    lines += ["", f"Failover (kill -9 of the quorum queue's leader, {failover['kills']} times; fault -> confirm of "
              "the first publish sent after it):", "",
              "| kills | p50 s | p99 s | max s |", "| ---: | ---: | ---: | ---: |",
              f"| {failover['kills']} | {failover['p50_s']:.2f} | {failover['p99_s']:.2f} | {failover['max_s']:.2f} |"]
    return lines


def run_quorum_part(params: ClusterParams, *, quick: bool, peers: Sequence[str], log_dir: Path,
                    say: Callable[[str], None]) -> tuple[list[str], dict[str, Any]]:
    """The quorum part's Markdown lines and its results (``rows``, ``failover``)."""
    rows, failover = quorum_ackbus(params, QUICK_KILLS if quick else FULL_KILLS, log_dir, say)
    if "rabbitmq" in peers:
        rows += quorum_rabbitmq(params, log_dir, say)
    return quorum_tables(rows, failover, params), {"rows": rows, "failover": failover}

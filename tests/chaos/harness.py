"""A Jepsen-style fault test of quorum queues on one machine (``scripts/chaos``).

It starts a private etcd and N broker nodes on loopback (tests/support), declares a
3-replica quorum queue, and runs for the given time:

- **publishers** (threads), each sending numbered messages ``p<k>-<n>`` in order, one
  at a time, to whichever node leads the queue, with the message id equal to the body
  and ``mandatory`` (a node that stopped leading routes it nowhere: not a confirm);
  a message not confirmed (nack, 503, error) is sent again, same id, until confirmed
  or ``give_up_s`` passes; every attempt and every confirm is recorded;
- a **consumer** taking messages from the leader with REST gets (leases) and acking
  them, recording every delivery and its ``redelivered`` flag;
- a **nemesis** injecting one fault at a time: ``kill`` (kill -9 the leader, restarted
  once its lease lapsed), ``kill-follower``, ``pause`` (SIGSTOP the leader past its
  lease, then SIGCONT), ``wipe`` (kill -9 a follower, delete its data directory,
  restart it empty).

Then it heals (every node running), drains the queue, and checks the whole history
(:func:`check`): every confirmed publish delivered at least once (lost must be 0); a
message delivered twice only as a marked redelivery; per publisher, the first
deliveries in publish order; and the time from each fault to the next confirm.

Faults are loopback-only: kills, pauses and wiped directories. Network partitions
(namespaces, nftables) and clock jumps are not injected here (see docs/cluster.md).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.broker import BrokerProcess, free_port, request
from tests.support.etcd import EtcdProcess

QUEUE = "chaos"
KINDS = ("kill", "kill-follower", "pause", "wipe")


@dataclass
class History:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: body -> time of its confirm
    confirmed: dict[str, float] = field(default_factory=dict)
    #: bodies whose publisher gave up (never confirmed)
    abandoned: list[str] = field(default_factory=list)
    attempts: int = 0
    nacks: int = 0
    #: "status reason" -> how many publishes were refused so
    refusals: dict[str, int] = field(default_factory=dict)
    #: (time, body, redelivered)
    deliveries: list[tuple[float, str, bool]] = field(default_factory=list)
    #: (time, kind, node)
    faults: list[tuple[float, str, str]] = field(default_factory=list)


class Cluster:
    """etcd and the broker nodes, started and stopped by PID (tests/support)."""

    def __init__(self, directory: Path, nodes: int, ttl_s: int) -> None:
        self.dir = directory
        self.ttl_s = ttl_s
        self.etcd = EtcdProcess(directory / "etcd")
        self.nodes: dict[str, BrokerProcess] = {}
        self.paused: set[str] = set()
        for i in range(nodes):
            port = free_port()
            name = f"n{i + 1}"
            self.nodes[name] = BrokerProcess(
                directory / name,
                port=port,
                args=(
                    "--etcd", self.etcd.url,
                    "--node-name", name,
                    "--advertise-url", f"http://127.0.0.1:{port}",
                    "--cluster-lease-ttl-s", str(ttl_s),
                ),
            )

    def start(self) -> None:
        self.etcd.start()
        for node in self.nodes.values():
            node.start()

    def stop(self) -> None:
        for name in list(self.paused):
            self.resume(name)
        for node in self.nodes.values():
            node.stop()
        self.etcd.stop()

    def alive(self, name: str) -> bool:
        proc = self.nodes[name].proc
        return proc is not None and proc.poll() is None and name not in self.paused

    def status(self) -> dict[str, Any] | None:
        """The queue's replication as some live node sees it."""
        for name in random.sample(list(self.nodes), len(self.nodes)):
            if not self.alive(name):
                continue
            try:
                status, body = request(self.nodes[name].port, "GET", "/cluster", timeout_s=2)
            except OSError:
                continue
            if status == 200:
                return dict(body.get("replicated_queues", {}).get(QUEUE) or {})
        return None

    def leader(self) -> BrokerProcess | None:
        info = self.status()
        name = info.get("leader") if info else None
        return self.nodes[name] if name in self.nodes and self.alive(name) else None

    def pause(self, name: str) -> None:
        proc = self.nodes[name].proc
        if proc is not None:
            os.kill(proc.pid, signal.SIGSTOP)
            self.paused.add(name)

    def resume(self, name: str) -> None:
        proc = self.nodes[name].proc
        if proc is not None and name in self.paused:
            os.kill(proc.pid, signal.SIGCONT)
        self.paused.discard(name)

    def restart_when_free(self, name: str, *, wipe: bool = False) -> None:
        """Start a killed node again once its lease lapsed (its name is free)."""
        node = self.nodes[name]
        if wipe:
            shutil.rmtree(node.data_dir, ignore_errors=True)
        deadline = time.monotonic() + self.ttl_s + 30
        while time.monotonic() < deadline:
            try:
                node.start(timeout_s=30)
                return
            except RuntimeError:
                time.sleep(0.5)  # the name was still held: try again


def publisher(cluster: Cluster, history: History, k: int, stop: threading.Event, give_up_s: float) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        body = f"p{k}-{n}"
        first = time.monotonic()
        while not stop.is_set():
            leader = cluster.leader()
            if leader is not None:
                with history.lock:
                    history.attempts += 1
                try:
                    status, answer = request(
                        leader.port, "POST", f"/exchanges/amq.default/publish?routing_key={QUEUE}&mandatory=true", body.encode(),
                        headers={"X-Message-Id": body}, timeout_s=10,
                    )
                except OSError:
                    status, answer = 0, None
                # mandatory: a node that no longer holds the queue answers 404 no_route
                # (not an ack of a message routed nowhere); routed 0 with 200 is a
                # resend deduplicated by its message id (taken before)
                if status == 200 and isinstance(answer, dict) and answer.get("confirm") == "ack":
                    with history.lock:
                        history.confirmed[body] = time.time()
                    break
                with history.lock:
                    history.nacks += 1
                    why = answer.get("reason") or answer.get("error") if isinstance(answer, dict) else "no answer"
                    history.refusals[f"{status} {why}"] = history.refusals.get(f"{status} {why}", 0) + 1
            if time.monotonic() - first > give_up_s:
                with history.lock:
                    history.abandoned.append(body)
                break
            time.sleep(0.1)


def consumer(cluster: Cluster, history: History, stop: threading.Event) -> None:
    while not stop.is_set():
        leader = cluster.leader()
        if leader is None:
            time.sleep(0.1)
            continue
        try:
            status, got = request(leader.port, "POST", f"/queues/{QUEUE}/get?max=50&lease=5&wait=0.5", timeout_s=5)
            if status != 200:
                time.sleep(0.1)
                continue
            messages = got.get("messages") or []
            now = time.time()
            with history.lock:
                for m in messages:
                    history.deliveries.append((now, m.get("body", ""), bool(m.get("redelivered"))))
            if messages:
                request(leader.port, "POST", f"/queues/{QUEUE}/ack", {"lease_ids": [m["lease_id"] for m in messages]}, timeout_s=5)
        except OSError:
            time.sleep(0.1)


def nemesis(cluster: Cluster, history: History, stop: threading.Event, every_s: float, rng: random.Random) -> None:
    while not stop.wait(every_s):
        info = cluster.status() or {}
        leader = info.get("leader")
        followers = [n for n in info.get("replicas", []) if n != leader and cluster.alive(n)]
        kind = rng.choice(KINDS)
        if kind in ("kill-follower", "wipe") and not followers:
            kind = "kill"
        target = leader if kind in ("kill", "pause") else rng.choice(followers)
        if target is None or not cluster.alive(target):
            continue
        with history.lock:
            history.faults.append((time.time(), kind, target))
        if kind == "pause":
            cluster.pause(target)
            stop.wait(cluster.ttl_s + 2)
            cluster.resume(target)
        else:
            cluster.nodes[target].kill()
            cluster.restart_when_free(target, wipe=kind == "wipe")


def run(directory: Path, minutes: float, nodes: int = 3, publishers: int = 2, seed: int = 1, ttl_s: int = 3) -> dict[str, Any]:
    """Start a cluster, run the workload and the nemesis for ``minutes``, heal, drain,
    and return the checker's findings."""
    rng = random.Random(seed)
    cluster = Cluster(directory, nodes, ttl_s)
    history = History()
    stop = threading.Event()
    try:
        cluster.start()
        first = next(iter(cluster.nodes.values()))
        status, body = request(first.port, "PUT", f"/queues/{QUEUE}", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
        assert status == 201, body
        deadline = time.monotonic() + 30
        while cluster.leader() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = [threading.Thread(target=publisher, args=(cluster, history, k, stop, 30.0), daemon=True) for k in range(publishers)]
        workers.append(threading.Thread(target=consumer, args=(cluster, history, stop), daemon=True))
        chaos_stop = threading.Event()
        chaos = threading.Thread(target=nemesis, args=(cluster, history, chaos_stop, max(5.0, ttl_s * 3.0), rng), daemon=True)
        for t in workers:
            t.start()
        chaos.start()
        time.sleep(minutes * 60)
        chaos_stop.set()
        chaos.join(timeout=120)
        for name in cluster.nodes:  # heal
            cluster.resume(name)
            proc = cluster.nodes[name].proc
            if proc is None or proc.poll() is not None:
                cluster.restart_when_free(name)
        time.sleep(ttl_s)
        stop.set()
        for t in workers:
            t.join(timeout=60)
        drain(cluster, history)
        (directory / "history.json").write_text(
            json.dumps(
                {
                    "confirmed": history.confirmed,
                    "abandoned": history.abandoned,
                    "deliveries": history.deliveries,
                    "faults": history.faults,
                }
            )
        )
        return check(history)
    finally:
        stop.set()
        cluster.stop()


def drain(cluster: Cluster, history: History, quiet_s: float = 8.0, limit_s: float = 120.0) -> None:
    """Consume until the queue stays empty for ``quiet_s`` (longer than the consumer's
    5 s leases: a get whose answer was lost gives its messages back by then)."""
    deadline = time.monotonic() + limit_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_s:
        before = len(history.deliveries)
        leader = cluster.leader()
        if leader is not None:
            try:
                status, got = request(leader.port, "POST", f"/queues/{QUEUE}/get?max=500&lease=60", timeout_s=5)
            except OSError:
                status, got = 0, {}
            messages = got.get("messages") or [] if status == 200 else []
            now = time.time()
            for m in messages:
                history.deliveries.append((now, m.get("body", ""), bool(m.get("redelivered"))))
            if messages:
                request(leader.port, "POST", f"/queues/{QUEUE}/ack", {"lease_ids": [m["lease_id"] for m in messages]}, timeout_s=5)
        if len(history.deliveries) != before:
            quiet_since = time.monotonic()
        time.sleep(0.2)


def check(history: History) -> dict[str, Any]:
    """The checker over the whole history (see the module docstring)."""
    delivered: dict[str, list[bool]] = {}
    for _t, body, redelivered in history.deliveries:
        delivered.setdefault(body, []).append(redelivered)
    lost = sorted(b for b in history.confirmed if b not in delivered)
    unmarked = sorted(b for b, flags in delivered.items() if len(flags) > 1 and not all(flags[1:]))
    marked = sum(len(flags) - 1 for flags in delivered.values() if len(flags) > 1 and all(flags[1:]))
    order_violations = 0
    last: dict[str, int] = {}
    for _t, body, redelivered in history.deliveries:
        if redelivered or "-" not in body:
            continue
        who, n = body.rsplit("-", 1)
        if int(n) < last.get(who, 0):
            order_violations += 1
        last[who] = max(last.get(who, 0), int(n))
    failovers = []
    confirms = sorted(history.confirmed.values())
    for at, kind, _node in history.faults:
        later = [c for c in confirms if c > at]
        if later:
            failovers.append((kind, later[0] - at))
    by_kind: dict[str, int] = {}
    for _at, kind, _node in history.faults:
        by_kind[kind] = by_kind.get(kind, 0) + 1
    leader_times = sorted(s for k, s in failovers if k in ("kill", "pause"))
    return {
        "faults": by_kind,
        "faults_total": len(history.faults),
        "publish_attempts": history.attempts,
        "nacks_or_errors": history.nacks,
        "refusals": dict(sorted(history.refusals.items(), key=lambda kv: -kv[1])[:5]),
        "confirmed": len(history.confirmed),
        "abandoned": len(history.abandoned),
        "delivered_distinct": len(delivered),
        "lost": len(lost),
        "lost_examples": lost[:10],
        "redeliveries_marked": marked,
        "duplicates_unmarked": len(unmarked),
        "duplicates_unmarked_examples": unmarked[:10],
        "order_violations": order_violations,
        "failover_p50_s": round(statistics.median(leader_times), 2) if leader_times else None,
        "failover_p99_s": round(_p99(leader_times), 2) if leader_times else None,
        "failover_max_s": round(max(leader_times), 2) if leader_times else None,
    }


def _p99(values: list[float]) -> float:
    return values[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))]


def table(result: dict[str, Any]) -> str:
    """The findings as a two-column table."""
    width = max(len(k) for k in result)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in result.items())

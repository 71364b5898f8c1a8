"""Changing a quorum queue's replica set (``POST /queues/{q}/replicas``,
broker/cluster/replica_set.py) while publishing: a fourth node added catches up and
joins the in-sync set, the leader removed steps down and another takes over, nothing
confirmed is lost; the refusals; and a forgotten node leaving the replica sets it was
in (real etcd, real broker subprocesses on loopback)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster.conftest import TTL_S, cluster_nodes, wait_for
from tests.cluster.test_replication import (
    QUORUM,
    bodies,
    leader_of,
    publish,
    replication,
)
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]


class Publisher:
    """Publishes numbered messages (``message_id`` = body) one at a time through the
    given nodes in turn, each resent until confirmed, until stopped."""

    def __init__(self, targets: list[BrokerProcess], queue: str) -> None:
        self.targets = targets
        self.queue = queue
        self.confirmed: list[str] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        i = 0
        turn = 0
        deadline = time.monotonic() + 300  # (bounded, whatever happens)
        while not self._stop.is_set() and time.monotonic() < deadline:
            body = f"m{i}"
            node = self.targets[turn % len(self.targets)]
            turn += 1
            try:
                status, answer = node.request(
                    "POST", f"/exchanges/amq.default/publish?routing_key={self.queue}&mandatory=true", body.encode(),
                    headers={"X-Message-Id": body}, timeout_s=15,
                )
            except OSError:
                status, answer = 0, None
            if status == 200 and isinstance(answer, dict) and answer.get("confirm") == "ack":
                self.confirmed.append(body)
                i += 1
            else:
                self.failures += 1  # resent (deduplicated by its message id)
                self._stop.wait(0.05)  # (paces the retries of a refused publish)

    def wait_more(self, count: int, timeout_s: float = 30.0) -> None:
        start = len(self.confirmed)
        wait_for(f"{count} more confirms", lambda: len(self.confirmed) >= start + count, timeout_s=timeout_s)


def _change(node: BrokerProcess, queue: str, **body: Any) -> tuple[int, Any]:
    return node.request("POST", f"/queues/{queue}/replicas", body, timeout_s=30)


def test_a_fourth_node_joins_then_the_leader_leaves_while_publishing_and_nothing_is_lost(nodes: Nodes) -> None:
    three = {name: nodes(name) for name in ("a", "b", "c")}
    a = three["a"]
    wait_for("three members", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 3)
    status, body = a.request("PUT", "/queues/q", QUORUM)
    assert status == 201, body
    leader = leader_of(three, "q")
    old = next(n for n, p in three.items() if p is leader)
    d = nodes("d")
    wait_for("d a member", lambda: cluster_nodes(a).get("d", {}).get("alive"))
    everyone = {**three, "d": d}
    with Publisher([p for n, p in everyone.items() if n != old], "q") as publisher:
        publisher.wait_more(20)
        # 3 -> 4: d starts out of the in-sync set and joins it once caught up
        status, answer = _change(a, "q", add="d")
        assert status == 200, answer
        assert answer["replicas"] == ["a", "b", "c", "d"] and "d" not in answer["in_sync"], answer
        wait_for(
            "d caught up and in sync",
            lambda: (lambda r: "d" in r["in_sync"] and r["lag"].get("d") == 0)(replication(leader, "q")),
            timeout_s=30,
        )
        assert replication(d, "q")["local"]["role"] == "follower"
        publisher.wait_more(20)
        # the leader leaves: it steps down, another in-sync replica leads
        status, answer = _change(d, "q", remove=old)
        assert status == 200 and answer["leader_stepped_down"] is True, answer
        assert old not in answer["replicas"] and old not in answer["in_sync"], answer
        rest = {n: p for n, p in everyone.items() if n != old}
        new = leader_of(rest, "q", not_=old)
        publisher.wait_more(20, timeout_s=TTL_S * 4 + 30)
        assert "local" not in replication(leader, "q")  # the old leader keeps no copy
        assert sorted(replication(new, "q")["replicas"]) == sorted(rest)
    print(f"confirmed {len(publisher.confirmed)}, refused or unanswered (resent) {publisher.failures}")
    assert publisher.confirmed
    got: list[str] = []
    wait_for(
        "every confirmed message",
        lambda: got.extend(bodies(new.drain("q"))) or set(publisher.confirmed) <= set(got),
        timeout_s=30,
    )
    lost = set(publisher.confirmed) - set(got)
    assert not lost, sorted(lost)


def test_refused_changes_say_why(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("two members", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 2)
    assert a.request("PUT", "/queues/q", {"durable": True, "arguments": {"x-queue-type": "quorum", "x-quorum-initial-group-size": 1}})[0] == 201
    assert a.request("PUT", "/queues/classic", {})[0] == 201
    (only,) = replication(a, "q")["replicas"]
    # b answers from its own view of the cluster, which learns of q through its watch
    wait_for("b to see q", lambda: b.request("GET", "/queues/q")[0] == 200)
    wait_for("b to see classic", lambda: b.request("GET", "/queues/classic")[0] == 200)
    other = "b" if only == "a" else "a"
    cases = [
        ({"add": "nobody"}, 404, "not_found"),
        ({"add": only}, 409, "already_replica"),
        ({"remove": other}, 404, "not_found"),
        ({"remove": only}, 409, "last_replica"),
        ({}, 400, "invalid_argument"),
        ({"add": other, "remove": only}, 400, "invalid_argument"),
        ({"add": 3}, 400, "invalid_argument"),
    ]
    for body, status, code in cases:
        got, answer = _change(b, "q", **body)
        assert (got, answer.get("error")) == (status, code), (body, answer)
        assert answer.get("message")
    status, answer = _change(a, "classic", add="b")
    assert status == 409 and answer["error"] == "not_replicated", answer
    status, answer = _change(a, "nosuch", add="b")
    assert status == 404, answer
    assert replication(a, "q")["replicas"] == [only]  # nothing changed
    # the CLI: a second replica added to a one-replica queue catches up and joins
    leader = a if only == "a" else b
    out = _cli(b, "queue", "replicas", "q", "--add", other)
    assert f"added {other}" in out and f"replicas {only}, {other}" in out, out
    wait_for(f"{other} in sync", lambda: other in replication(leader, "q")["in_sync"], timeout_s=30)
    status, answer = publish(leader, "q", "after the add")
    assert status == 200 and answer["confirm"] == "ack", answer
    table = _cli(a, "queue", "replicas", "q")
    assert f"leader {only}" in table and len([line for line in table.splitlines() if " yes " in line]) == 2, table


def _cli(node: BrokerProcess, *argv: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "client", "--url", f"http://127.0.0.1:{node.port}", "--timeout", "20", *argv],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return proc.stdout


def test_a_forgotten_node_leaves_the_replica_sets_it_was_in(nodes: Nodes) -> None:
    procs = {name: nodes(name) for name in ("a", "b", "c")}
    a = procs["a"]
    wait_for("three members", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 3)
    assert a.request("PUT", "/queues/q", QUORUM)[0] == 201
    leader = leader_of(procs, "q")
    gone = next(n for n, p in procs.items() if p is not leader)
    for i in range(5):
        status, answer = publish(leader, "q", f"m{i}", f"m{i}")
        assert status == 200 and answer["confirm"] == "ack", answer
    procs[gone].kill()
    wait_for(f"{gone} dead", lambda: not cluster_nodes(leader)[gone]["alive"], timeout_s=TTL_S + 10)
    status, answer = leader.request("DELETE", f"/cluster/nodes/{gone}")
    assert status == 200, answer
    assert gone not in answer["replica_sets"]["q"] and len(answer["replica_sets"]["q"]) == 2, answer
    wait_for("the queue on two replicas", lambda: sorted(replication(leader, "q")["replicas"]) == sorted(answer["replica_sets"]["q"]))
    status, answer = publish(leader, "q", "after", "after")
    assert status == 200 and answer["confirm"] == "ack", answer
    got = bodies(leader.drain("q"))
    assert sorted(got) == sorted([f"m{i}" for i in range(5)] + ["after"])

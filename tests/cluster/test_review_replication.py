"""Behaviours of quorum queues a review found untested, on real etcd and broker
processes (loopback): a message the leader holds below its majority is hidden from
consumers until committed; a replica taken out of a queue's replica set, or a deleted
queue, leaves no replica log file behind on its node."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from broker.cluster.replica_log import replica_log_path
from tests.cluster.conftest import TTL_S, cluster_nodes, wait_for, wait_synced
from tests.cluster.test_replication import (
    QUORUM,
    Nodes,
    bodies,
    leader_of,
    publish,
    replication,
)
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow


def _three(nodes: Nodes) -> dict[str, BrokerProcess]:
    started = {name: nodes(name) for name in ("a", "b", "c")}
    wait_for("three members", lambda: sum(n["alive"] for n in cluster_nodes(started["a"]).values()) == 3)
    return started


def _declare(node: BrokerProcess, queue: str) -> None:
    status, body = node.request("PUT", f"/queues/{queue}", QUORUM)
    assert status == 201, body


def _get_now(node: BrokerProcess, queue: str) -> list[str]:
    status, got = node.request("POST", f"/queues/{queue}/get?max=10&wait=0")
    assert status == 200, got
    return bodies(got["messages"])


def test_a_message_below_its_majority_is_hidden_from_consumers_until_committed(nodes: Nodes) -> None:
    three = _three(nodes)
    _declare(three["a"], "q")
    leader = leader_of(three, "q")
    status, answer = publish(leader, "q", "committed")
    assert status == 200 and answer["confirm"] == "ack", answer
    followers = [p for p in three.values() if p is not leader]
    wait_for("followers caught up", lambda: set(replication(leader, "q")["lag"].values()) == {0})
    assert _get_now(leader, "q") == ["committed"]  # (leased: out of the way)
    answers: list[tuple[int, Any]] = []
    publisher = threading.Thread(target=lambda: answers.append(publish(leader, "q", "pending")), daemon=True)
    for f in followers:
        assert f.proc is not None
        os.kill(f.proc.pid, signal.SIGSTOP)
    try:
        publisher.start()
        # the leader has it (its log grew) but no follower can take it: not committed
        end = wait_for(
            "the publish in the leader's log",
            lambda: (lambda r: r["local"]["log_end"] if r["local"]["log_end"] > r["commit_offset"] else 0)(
                replication(leader, "q")
            ),
        )
        for _ in range(5):  # a few looks while it stays uncommitted: never handed out
            assert _get_now(leader, "q") == []
            info = replication(leader, "q")
            assert info["commit_offset"] < end, info
    finally:
        for f in followers:
            assert f.proc is not None
            os.kill(f.proc.pid, signal.SIGCONT)
    # the followers fetch it: committed, then delivered (whatever its confirm said
    # meanwhile: held past ``lag_s`` it is nacked but kept)
    got = wait_for("the message once committed", lambda: _get_now(leader, "q"), timeout_s=TTL_S * 4 + 10)
    assert got == ["pending"]
    assert replication(leader, "q")["commit_offset"] >= end
    publisher.join(timeout=20)
    assert answers and answers[0][0] in (200, 503), answers


def _log_file(node: BrokerProcess, queue: str) -> Path:
    return replica_log_path(node.data_dir, queue)


def test_a_removed_replica_and_a_deleted_queue_leave_no_replica_log_file(nodes: Nodes) -> None:
    three = _three(nodes)
    a = three["a"]
    _declare(a, "q")
    leader = leader_of(three, "q")
    _ack = publish(leader, "q", "m")
    assert _ack[0] == 200 and _ack[1]["confirm"] == "ack", _ack
    for name, node in three.items():
        wait_for(f"{name}'s replica log file", lambda node=node: _log_file(node, "q").exists())
    # a follower taken out of the replica set deletes its copy
    gone = next(n for n, p in three.items() if p is not leader)
    status, answer = a.request("POST", "/queues/q/replicas", {"remove": gone})
    assert status == 200, answer
    wait_for(f"{gone}'s replica log file deleted", lambda: not _log_file(three[gone], "q").exists())
    assert "local" not in replication(three[gone], "q")
    rest = [p for n, p in three.items() if n != gone]
    assert all(_log_file(p, "q").exists() for p in rest)
    # the queue deleted: every replica deletes its copy
    status, answer = a.request("DELETE", "/queues/q")
    assert status in (200, 204), answer
    for name, node in three.items():
        wait_for(f"{name}'s replica log file deleted with the queue", lambda node=node: not _log_file(node, "q").exists())


def test_a_replica_down_while_its_queue_is_deleted_deletes_its_log_file_when_it_returns(nodes: Nodes) -> None:
    three = _three(nodes)
    _declare(three["a"], "q")
    leader = leader_of(three, "q")
    status, answer = publish(leader, "q", "old")
    assert status == 200 and answer["confirm"] == "ack", answer
    down_name = next(n for n, p in three.items() if p is not leader)
    down = three[down_name]
    wait_for(f"{down_name} caught up", lambda: replication(leader, "q")["lag"].get(down_name) == 0)
    assert _log_file(down, "q").exists()
    down.stop()
    wait_for(f"{down_name} shown gone", lambda: not cluster_nodes(leader)[down_name]["alive"], timeout_s=TTL_S + 10)
    status, answer = leader.request("DELETE", "/queues/q")
    assert status in (200, 204), answer
    down.start()
    wait_synced(down)
    wait_for(f"{down_name} back", lambda: cluster_nodes(leader)[down_name]["alive"])
    wait_for(f"{down_name}'s stale replica log file deleted", lambda: not _log_file(down, "q").exists())

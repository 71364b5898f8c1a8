"""Schedules kept in etcd and fired by one node at a time: every tick once, to a
queue on another node, through the runner's death (real etcd, real brokers)."""

from __future__ import annotations

import datetime
from collections.abc import Callable

import pytest

from tests.cluster.conftest import TTL_S, cluster_nodes, wait_for
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]


def _runner(nodes: list[BrokerProcess]) -> BrokerProcess | None:
    for node in nodes:
        status, info = node.request("GET", "/schedules/beat")
        if status == 200 and info["runner"]:
            return node
    return None


def _ticks(info_node: BrokerProcess, queue: str) -> list[str]:
    return [m["properties"]["headers"]["x-schedule-tick"] for m in info_node.drain(queue)]


def test_a_schedule_fires_each_tick_once_through_its_runners_death(nodes: Nodes) -> None:
    a, b, c = nodes("a"), nodes("b"), nodes("c")
    everyone = [a, b, c]
    wait_for("three alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 3)
    status, info = b.request("PUT", "/schedules/beat", {"routing_key": "beats", "body": "tick", "interval_s": 1, "missed": "all"})
    assert status == 200 and info["kind"] == "interval", info
    assert c.request("GET", "/schedules")[1]["schedules"][0]["name"] == "beat"  # in etcd: any node lists it
    runner = wait_for("a runner", lambda: _runner(everyone))
    owner = next(n for n in everyone if n is not runner)  # the queue must outlive the runner
    status, _ = owner.request("PUT", "/queues/beats", {"arguments": {"x-queue-leader-locator": "client-local"}})
    assert status == 201
    wait_for("three ticks", lambda: (owner.request("GET", "/queues/beats")[1].get("messages_ready") or 0) >= 3)
    runner.kill()
    survivors = [n for n in everyone if n is not runner]
    wait_for("runner dead", lambda: not cluster_nodes(survivors[0])[_name(runner, survivors[0])]["alive"], timeout_s=TTL_S + 8)
    new_runner = wait_for("another runner", lambda: _runner(survivors), timeout_s=TTL_S + 10)
    assert new_runner is not runner
    before = owner.request("GET", "/queues/beats")[1]["messages_ready"]
    wait_for("ticks go on", lambda: owner.request("GET", "/queues/beats")[1]["messages_ready"] >= before + 3)
    assert owner.request("POST", "/schedules/beat/pause")[1]["paused"] is True
    ticks = _ticks(owner, "beats")
    assert len(ticks) == len(set(ticks)), ticks  # no tick twice
    times = [datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() for t in ticks]
    assert times == sorted(times)
    gaps = [round(b - a) for a, b in zip(times, times[1:])]
    # missed: all: every second is there, the ones while no node ran them included
    # (a message whose queue's owner was not the dead runner cannot be lost)
    assert set(gaps) == {1}, gaps


def _name(node: BrokerProcess, asker: BrokerProcess) -> str:
    return next(n["name"] for n in cluster_nodes(asker).values() if n["url"] == node.url)

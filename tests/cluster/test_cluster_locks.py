"""Locks held in etcd: one holder for the whole cluster whichever node is asked,
fencing tokens that only grow, through a node's death (real etcd, real brokers)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster.conftest import cluster_nodes, wait_for
from tests.support.broker import BrokerProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]


def test_one_holder_for_the_cluster_and_tokens_that_only_grow(nodes: Nodes) -> None:
    a, b, c = nodes("a"), nodes("b"), nodes("c")
    wait_for("three alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 3)
    status, held = a.request("POST", "/locks/job/acquire", {"owner": "x", "ttl_s": 30})
    assert status == 200 and held["owner"] == "x" and held["held"] is True, held
    t1 = held["token"]
    status, busy = b.request("POST", "/locks/job/acquire", {"owner": "y"})
    assert status == 409 and busy["error"] == "lock_held" and busy["lock"]["owner"] == "x", busy
    status, refreshed = c.request("POST", "/locks/job/refresh", {"owner": "x", "token": t1, "ttl_s": 10})
    assert status == 200 and refreshed["token"] == t1 and refreshed["ttl_s"] == 10
    status, wrong = c.request("POST", "/locks/job/release", {"owner": "y", "token": t1})
    assert status == 409 and wrong["error"] == "not_lock_holder"
    assert [lock["owner"] for lock in b.request("GET", "/locks")[1]["locks"]] == ["x"]
    assert b.request("POST", "/locks/job/release", {"owner": "x", "token": t1})[0] == 200
    assert a.request("GET", "/locks/job")[1]["held"] is False
    # a channel on another node takes it next: a larger token
    ch = RawChannel(c.port)
    try:
        ch.send({"op": "lock_acquire", "lock": "job", "owner": "y", "ttl_s": 2, "id": 1})
        ev = ch.next_event()
        assert ev["ev"] == "ok" and ev["lock"]["owner"] == "y", ev
        t2 = ev["lock"]["token"]
        assert t2 > t1
    finally:
        ch.close()
    # y's node dies and y never refreshes: the lock lapses with its TTL, and z on
    # another node, waiting, gets it with a larger token still
    c.kill()
    status, granted = a.request("POST", "/locks/job/acquire", {"owner": "z", "ttl_s": 5, "wait_s": 10})
    assert status == 200 and granted["owner"] == "z" and granted["token"] > t2, granted
    # the holder acquiring again keeps its token
    status, again = b.request("POST", "/locks/job/acquire", {"owner": "z", "ttl_s": 5})
    assert status == 200 and again["token"] == granted["token"]


def test_a_channel_waiting_for_a_cluster_lock_goes_on_with_its_other_ops(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("two alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 2)
    status, held = a.request("POST", "/locks/l/acquire", {"owner": "x", "ttl_s": 30})
    assert status == 200
    ch = RawChannel(b.port)
    try:
        ch.send({"op": "lock_acquire", "lock": "l", "owner": "y", "wait_s": 20, "id": "wait"},
                {"op": "declare_exchange", "exchange": "amq.direct", "passive": True, "id": "barrier"})
        first = ch.next_event()
        assert first["ev"] == "ok" and first["id"] == "barrier", first  # not held up by the wait
        assert a.request("POST", "/locks/l/release", {"owner": "x", "token": held["token"]})[0] == 200
        granted = ch.next_event()
        assert granted["ev"] == "ok" and granted["id"] == "wait" and granted["lock"]["owner"] == "y", granted
        assert granted["lock"]["token"] > held["token"]
    finally:
        ch.close()

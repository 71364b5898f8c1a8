"""A node gone for good: ``DELETE /cluster/nodes/{name}`` refuses a live node, and
forgets a dead one, deleting its queues or rehoming them empty, saying what was lost
according to its last report (real etcd, real broker subprocesses)."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Callable

import pytest

from tests.cluster.conftest import TTL_S, cluster_nodes, wait_for, wait_synced
from tests.support.broker import BrokerProcess
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]


def _reported(etcd: EtcdProcess, node: str) -> dict[str, int] | None:
    """The queue depths ``node`` last reported to etcd."""
    body = json.dumps({"key": base64.b64encode(f"/ackbus/stats/{node}".encode()).decode()}).encode()
    with urllib.request.urlopen(urllib.request.Request(etcd.url + "/v3/kv/range", data=body), timeout=5) as answer:
        kvs = json.loads(answer.read()).get("kvs") or []
    return json.loads(base64.b64decode(kvs[0]["value"]))["queues"] if kvs else None


def test_a_dead_node_is_forgotten_and_its_queues_deleted_or_rehomed(nodes: Nodes, etcd: EtcdProcess) -> None:
    a, b, c = nodes("a"), nodes("b"), nodes("c")
    wait_for("three alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 3)
    for q in ("keep", "drop"):
        status, _ = c.request("PUT", f"/queues/{q}", {"arguments": {"x-queue-leader-locator": "client-local"}})
        assert status == 201
    assert a.request("PUT", "/exchanges/x", {"type": "fanout"})[0] == 201
    assert a.request("POST", "/bindings", {"exchange": "x", "queue": "drop"})[0] == 201
    for i in range(4):
        assert a.request("POST", "/exchanges/amq.default/publish?routing_key=keep", f"k{i}".encode())[0] == 200
    assert a.request("POST", "/exchanges/amq.default/publish?routing_key=drop", b"d")[0] == 200
    status, err = a.request("DELETE", "/cluster/nodes/c")
    assert status == 409 and err["error"] == "node_alive", err
    wait_for("c reported its depths", lambda: _reported(etcd, "c") == {"keep": 4, "drop": 1})
    c.kill()
    wait_for("c dead", lambda: not cluster_nodes(a)["c"]["alive"], timeout_s=TTL_S + 8)
    # rehome the queues on live nodes, empty
    status, answer = b.request("DELETE", "/cluster/nodes/c?rehome=true")
    assert status == 200, answer
    assert answer["queues"] == ["drop", "keep"] and set(answer["rehomed"].values()) <= {"a", "b"}
    assert answer["messages_lost"] == 5 and answer["messages_lost_by_queue"] == {"drop": 1, "keep": 4}
    wait_for("c forgotten on a", lambda: "c" not in cluster_nodes(a))  # (b's change: a learns it by its watch)
    owner = answer["rehomed"]["keep"]
    wait_for("keep usable again", lambda: a.request("POST", "/exchanges/amq.default/publish?routing_key=keep", b"new")[0] == 200)
    assert [m["body"] for m in a.drain("keep")] == ["new"]
    assert cluster_nodes(b)[owner]["queues"].count("keep") == 1
    assert b.request("DELETE", "/cluster/nodes/c")[0] == 404  # already forgotten
    assert b.request("DELETE", "/cluster/nodes/a")[0] == 409
    # the forgotten node comes back: the cluster's word wins, its old copies go
    c.start()
    wait_synced(c)  # c's view read from etcd: before, it does not know keep's new owner
    wait_for("c alive", lambda: cluster_nodes(a).get("c", {}).get("alive"))
    assert c.request("GET", "/queues/keep")[0] == 200  # relayed to its new owner
    assert "keep" not in cluster_nodes(a)["c"]["queues"]


def test_forgetting_without_rehome_deletes_the_queues_and_their_bindings(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    for node in (a, b):  # each node's own view, not only a's
        wait_for("two alive", lambda: sum(n["alive"] for n in cluster_nodes(node).values()) == 2)
    status, body = b.request("PUT", "/queues/gone", {"arguments": {"x-queue-leader-locator": "client-local"}})
    assert status == 201, body
    assert a.request("PUT", "/exchanges/x", {"type": "fanout"})[0] == 201
    assert a.request("POST", "/bindings", {"exchange": "x", "queue": "gone"})[0] == 201
    b.kill()
    wait_for("b dead", lambda: not cluster_nodes(a)["b"]["alive"], timeout_s=TTL_S + 8)
    status, answer = a.request("DELETE", "/cluster/nodes/b")
    assert status == 200 and answer["deleted"] == ["gone"] and answer["rehomed"] == {}, answer
    assert a.request("GET", "/queues/gone")[0] == 404
    status, published = a.request("POST", "/exchanges/x/publish", b"m")
    assert status == 200 and published["routed"] == 0  # no binding left to a dead queue

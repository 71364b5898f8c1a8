"""Auto-delete exchanges in a cluster (docs/cluster.md): etcd's bindings decide for
every node at once. An auto-delete exchange goes, on every node, with the last
binding from it (unbound, or gone with its queue), and an exchange bound only to it
goes in turn; while one binding is left it stays everywhere. Two real nodes on a
private etcd: before, each node deleted it by itself while etcd kept it, so one node
routed to it and the other answered 404."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.conftest import cluster_nodes, wait_caught_up, wait_for
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

FANOUT = {"type": "fanout", "auto_delete": True, "durable": True}


def _on(node: BrokerProcess, at: str) -> dict[str, Any]:
    return {"arguments": {"x-queue-leader-locator": "client-local"}} if at == "here" else {}


def _exists(node: BrokerProcess, exchange: str) -> bool:
    status, _body = node.request("GET", f"/exchanges/{exchange}")
    assert status in (200, 404), status
    return status == 200


def _bind(node: BrokerProcess, exchange: str, destination: str, *, to_exchange: bool = False) -> None:
    body = {"exchange": exchange, ("to_exchange" if to_exchange else "queue"): destination, "routing_key": ""}
    status, answer = node.request("POST", "/bindings", body)
    assert status in (200, 201), answer


def test_an_auto_delete_exchange_goes_with_its_last_binding_on_every_node(nodes: Any) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("both alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 2)
    assert a.request("PUT", "/exchanges/X", FANOUT)[0] == 201
    assert a.request("PUT", "/queues/qa", _on(a, "here"))[0] == 201
    assert b.request("PUT", "/queues/qb", _on(b, "here"))[0] == 201
    _bind(a, "X", "qa")
    _bind(b, "X", "qb")
    status, _ = a.request("DELETE", "/bindings", {"exchange": "X", "queue": "qa", "routing_key": ""})
    assert status == 200
    wait_caught_up(a, b)  # (b's binding reaches a by a's watch; a's unbind reaches b by b's)
    wait_caught_up(b, a)
    # one binding left: X stays on both nodes and routes from both
    for node in (a, b):
        assert _exists(node, "X")
        status, answer = node.request("POST", "/exchanges/X/publish?routing_key=", b"m")
        assert status == 200 and answer["confirm"] == "ack" and answer["routed"] == 1, answer
    status, _ = b.request("DELETE", "/bindings", {"exchange": "X", "queue": "qb", "routing_key": ""})
    assert status == 200
    for node in (a, b):
        wait_for("X gone", lambda node=node: not _exists(node, "X"))
    # and the name is free: another type now
    status, body = b.request("PUT", "/exchanges/X", {"type": "direct"})
    assert status == 201, body

    # S -> T -> q (exchange to exchange): deleting q leaves T bare, then S
    assert a.request("PUT", "/exchanges/S", FANOUT)[0] == 201
    assert a.request("PUT", "/exchanges/T", FANOUT)[0] == 201
    assert a.request("PUT", "/queues/q", _on(a, "here"))[0] == 201
    _bind(a, "T", "q")
    _bind(b, "S", "T", to_exchange=True)
    wait_caught_up(b, a)  # (T -> q, bound on a)
    status, answer = b.request("POST", "/exchanges/S/publish?routing_key=", b"via S")
    assert status == 200 and answer["routed"] == 1, answer
    assert b.request("DELETE", "/queues/q")[0] == 200
    for node in (a, b):
        wait_for("S and T gone", lambda node=node: not _exists(node, "S") and not _exists(node, "T"))

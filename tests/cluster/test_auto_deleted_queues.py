"""A queue the broker deletes by itself leaves the whole cluster (docs/cluster.md):
an auto-delete queue whose last consumer left (here a consumer relayed from another
node) and a queue unused for its ``x-expires`` are deleted from etcd by the node that
serves them, so no node routes to them any more and a declare with other settings
is a new queue, not a 409. Two real nodes on a private etcd."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import cluster_nodes, wait_caught_up, wait_for
from tests.support.broker import BrokerProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow

LOCAL = {"x-queue-leader-locator": "client-local"}


def _cluster_queues(node: BrokerProcess) -> set[str]:
    """Every queue some node of the cluster is shown owning, as ``node`` sees it."""
    return {q for n in cluster_nodes(node).values() for q in n["queues"]}


def test_auto_deleted_and_expired_queues_leave_etcd(nodes: Any, tmp_path: Path) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("both alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 2)
    status, body = a.request("PUT", "/queues/replies", {"auto_delete": True, "arguments": LOCAL})
    assert status == 201, body
    status, body = a.request("PUT", "/queues/short-lived", {"arguments": {**LOCAL, "x-expires": 1000}})
    assert status == 201, body
    wait_for("b sees both", lambda: {"replies", "short-lived"} <= _cluster_queues(b))
    # a consumer on b, relayed from a; its cancel leaves the queue without consumers on a
    ch = RawChannel(b.port)
    try:
        ch.send({"op": "consume", "queue": "replies", "consumer_tag": "c", "id": 1})
        ch.next_of("consume_ok")
        ch.send({"op": "cancel", "consumer_tag": "c", "id": 2})
        ch.next_of("cancel_ok")
    finally:
        ch.close()
    for node in (a, b):
        wait_for("both gone from the cluster", lambda node=node: not ({"replies", "short-lived"} & _cluster_queues(node)))
    # no node routes to them: a declare with other settings makes a new queue
    for name in ("replies", "short-lived"):
        status, body = b.request("PUT", f"/queues/{name}", {"durable": True})
        assert status == 201, (name, body)
        status, answer = b.request("POST", f"/exchanges/amq.default/publish?routing_key={name}", b"x")
        assert status == 200 and answer["confirm"] == "ack", answer
        wait_caught_up(a, b)  # (declared on b: a learns it by its watch)
        status, shown = a.request("GET", f"/queues/{name}")
        assert status == 200 and shown["messages_ready"] == 1 and not shown["auto_delete"], shown

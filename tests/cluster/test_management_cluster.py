"""The management API's declares, bindings and deletes in a cluster
(broker/api/management/writing.py): they go through the gateway's metadata calls, so
the whole cluster sees them (etcd), as it sees an AMQP declare; a publish through
``/api/`` on one node reaches a queue another node owns. Two real nodes on a private
etcd."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.conftest import cluster_nodes, wait_caught_up, wait_for

pytestmark = pytest.mark.slow


def test_declares_bindings_and_deletes_reach_every_node(nodes: Any) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("both alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 2)
    here = {"durable": True, "arguments": {"x-queue-leader-locator": "client-local"}}
    assert a.request("PUT", "/api/queues/%2F/jobs", here)[0] == 201
    assert a.request("PUT", "/api/exchanges/%2F/events", {"type": "fanout", "durable": True})[0] == 201
    wait_caught_up(b, a)
    # b knows both (ackbus's own REST reads, relayed to the owner)
    assert b.request("GET", "/queues/jobs")[0] == 200
    assert b.request("GET", "/exchanges/events")[0] == 200
    assert b.request("PUT", "/api/queues/%2F/jobs", here)[0] == 204  # the cluster's twin
    # bound on b, published on b: reaches a's queue
    assert b.request("POST", "/api/bindings/%2F/e/events/q/jobs", {"routing_key": ""})[0] == 201
    wait_caught_up(a, b)
    body = {"properties": {}, "routing_key": "", "payload": "hello", "payload_encoding": "string"}
    status, answer = b.request("POST", "/api/exchanges/%2F/events/publish", body)
    assert (status, answer) == (200, {"routed": True})
    wait_for("the message on a", lambda: a.request("GET", "/api/queues/%2F/jobs")[1]["messages"] == 1)
    # deleted on b: gone everywhere
    assert b.request("DELETE", "/api/queues/%2F/jobs")[0] == 204
    wait_caught_up(a, b)
    wait_for("jobs gone on a", lambda: a.request("GET", "/queues/jobs")[0] == 404)

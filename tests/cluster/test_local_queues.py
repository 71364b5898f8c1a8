"""A connection's own queues (exclusive or server-named) in a cluster
(docs/cluster.md): they live on their node, but every node routes to them, as
RabbitMQ's do: an RPC reply published on another node reaches the caller's reply
queue, a fanout exchange reaches the subscribers' queues on every node, and no other
node takes their names. They leave etcd with their connection, or with their node
(its lease). Two real nodes on a private etcd."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from tests.cluster.conftest import TTL_S, cluster_nodes, wait_for
from tests.support.broker import BrokerProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow


def _publish(node: BrokerProcess, exchange: str, key: str, body: bytes) -> dict[str, Any]:
    status, answer = node.request("POST", f"/exchanges/{exchange}/publish?routing_key={key}", body)
    assert status == 200 and answer["confirm"] == "ack", (status, answer)
    return dict(answer)


def _known(node: BrokerProcess, queue: str) -> bool:
    return any(queue in n["queues"] for n in cluster_nodes(node).values())


@pytest.fixture
def two(nodes: Any) -> tuple[BrokerProcess, BrokerProcess]:
    """Nodes a and b, both alive, and a fanout exchange ``fan`` (declared on b)."""
    a, b = nodes("a"), nodes("b")
    wait_for("both alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 2)
    assert b.request("PUT", "/exchanges/fan", {"type": "fanout"})[0] == 201
    return a, b


def test_a_connections_own_queues_are_routed_to_from_every_node(two: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, b = two
    ch = RawChannel(a.port)
    try:
        # an RPC caller's reply queue on a: server-named, exclusive
        ch.send({"op": "declare_queue", "queue": "", "exclusive": True, "id": 1})
        reply_to = ch.next_of("ok")["queue"]
        assert reply_to.startswith("amq.gen-")
        # and a subscriber's queue, bound to the fanout exchange
        ch.send({"op": "declare_queue", "queue": "sub-a", "exclusive": True, "id": 2},
                {"op": "bind", "exchange": "fan", "queue": "sub-a", "id": 3})
        ch.next_of("ok")
        ch.next_of("ok")
        ch.send({"op": "consume", "queue": reply_to, "consumer_tag": "r", "no_ack": True, "id": 4},
                {"op": "consume", "queue": "sub-a", "consumer_tag": "s", "no_ack": True, "id": 5})
        ch.next_of("consume_ok")
        ch.next_of("consume_ok")
        wait_for("b knows both", lambda: _known(b, reply_to) and _known(b, "sub-a"))
        # the RPC server on b replies; the publisher on b logs (once b has the binding,
        # which came after the queue: a publish before it is routed nowhere, not delivered)
        assert _publish(b, "amq.default", reply_to, b"the answer")["routed"] == 1
        wait_for("b routes to sub-a", lambda: _publish(b, "fan", "", b"a line")["routed"] == 1)
        got = {}
        while len(got) < 2:
            ev = ch.next_of("deliver")
            got[ev["consumer_tag"]] = ev["message"]["body"]
        assert got == {"r": "the answer", "s": "a line"}
        # its name is taken in the whole cluster (RabbitMQ's 405 RESOURCE_LOCKED)
        status, body = b.request("PUT", "/queues/sub-a", {"durable": True})
        assert status == 409 and body["error"] == "resource_locked", body
        # a client's delete of one takes it out of etcd too
        ch.send({"op": "declare_queue", "queue": "", "exclusive": True, "id": 10})
        scratch = ch.next_of("ok")["queue"]
        wait_for("b knows it", lambda: _known(b, scratch))
        ch.send({"op": "delete_queue", "queue": scratch, "id": 11})
        ch.next_of("ok")
        wait_for("gone from b's view", lambda: not _known(b, scratch))
        # an unbind leaves every node's routing too
        ch.send({"op": "unbind", "exchange": "fan", "queue": "sub-a", "id": 6})
        ch.next_of("ok")
        wait_for("b routes nowhere", lambda: _publish(b, "fan", "", b"nobody")["routed"] == 0)  # (by b's watch)
    finally:
        ch.close()
    # the connection's end takes them out of etcd
    wait_for("both gone from b's view", lambda: not _known(b, reply_to) and not _known(b, "sub-a"))
    assert _publish(b, "amq.default", reply_to, b"late")["routed"] == 0  # unroutable: acked, not nacked
    assert b.request("PUT", "/queues/sub-a", {"durable": True})[0] == 201  # the name is free


def test_a_dead_nodes_own_queues_leave_with_its_lease(two: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, b = two
    ch = RawChannel(a.port)
    try:
        ch.send({"op": "declare_queue", "queue": "", "exclusive": True, "id": 1})
        mine = ch.next_of("ok")["queue"]
        ch.send({"op": "bind", "exchange": "fan", "queue": mine, "id": 2})
        ch.next_of("ok")
        wait_for("b routes to it", lambda: _publish(b, "fan", "", b"x")["routed"] == 1)
        a.kill()
        # once a's lease lapsed, its queue and binding are gone: publishes on b are
        # routed nowhere and acked, not nacked for an unreachable owner
        wait_for("a's queue gone", lambda: not _known(b, mine), timeout_s=TTL_S * 4 + 10)
        assert _publish(b, "fan", "", b"after")["routed"] == 0
    finally:
        ch.close()


def test_a_node_that_joins_again_with_a_new_lease_puts_its_own_queues_back(two: tuple[BrokerProcess, BrokerProcess]) -> None:
    """Hung past its lease (SIGSTOP), a node loses what the lease held in etcd; once it
    runs again and joins with a new lease, its connections' own queues and their
    bindings are routed to from every node again (the connection never ended)."""
    a, b = two
    ch = RawChannel(a.port)
    try:
        ch.send({"op": "declare_queue", "queue": "", "exclusive": True, "id": 1})
        mine = ch.next_of("ok")["queue"]
        ch.send({"op": "bind", "exchange": "fan", "queue": mine, "id": 2},
                {"op": "consume", "queue": mine, "consumer_tag": "c", "no_ack": True, "id": 3})
        ch.next_of("ok")
        ch.next_of("consume_ok")
        wait_for("b routes to it", lambda: _publish(b, "fan", "", b"before")["routed"] == 1)
        assert ch.next_of("deliver")["message"]["body"] == "before"
        os.kill(a.proc.pid, signal.SIGSTOP)  # hung: no keepalives, its lease lapses
        try:
            wait_for("a's queue gone from b", lambda: not _known(b, mine), timeout_s=TTL_S * 4 + 10)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        wait_for("b routes to it again", lambda: _publish(b, "fan", "", b"after")["routed"] == 1, timeout_s=TTL_S * 4 + 10)
        assert ch.next_of("deliver")["message"]["body"] == "after"
    finally:
        ch.close()

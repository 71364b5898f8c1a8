"""Dead letters across nodes, at least once (docs/cluster.md): a dead letter routed to
a queue another node owns stays in its source queue (unacked) until that node has
confirmed it; while the node is down it waits, and it is delivered once the node is
back; a crash of the source queue's node meanwhile leaves it in its source queue."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import (
    TTL_S,
    cluster_nodes,
    node_process,
    wait_for,
    wait_synced,
)
from tests.support.broker import BrokerProcess
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]
LOCAL = {"x-queue-leader-locator": "client-local"}


def _queue(node: BrokerProcess, name: str) -> dict[str, Any]:
    status, body = node.request("GET", f"/queues/{name}")
    assert status == 200, body
    return dict(body)


def _reject(node: BrokerProcess, queue: str, expected: str) -> None:
    """Get one message of ``queue`` (``expected``) and nack it without requeue."""
    status, got = node.request("POST", f"/queues/{queue}/get?lease=60")
    assert status == 200 and [m["body"] for m in got["messages"]] == [expected], got
    status, answer = node.request("POST", f"/queues/{queue}/nack", {"lease_ids": [got["messages"][0]["lease_id"]], "requeue": False})
    assert status == 200, answer


def _publish(node: BrokerProcess, queue: str, body: str) -> None:
    status, answer = node.request("POST", f"/exchanges/amq.default/publish?routing_key={queue}", body.encode())
    assert status == 200 and answer["confirm"] == "ack", answer


def _alive(witness: BrokerProcess, name: str) -> bool:
    """``witness``'s view lists ``name``, alive (a view may not list a node yet: its
    watch has not brought the node's registration)."""
    return cluster_nodes(witness).get(name, {}).get("alive") is True


def _dead(witness: BrokerProcess, name: str) -> bool:
    """``witness``'s view lists ``name``, dead."""
    return cluster_nodes(witness).get(name, {}).get("alive") is False


def test_a_dead_letter_waits_in_its_source_queue_until_the_target_node_took_it(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("both alive", lambda: _alive(a, "b") and _alive(b, "a"))
    assert a.request("PUT", "/exchanges/dlx", {"type": "direct"})[0] == 201
    assert b.request("PUT", "/queues/dlq", {"durable": True, "arguments": LOCAL})[0] == 201
    assert a.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq", "routing_key": "dead"})[0] == 201
    src_args = {**LOCAL, "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead"}
    assert a.request("PUT", "/queues/src", {"durable": True, "arguments": src_args})[0] == 201
    wait_for("a routes to dlq", lambda: a.request("GET", "/queues/dlq")[0] == 200)

    # b alive: the dead letter crosses at once, and leaves its source queue
    _publish(a, "src", "m1")
    _reject(a, "src", "m1")
    wait_for("m1 on b", lambda: _queue(b, "dlq")["messages_ready"] == 1)
    wait_for("m1 settled in src", lambda: _queue(a, "src")["messages_unacked"] == 0)

    # b down: the dead letter stays in src (unacked) and waits for b
    b.kill()
    wait_for("b shown dead", lambda: _dead(a, "b"), timeout_s=TTL_S + 10)
    _publish(a, "src", "m2")
    _reject(a, "src", "m2")
    wait_for("m2 held in src", lambda: a.request("GET", "/cluster")[1]["forwarding"]["dead_letters"]["waiting"] == 1)
    assert _queue(a, "src")["messages_unacked"] == 1
    b.start()
    wait_synced(b)
    wait_for("m2 delivered to b once it is back", lambda: _queue(b, "dlq")["messages_ready"] == 2, timeout_s=20)
    wait_for("m2 settled in src", lambda: _queue(a, "src")["messages_unacked"] == 0)
    dead = [m for m in b.drain("dlq")]
    assert [m["body"] for m in dead] == ["m1", "m2"]
    death = dead[1]["properties"]["headers"]["x-death"][0]
    assert death["queue"] == "src" and death["reason"] == "rejected"

    # b down (stopped cleanly), and a crashes while holding the dead letter: it is
    # back in src after a's restart, and dead-lettered again it reaches b once b is
    # back
    b.terminate()
    wait_for("b shown dead again", lambda: _dead(a, "b"), timeout_s=TTL_S + 10)
    _publish(a, "src", "m3")
    _reject(a, "src", "m3")
    wait_for("m3 held in src", lambda: _queue(a, "src")["messages_unacked"] == 1)
    a.kill()
    b.start()
    wait_synced(b)  # b's view read from etcd: it lists a (alive or not) from then on
    wait_for("a shown dead", lambda: _dead(b, "a"), timeout_s=TTL_S + 10)
    a.start()
    wait_synced(a)  # a's view read from etcd: before, it knows neither dlx's binding nor b
    assert _queue(a, "src")["messages_ready"] == 1  # kept across the crash
    _reject(a, "src", "m3")
    # (m1 and m2, leased by drain and never acked, are back in dlq since b's restart)
    wait_for("m3 on b", lambda: _queue(b, "dlq")["messages_ready"] == 3, timeout_s=20)
    assert sorted(m["body"] for m in b.drain("dlq")) == ["m1", "m2", "m3"]
    wait_for("m3 settled in src", lambda: _queue(a, "src")["messages_unacked"] == 0)
    assert a.drain("src") == []


def test_a_dead_letter_reaching_queues_on_its_own_node_and_another_goes_to_all(nodes: Nodes) -> None:
    """A fanout dead-letter exchange bound to a queue on each node: a rejected message
    reaches both, with its x-death, as on a single node. The local queue gets it at
    once; with the other node down the source keeps it held (unacked) until that node
    is back, then lets it go."""
    a, b = nodes("a"), nodes("b")
    wait_for("both alive", lambda: _alive(a, "b") and _alive(b, "a"))
    assert a.request("PUT", "/exchanges/dlx", {"type": "fanout"})[0] == 201
    assert a.request("PUT", "/queues/dlq-a", {"durable": True, "arguments": LOCAL})[0] == 201
    assert b.request("PUT", "/queues/dlq-b", {"durable": True, "arguments": LOCAL})[0] == 201
    assert a.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq-a"})[0] == 201
    assert a.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq-b"})[0] == 201
    assert a.request("PUT", "/queues/src", {"durable": True, "arguments": {**LOCAL, "x-dead-letter-exchange": "dlx"}})[0] == 201
    wait_for("a knows dlq-b", lambda: a.request("GET", "/queues/dlq-b")[0] == 200)

    _publish(a, "src", "m1")
    _reject(a, "src", "m1")
    wait_for("m1 in dlq-a", lambda: _queue(a, "dlq-a")["messages_ready"] == 1)
    wait_for("m1 in dlq-b", lambda: _queue(b, "dlq-b")["messages_ready"] == 1)
    wait_for("m1 settled in src", lambda: _queue(a, "src")["messages"] == 0)
    for node, queue in ((a, "dlq-a"), (b, "dlq-b")):
        (m,) = node.drain(queue)
        death = m["properties"]["headers"]["x-death"][0]
        assert (m["body"], death["queue"], death["reason"], death["count"]) == ("m1", "src", "rejected", 1)

    # b down: dlq-a gets m2 at once; src holds it (unacked) until b is back
    b.kill()
    wait_for("b shown dead", lambda: _dead(a, "b"), timeout_s=TTL_S + 10)
    _publish(a, "src", "m2")
    _reject(a, "src", "m2")
    wait_for("m2 in dlq-a at once", lambda: _queue(a, "dlq-a")["messages_ready"] == 1)
    wait_for("m2 held in src", lambda: a.request("GET", "/cluster")[1]["forwarding"]["dead_letters"]["waiting"] == 1)
    assert _queue(a, "src")["messages_unacked"] == 1
    b.start()
    wait_synced(b)
    # (m1, leased by drain and never acked, is back in dlq-b since b's restart)
    wait_for("m2 in dlq-b once b is back", lambda: _queue(b, "dlq-b")["messages_ready"] == 2, timeout_s=20)
    wait_for("m2 settled in src", lambda: _queue(a, "src")["messages"] == 0)
    assert a.request("GET", "/cluster")[1]["forwarding"]["dead_letters"]["waiting"] == 0
    assert [m["body"] for m in a.drain("dlq-a")] == ["m2"]
    assert sorted(m["body"] for m in b.drain("dlq-b")) == ["m1", "m2"]


def test_a_held_dead_letter_survives_a_checkpoint_and_a_crash_of_its_source_node(tmp_path: Path, etcd: EtcdProcess) -> None:
    """Held for a node that is down, the dead letter is in the checkpoint as its source
    queue's unacked message; after a crash of the source node (recovering from that
    checkpoint) it is back in its source queue, and dead-lettered again it reaches the
    other node once that is back. The source node's own dead-letter queue, which had
    its copy before the crash, is not given a second one (its deduplication key is in
    the checkpoint)."""
    a = node_process(tmp_path, etcd, "a", extra=("--checkpoint-interval-s", "0.3", "--checkpoint-wal-bytes", "0"))
    b = node_process(tmp_path, etcd, "b")
    try:
        a.start()
        b.start()
        wait_synced(a)
        wait_synced(b)  # each view read from etcd: it lists the other (alive or not) from then on
        wait_for("both alive", lambda: _alive(a, "b") and _alive(b, "a"))
        assert a.request("PUT", "/exchanges/dlx", {"type": "fanout"})[0] == 201
        assert a.request("PUT", "/queues/dlq-a", {"durable": True, "arguments": LOCAL})[0] == 201
        assert b.request("PUT", "/queues/dlq-b", {"durable": True, "arguments": LOCAL})[0] == 201
        assert a.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq-a"})[0] == 201
        assert a.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq-b"})[0] == 201
        src_args = {**LOCAL, "x-dead-letter-exchange": "dlx"}
        assert a.request("PUT", "/queues/src", {"durable": True, "arguments": src_args})[0] == 201
        wait_for("a knows dlq-b", lambda: a.request("GET", "/queues/dlq-b")[0] == 200)

        b.terminate()
        wait_for("b shown dead", lambda: _dead(a, "b"), timeout_s=TTL_S + 10)
        _publish(a, "src", "m1")
        _reject(a, "src", "m1")
        wait_for("m1 in dlq-a", lambda: _queue(a, "dlq-a")["messages_ready"] == 1)
        wait_for("m1 held in src", lambda: _queue(a, "src")["messages_unacked"] == 1)
        _publish(a, "dlq-a", "after")  # a record after the hold: a checkpoint through it has m1 held
        after_lsn = a.request("GET", "/overview")[1]["storage"]["last_lsn"]
        wait_for("a checkpoint with m1 held", lambda: (
            a.request("GET", "/overview")[1]["storage"].get("last_checkpoint_lsn") or 0) >= after_lsn)
        a.kill()
        b.start()
        wait_synced(b)  # (before, b's view may not list a at all)
        wait_for("a shown dead", lambda: _dead(b, "a"), timeout_s=TTL_S + 10)
        a.start()
        wait_synced(a)
        wait_for("both alive again", lambda: _alive(a, "b") and _alive(b, "a"), timeout_s=TTL_S + 15)
        assert _queue(a, "src")["messages_ready"] == 1  # kept across the checkpoint and the crash
        assert _queue(a, "dlq-a")["messages_ready"] == 2  # m1's copy and "after"
        _reject(a, "src", "m1")
        wait_for("m1 on b", lambda: _queue(b, "dlq-b")["messages_ready"] == 1, timeout_s=20)
        wait_for("m1 settled in src", lambda: _queue(a, "src")["messages"] == 0)
        assert [m["body"] for m in a.drain("dlq-a")] == ["m1", "after"]  # m1 not copied here twice
        assert [m["body"] for m in b.drain("dlq-b")] == ["m1"]
    finally:
        a.stop()
        b.stop()

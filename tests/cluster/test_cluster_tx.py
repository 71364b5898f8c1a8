"""Transactions across nodes (two nodes on a private etcd): a transactional publish
whose routes reach queues other nodes own is forwarded to them at the commit, over
the channel protocol and over AMQP; a commit reaching a queue whose owner is down is
refused with nothing applied; an owner lost between the routing and its answer leaves
the commit partial, and the commit says so (docs/cluster.md, "Transactions")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import cluster_nodes, node_process, wait_for, wait_synced
from tests.support.broker import BrokerProcess, free_port
from tests.support.etcd import EtcdProcess
from tests.support.rawchannel import RawChannel

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.slow

LOCAL = {"arguments": {"x-queue-leader-locator": "client-local"}, "durable": True}


@pytest.fixture
def two(tmp_path: Path, etcd: EtcdProcess) -> Iterator[tuple[BrokerProcess, BrokerProcess, int]]:
    """Nodes a (with an AMQP port, the third item) and b; queue qa on a, qb on b,
    both bound to fanout exchange txfan."""
    amqp_port = free_port()
    a = node_process(tmp_path, etcd, "a", extra=("--amqp-port", str(amqp_port)))
    b = node_process(tmp_path, etcd, "b")
    try:
        a.start()
        b.start()
        wait_synced(a)
        wait_synced(b)  # b's view read from etcd: before, its declare and binds answer 503
        wait_for("both alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 2)
        assert a.request("PUT", "/exchanges/txfan", {"type": "fanout"})[0] == 201
        assert a.request("PUT", "/queues/qa", LOCAL)[0] == 201
        assert b.request("PUT", "/queues/qb", LOCAL)[0] == 201
        for q in ("qa", "qb"):
            assert b.request("POST", "/bindings", {"exchange": "txfan", "queue": q})[0] == 201
        wait_for("a routes to qb", lambda: a.request("GET", "/queues/qb")[0] == 200 and _fanout_reaches(a) == 2)
        yield a, b, amqp_port
    finally:
        a.stop()
        b.stop()


def _fanout_reaches(node: BrokerProcess) -> int:
    """How many queues a test publish to txfan reaches (drained again at once)."""
    status, answer = node.request("POST", "/exchanges/txfan/publish", b"probe")
    assert status == 200, answer
    for q in ("qa", "qb"):
        node.drain(q)
    return int(answer.get("routed", 0))


def _until(ch: RawChannel, op: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Events up to the reply to ``op`` (or an error): (events before it, it)."""
    before = []
    while True:
        ev = ch.next_event()
        if ev["ev"] == "error" or (ev["ev"] == "ok" and ev.get("op") == op):
            return before, ev
        before.append(ev)


def _bodies(node: BrokerProcess, queue: str) -> list[str]:
    return [m["body"] for m in node.drain(queue)]


def test_a_transaction_reaches_other_owners_at_its_commit(two: tuple[BrokerProcess, BrokerProcess, int]) -> None:
    a, b, amqp_port = two
    ch = RawChannel(a.port)
    try:
        ch.send({"op": "tx_select"})
        assert _until(ch, "tx_select")[1]["ev"] == "ok"
        ch.send(*[{"op": "publish", "exchange": "txfan", "body": f"fan-{i}"} for i in range(3)],
                {"op": "publish", "routing_key": "qb", "body": "direct-b"})
        # nothing is applied, here or on b, before the commit
        assert b.request("GET", "/queues/qb")[1]["messages_ready"] == 0
        assert a.request("GET", "/queues/qa")[1]["messages_ready"] == 0
        ch.send({"op": "tx_commit"})
        confirms, done = _until(ch, "tx_commit")
        assert done["ev"] == "ok" and done["operations"] == 4, done
        assert [e["ev"] for e in confirms] == ["ack"] * 4, confirms  # each waited for b's confirm
        assert _bodies(b, "qb") == ["fan-0", "fan-1", "fan-2", "direct-b"]
        assert _bodies(a, "qa") == ["fan-0", "fan-1", "fan-2"]
        # a rollback forwards nothing
        ch.send({"op": "publish", "exchange": "txfan", "body": "rolled-back"}, {"op": "tx_rollback"})
        assert _until(ch, "tx_rollback")[1]["ev"] == "ok"
        ch.send({"op": "tx_commit"})
        assert _until(ch, "tx_commit")[1]["operations"] == 0
        assert _bodies(b, "qb") == [] and _bodies(a, "qa") == []
    finally:
        ch.close()

    # the same over AMQP (pika's tx mode)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=30))
    try:
        amqp = conn.channel()
        amqp.tx_select()
        amqp.basic_publish("txfan", "", b"amqp-fan", pika.BasicProperties(delivery_mode=2))
        amqp.basic_publish("", "qb", b"amqp-direct", pika.BasicProperties(delivery_mode=2))
        assert b.request("GET", "/queues/qb")[1]["messages_ready"] == 0
        amqp.tx_commit()
        assert _bodies(b, "qb") == ["amqp-fan", "amqp-direct"]
        assert _bodies(a, "qa") == ["amqp-fan"]
    finally:
        conn.close()


def test_an_owner_down_refuses_the_commit_and_one_lost_meanwhile_leaves_it_partial(
    two: tuple[BrokerProcess, BrokerProcess, int],
) -> None:
    a, b, amqp_port = two
    ch = RawChannel(a.port)
    ch.send({"op": "tx_select"})
    assert _until(ch, "tx_select")[1]["ev"] == "ok"
    ch.send({"op": "publish", "routing_key": "qb", "body": "warm-up"}, {"op": "tx_commit"})
    assert _until(ch, "tx_commit")[1]["ev"] == "ok"  # (the channel to b is open now)
    assert _bodies(b, "qb") == ["warm-up"]
    # b dies; a still counts it alive (its lease has not lapsed): the commit applies
    # a's part, b's share is lost, and the commit says so
    b.kill()
    ch.send({"op": "publish", "exchange": "txfan", "body": "partial"}, {"op": "tx_commit"})
    confirms, error = _until(ch, "tx_commit")
    assert error["ev"] == "error" and error["error"] == "tx_incomplete", error
    assert "publish 2 to node 'b'" in error["message"], error
    assert [e["ev"] for e in confirms] == ["nack"], confirms
    ch.close()
    assert _bodies(a, "qa") == ["partial"]

    # once b is shown dead, a commit reaching its queue is refused before anything
    # is applied: a's own queue does not get its share either
    wait_for("b shown dead", lambda: not cluster_nodes(a)["b"]["alive"])
    ch = RawChannel(a.port)
    try:
        ch.send({"op": "tx_select"})
        assert _until(ch, "tx_select")[1]["ev"] == "ok"
        ch.send({"op": "publish", "exchange": "txfan", "body": "refused"}, {"op": "tx_commit"})
        confirms, error = _until(ch, "tx_commit")
        assert error["ev"] == "error" and error["error"] == "queue_unavailable", error
        assert "nothing of it applied" in error["message"], error
    finally:
        ch.close()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=30))
    try:
        amqp = conn.channel()
        amqp.tx_select()
        amqp.basic_publish("txfan", "", b"refused-amqp")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            amqp.tx_commit()
        assert refused.value.reply_code == 406 and "nothing of it applied" in refused.value.reply_text
    finally:
        if conn.is_open:
            conn.close()
    assert _bodies(a, "qa") == []

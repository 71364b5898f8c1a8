"""A consumer of a quorum queue, relayed from its leader to the node its client is
connected to, outlives the leader (docs/cluster.md, quorum queues): kill -9 the leader
and the consumer goes on from the next one, with the same consumer tag and no
``basic.cancel``; what the old leader had delivered unsettled comes again marked
redelivered, and settling its old delivery tag does nothing. Three real nodes on a
private etcd, pika on the AMQP port of a follower."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.api.channel.relay_resume import RESUME_POLL_S
from tests.cluster.conftest import (
    TTL_S,
    cluster_nodes,
    node_process,
    wait_for,
    wait_synced,
    watched_consumer,
)
from tests.cluster.test_cluster_amqp import pump_until
from tests.support.broker import BrokerProcess, free_port, stop_all
from tests.support.etcd import EtcdProcess
from tests.support.rawchannel import RawChannel

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.slow

QUORUM = {"durable": True, "arguments": {"x-queue-type": "quorum"}}


@pytest.fixture
def three(tmp_path: Path, etcd: EtcdProcess) -> Iterator[dict[str, tuple[BrokerProcess, int]]]:
    """Nodes a, b and c, each with an AMQP port, once all are alive."""
    started: dict[str, tuple[BrokerProcess, int]] = {}
    try:
        for name in ("a", "b", "c"):
            port = free_port()
            proc = node_process(tmp_path, etcd, name, extra=("--amqp-port", str(port)))
            started[name] = (proc, port)
            proc.start()
            wait_synced(proc)  # its view read from etcd: before, it knows no queue of the others
        first = started["a"][0]
        wait_for("three alive", lambda: sum(n["alive"] for n in cluster_nodes(first).values()) == 3)
        yield started
    finally:
        stop_all(proc for proc, _port in started.values())


def _replication(node: BrokerProcess, queue: str) -> dict[str, Any]:
    status, body = node.request("GET", "/cluster")
    assert status == 200, body
    return dict(body["replicated_queues"].get(queue) or {})


def _leader(nodes: dict[str, BrokerProcess], queue: str, not_: str | None = None) -> str:
    """The name of the node every live node names leader of ``queue`` (not ``not_``)."""

    def agreed() -> str | None:
        names = {_replication(node, queue).get("leader") for name, node in nodes.items() if name != not_}
        (only,) = names if len(names) == 1 else (None,)
        if only and only != not_ and _replication(nodes[only], queue).get("local", {}).get("role") == "leader":
            return str(only)
        return None

    return str(wait_for(f"a leader of {queue}", agreed, timeout_s=TTL_S * 4 + 10))


def _publish(node: BrokerProcess, queue: str, body: str) -> bool:
    status, answer = node.request("POST", f"/exchanges/amq.default/publish?routing_key={queue}", body.encode(), timeout_s=15)
    return status == 200 and answer.get("confirm") == "ack"


def _pump_until(conn: Any, what: str, check: Any) -> Any:
    return pump_until(conn, what, check, timeout_s=30.0)


def _quorum_queue_and_a_follower(procs: dict[str, BrokerProcess]) -> tuple[str, str]:
    """Quorum queue ``work`` declared: (its leader, another node for the client)."""
    status, body = procs["a"].request("PUT", "/queues/work", QUORUM)
    assert status == 201, body
    old = _leader(procs, "work")
    return old, next(name for name in procs if name != old)


def test_a_relayed_consumer_of_a_quorum_queue_goes_on_from_the_next_leader(
    three: dict[str, tuple[BrokerProcess, int]],
) -> None:
    procs = {name: proc for name, (proc, _port) in three.items()}
    old, client_node = _quorum_queue_and_a_follower(procs)
    for i in range(5):
        assert _publish(procs[old], "work", f"m{i}")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", three[client_node][1], heartbeat=30))
    try:
        ch, got, cancelled, tag = watched_consumer(conn, "work", "worker")
        _pump_until(conn, "m0..m4 delivered", lambda: len(got) == 5)
        assert [g[0] for g in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        old_m0_tag = got[0][2]
        for _body, _r, delivery_tag, _c in got[1:]:  # m0 stays unacked on the old leader
            ch.basic_ack(delivery_tag)

        def settled_everywhere() -> bool:
            info = _replication(procs[old], "work")
            status, queue = procs[old].request("GET", "/queues/work")
            return bool(status == 200 and queue["messages_unacked"] == 1 and queue["messages_ready"] == 0
                        and set(info.get("lag", {}).values()) == {0})

        _pump_until(conn, "acks of m1..m4 replicated", settled_everywhere)
        procs[old].kill()
        survivors = {name: proc for name, proc in procs.items() if name != old}
        new = _leader(survivors, "work", not_=old)
        assert _pump_until(conn, "a confirm from the new leader", lambda: _publish(procs[new], "work", "after"))
        _pump_until(conn, "m0 again and 'after'", lambda: len(got) == 7)
        again = {g[0]: g for g in got[5:]}
        assert set(again) == {b"m0", b"after"}, got
        assert again[b"m0"][1] is True and again[b"after"][1] is False  # redelivered flags
        assert {g[3] for g in got} == {tag}  # the same consumer all along
        assert cancelled == [] and ch.is_open
        # the old tag of m0 is gone with its leader: acking it does nothing
        ch.basic_ack(old_m0_tag)
        for _body, _r, delivery_tag, _c in got[5:]:
            ch.basic_ack(delivery_tag)

        def drained() -> bool:
            status, queue = procs[new].request("GET", "/queues/work")
            return bool(status == 200 and queue["messages_unacked"] == 0 and queue["messages_ready"] == 0)

        _pump_until(conn, "every message settled on the new leader", drained)
        assert ch.is_open and cancelled == []
        # and it is still consuming: one more arrives
        assert _publish(procs[new], "work", "later")
        _pump_until(conn, "'later' delivered", lambda: len(got) == 8)
        assert got[7][0] == b"later" and got[7][3] == tag
    finally:
        if conn.is_open:
            conn.close()


def test_a_channel_consumer_cancelled_while_it_waits_for_the_next_leader_stays_cancelled(
    three: dict[str, tuple[BrokerProcess, int]],
) -> None:
    procs = {name: proc for name, (proc, _port) in three.items()}
    old, client_node = _quorum_queue_and_a_follower(procs)
    assert _publish(procs[old], "work", "m0")
    ch = RawChannel(procs[client_node].port)
    try:
        ch.send({"op": "consume", "queue": "work", "consumer_tag": "w", "id": 1})
        ev = ch.next_event()
        while ev["ev"] != "deliver":
            assert ev["ev"] != "error", ev
            ev = ch.next_event()
        assert ev["message"]["body"] == "m0", ev
        procs[old].kill()
        wait_for("the consumer waiting for the next leader",
                 lambda: "lost its quorum queue's leader" in procs[client_node].log_tail(200), timeout_s=TTL_S * 4 + 10)
        ch.send({"op": "cancel", "consumer_tag": "w", "id": 2})
        ev = ch.next_event()
        assert ev == {"ev": "cancel_ok", "id": 2, "consumer_tag": "w"}, ev  # (not an unknown tag)
        survivors = {name: proc for name, proc in procs.items() if name != old}
        new = _leader(survivors, "work", not_=old)
        assert wait_for("a confirm from the new leader", lambda: _publish(procs[new], "work", "after"), timeout_s=TTL_S * 4 + 10)

        def counts() -> tuple[int, int, int]:
            status, queue = procs[new].request("GET", "/queues/work")
            assert status == 200, queue
            return queue["messages_ready"], queue["messages_unacked"], queue["consumers"]

        # m0 back and 'after' ready; nobody consumes: the cancelled consumer did not come back
        wait_for("both ready on the new leader", lambda: counts() == (2, 0, 0))
        time.sleep(RESUME_POLL_S * 4)  # a resumption that went on would have consumed by now
        assert counts() == (2, 0, 0)
    finally:
        ch.close()

"""A consumer of a quorum queue whose client is connected to the queue's leader
outlives that node's step-down while it lives (docs/cluster.md, quorum queues): the
leader is cut off from etcd (``silent_proxy.py``), its lease is counted lost and it
stops leading; its consumer is not cancelled but goes on, with the same consumer tag
and no ``cancel`` (no ``basic.cancel``), from the next leader: relayed from another
node, or here again when this node is elected again. What it had delivered unsettled
comes again, redelivered; settling the old delivery tags does nothing. Three real
nodes on a private etcd, each reaching it through a proxy of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import (
    TTL_S,
    node_process,
    wait_for,
    wait_synced,
    watched_consumer,
)
from tests.cluster.silent_proxy import SilentProxy, silent_proxies
from tests.cluster.test_cluster_amqp import pump_until
from tests.cluster.test_cut_off import agreed_leader, replication
from tests.support.broker import BrokerProcess, free_port, stop_all
from tests.support.etcd import EtcdProcess
from tests.support.rawchannel import RawChannel

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.slow

NAMES = ("a", "b", "c")
ELECTION_S = TTL_S * 4 + 10


class Nodes:
    """Three nodes, each with an AMQP port, each reaching etcd through its own proxy."""

    def __init__(self, procs: dict[str, BrokerProcess], amqp: dict[str, int], proxies: dict[str, SilentProxy]) -> None:
        self.procs = procs
        self.amqp = amqp
        self.proxies = proxies


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[Nodes]:
    etcd_port = int(etcd.url.rsplit(":", 1)[1])
    started: list[BrokerProcess] = []
    with silent_proxies(etcd_port, len(NAMES)) as proxies:
        by_name = dict(zip(NAMES, proxies, strict=True))
        try:
            procs: dict[str, BrokerProcess] = {}
            amqp: dict[str, int] = {}
            for name in NAMES:
                amqp[name] = free_port()
                proc = node_process(tmp_path, etcd, name, extra=(
                    "--etcd", f"http://127.0.0.1:{by_name[name].port}", "--amqp-port", str(amqp[name])))
                started.append(proc)
                proc.start()
                wait_synced(proc)
                procs[name] = proc
            yield Nodes(procs, amqp, by_name)
        finally:
            stop_all(started)


def _publish(node: BrokerProcess, queue: str, body: str) -> bool:
    status, answer = node.request("POST", f"/exchanges/amq.default/publish?routing_key={queue}", body.encode(), timeout_s=15)
    return status == 200 and answer.get("confirm") == "ack"


def _counts(node: BrokerProcess, queue: str) -> tuple[int, int] | None:
    """(ready, unacked) of ``queue`` on ``node``, its leader; None while it does not serve it."""
    status, body = node.request("GET", f"/queues/{queue}", timeout_s=5)
    return (body["messages_ready"], body["messages_unacked"]) if status == 200 else None


def _leads(node: BrokerProcess, queue: str) -> bool:
    return replication(node, queue).get("local", {}).get("role") == "leader"


def _replicated(node: BrokerProcess, queue: str) -> bool:
    """Every follower of ``queue`` has everything its leader ``node`` logged."""
    return set(replication(node, queue).get("lag", {}).values()) <= {0}


def _declare(nodes: Nodes, queue: str, replicas: int) -> str:
    """Quorum queue ``queue`` declared on node a with ``replicas`` replicas: its leader."""
    arguments = {"x-queue-type": "quorum", "x-quorum-initial-group-size": replicas}
    status, body = nodes.procs["a"].request("PUT", f"/queues/{queue}", {"durable": True, "arguments": arguments})
    assert status == 201, body
    return str(wait_for("a leader", lambda: agreed_leader(nodes.procs, queue, list(NAMES)), timeout_s=ELECTION_S))


class _Events:
    """A raw channel's events, read as they come; any ``cancel`` or ``error`` fails."""

    def __init__(self, ch: RawChannel) -> None:
        self.ch = ch
        self.seen: list[dict[str, Any]] = []

    def next(self) -> dict[str, Any]:
        ev = self.ch.next_event()
        self.seen.append(ev)
        assert ev["ev"] not in ("cancel", "error"), self.seen
        return ev

    def deliveries(self, count: int) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while len(got) < count:
            ev = self.next()
            if ev["ev"] == "deliver":
                got.append(ev)
        return got

    def reply(self, kind: str) -> dict[str, Any]:
        ev = self.next()
        while ev["ev"] != kind:
            ev = self.next()
        return ev


def test_a_channel_consumer_on_the_leader_goes_on_from_the_next_leader_on_another_node(nodes: Nodes) -> None:
    procs = nodes.procs
    old = _declare(nodes, "work", 3)
    for i in range(5):
        assert _publish(procs[old], "work", f"m{i}")
    # the channel's read timeout bounds every wait for an event below
    ch = RawChannel(procs[old].port, timeout_s=ELECTION_S + 30)
    events = _Events(ch)
    try:
        ch.send({"op": "consume", "queue": "work", "consumer_tag": "w", "prefetch": 10, "id": 1})
        assert events.reply("consume_ok")["consumer_tag"] == "w"
        first = events.deliveries(5)
        assert [d["message"]["body"] for d in first] == ["m0", "m1", "m2", "m3", "m4"]
        ch.send(*[{"op": "ack", "delivery_tag": d["delivery_tag"]} for d in first[1:]])  # m0 stays unacked
        wait_for("the acks of m1..m4 replicated",
                 lambda: _counts(procs[old], "work") == (0, 1) and _replicated(procs[old], "work"))

        nodes.proxies[old].silent = True  # cut off from etcd: its lease is counted lost, it steps down
        others = [n for n in NAMES if n != old]
        new = wait_for("a new leader elected by the others",
                       lambda: (leader := agreed_leader(procs, "work", others)) != old and leader, timeout_s=ELECTION_S)
        wait_for("the old leader stepping down", lambda: not _leads(procs[old], "work"), timeout_s=ELECTION_S)
        nodes.proxies[old].silent = False  # healed: it learns the new leader, and consumes from it
        assert wait_for("a confirm from the new leader", lambda: _publish(procs[new], "work", "after"))

        again = {d["message"]["body"]: d for d in events.deliveries(2)}
        assert set(again) == {"m0", "after"}, events.seen
        assert again["m0"]["redelivered"] is True and again["after"]["redelivered"] is False
        assert {d["consumer_tag"] for d in [*first, *again.values()]} == {"w"}
        # the old tag of m0 is gone with the old leadership: acking it does nothing
        ch.send({"op": "ack", "delivery_tag": first[0]["delivery_tag"]}, {"op": "qos", "prefetch": 10, "id": 2})
        assert events.reply("ok")["id"] == 2
        ch.send(*[{"op": "ack", "delivery_tag": d["delivery_tag"]} for d in again.values()])
        wait_for("every message settled on the new leader", lambda: _counts(procs[new], "work") == (0, 0))
        assert _publish(procs[new], "work", "later")  # and it is still consuming
        (later,) = events.deliveries(1)
        assert later["message"]["body"] == "later" and later["consumer_tag"] == "w"
    finally:
        ch.close()


def test_an_amqp_consumer_on_the_leader_consumes_there_again_when_its_node_leads_again(nodes: Nodes) -> None:
    procs = nodes.procs
    leader = _declare(nodes, "solo", 1)  # its one replica: the node that leads it again
    assert leader == "a"
    node = procs[leader]
    for i in range(5):
        assert _publish(node, "solo", f"m{i}")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", nodes.amqp[leader], heartbeat=60))

    def pump(what: str, check: Any) -> Any:
        return pump_until(conn, what, check, timeout_s=ELECTION_S + 20)

    try:
        ch, got, cancelled, tag = watched_consumer(conn, "solo", "worker")
        pump("m0..m4 delivered", lambda: len(got) == 5)
        assert [g[0] for g in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        old_m0_tag = got[0][2]
        for _body, _r, delivery_tag, _c in got[1:]:  # m0 stays unacked
            ch.basic_ack(delivery_tag)
        pump("the acks of m1..m4 logged", lambda: _counts(node, "solo") == (0, 1))

        nodes.proxies[leader].silent = True  # cut off from etcd: it steps down, nobody else may lead
        pump("the leader stepping down", lambda: not _leads(node, "solo"))
        # its leader key lapses with its lease in etcd (else a late keepalive could keep it)
        pump("the others seeing no leader", lambda: all(
            replication(procs[n], "solo").get("leader") is None for n in NAMES if n != leader))
        nodes.proxies[leader].silent = False  # healed: it registers again and leads the queue again
        pump("m0 again, from the same node", lambda: len(got) == 6)
        assert got[5][:2] == (b"m0", True)  # redelivered
        assert _publish(node, "solo", "after")
        pump("'after' delivered", lambda: len(got) == 7)
        assert got[6][:2] == (b"after", False)
        assert {g[3] for g in got} == {tag}  # the same consumer all along
        assert cancelled == [] and ch.is_open
        # consumed here again, not relayed from itself
        assert "consumer resumed on the quorum queue's next leader" in node.log_tail(300)
        status, body = node.request("GET", "/channels")
        assert status == 200, body
        consuming = {(c["kind"], c["consumers"][0]["consumer_tag"]) for c in body["channels"] if c["consumers"]}
        assert consuming == {("amqp", "worker")}, body  # (not a relay's channel from itself)
        # the old tag of m0 went with the old leadership: acking it does nothing
        ch.basic_ack(old_m0_tag)
        for _body, _r, delivery_tag, _c in got[5:]:
            ch.basic_ack(delivery_tag)
        pump("every message settled", lambda: _counts(node, "solo") == (0, 0))
        assert ch.is_open and cancelled == []
        assert _publish(node, "solo", "later")
        pump("'later' delivered", lambda: len(got) == 8)
        assert got[7][0] == b"later" and got[7][3] == tag
    finally:
        if conn.is_open:
            conn.close()


def test_an_amqp_consumer_on_the_leader_goes_on_relayed_when_its_node_leaves_the_replica_set(nodes: Nodes) -> None:
    procs = nodes.procs
    old = _declare(nodes, "moved", 3)
    for i in range(3):
        assert _publish(procs[old], "moved", f"m{i}")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", nodes.amqp[old], heartbeat=60))

    def pump(what: str, check: Any) -> Any:
        return pump_until(conn, what, check, timeout_s=ELECTION_S + 20)

    try:
        ch, got, cancelled, tag = watched_consumer(conn, "moved", "mover")
        pump("m0..m2 delivered", lambda: len(got) == 3)
        ch.basic_ack(got[1][2])  # m0 and m2 stay unacked
        pump("the ack of m1 replicated", lambda: _counts(procs[old], "moved") == (0, 2) and _replicated(procs[old], "moved"))
        # the leader taken out of the replica set steps down; its node lives on
        status, body = procs[old].request("POST", "/queues/moved/replicas", {"remove": old})
        assert status == 200 and body["leader_stepped_down"] is True, body
        others = [n for n in NAMES if n != old]
        new = pump("a new leader", lambda: agreed_leader(procs, "moved", others))
        pump("m0 and m2 again, relayed from the new leader", lambda: len(got) == 5)
        assert sorted(g[:2] for g in got[3:]) == [(b"m0", True), (b"m2", True)]
        assert _publish(procs[new], "moved", "after")
        pump("'after' delivered", lambda: len(got) == 6)
        assert got[5][:2] == (b"after", False)
        assert {g[3] for g in got} == {tag} and cancelled == [] and ch.is_open
        for _body, _r, delivery_tag, _c in [got[0], got[2], *got[3:]]:  # the old tags of m0 and m2: nothing
            ch.basic_ack(delivery_tag)
        pump("every message settled on the new leader", lambda: _counts(procs[new], "moved") == (0, 0))
        assert ch.is_open and cancelled == []
    finally:
        if conn.is_open:
            conn.close()

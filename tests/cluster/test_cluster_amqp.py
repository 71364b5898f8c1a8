"""AMQP 0-9-1 in cluster mode (pika against two nodes on a private etcd): declares,
binds and deletes made over AMQP go through the same etcd transactions as their REST
twins, so they are seen on every node, placement applies, conflicting declares fail
alike, and publishes over AMQP reach queues other nodes own (forwarded to them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import cluster_nodes, node_process, wait_for
from tests.support.broker import BrokerProcess, free_port
from tests.support.etcd import EtcdProcess

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.slow

CLIENT_LOCAL = {"x-queue-leader-locator": "client-local"}


class AMQPNode:
    """A node and its AMQP port."""

    def __init__(self, proc: BrokerProcess, amqp_port: int) -> None:
        self.proc = proc
        self.amqp_port = amqp_port

    def connect(self) -> Any:
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.amqp_port, heartbeat=30))


@pytest.fixture
def two(tmp_path: Path, etcd: EtcdProcess) -> Iterator[tuple[AMQPNode, AMQPNode]]:
    started: list[BrokerProcess] = []
    out = []
    try:
        for name in ("a", "b"):
            port = free_port()
            proc = node_process(tmp_path, etcd, name, extra=("--amqp-port", str(port)))
            started.append(proc)
            proc.start()
            out.append(AMQPNode(proc, port))
        wait_for("both alive", lambda: sum(n["alive"] for n in cluster_nodes(started[0]).values()) == 2)
        yield out[0], out[1]
    finally:
        for proc in started:
            proc.stop()


def owners(node: BrokerProcess) -> dict[str, str]:
    return {q: n["name"] for n in cluster_nodes(node).values() for q in n["queues"]}


def bodies(node: BrokerProcess, queue: str) -> list[str]:
    return [m["body"] for m in node.drain(queue)]


def test_declares_binds_and_deletes_over_amqp_are_cluster_wide(two: tuple[AMQPNode, AMQPNode]) -> None:
    a, b = two
    conn_a, conn_b = a.connect(), b.connect()
    try:
        ch_a, ch_b = conn_a.channel(), conn_b.channel()
        ch_a.confirm_delivery()
        ch_a.exchange_declare("amqp-fan", "fanout", durable=True)
        # placement applies to AMQP declares: client-local puts each on its node
        ch_a.queue_declare("qa", durable=True, arguments=CLIENT_LOCAL)
        ch_b.queue_declare("qb", durable=True, arguments=CLIENT_LOCAL)
        assert owners(a.proc) == {"qa": "a", "qb": "b"}  # read-your-writes on a
        wait_for("b sees both owners", lambda: owners(b.proc) == {"qa": "a", "qb": "b"})
        # the exchange declared over AMQP on a exists on b, and b binds a's queue to it
        # (pika's routing key: the queue's name)
        wait_for("the exchange on b", lambda: b.proc.request("GET", "/exchanges/amqp-fan")[0] == 200)
        ch_b.queue_bind("qa", "amqp-fan")
        ch_a.queue_bind("qb", "amqp-fan")
        wait_for("both bindings on a", lambda: a.proc.request("GET", "/bindings")[1]["bindings"].count(
            {"exchange": "amqp-fan", "queue": "qa", "routing_key": "qa", "arguments": {}}) == 1)

        # publishes over AMQP on a reach b's queue (forwarded), confirmed once b confirmed
        for i in range(5):
            ch_a.basic_publish("amqp-fan", "", f"fan-{i}".encode(), pika.BasicProperties(delivery_mode=2))
        ch_a.basic_publish("", "qb", b"direct-to-b", pika.BasicProperties(delivery_mode=2))
        assert a.proc.request("GET", "/cluster")[1]["forwarding"]["forwarded"] >= 6
        assert bodies(b.proc, "qb") == [f"fan-{i}" for i in range(5)] + ["direct-to-b"]
        assert bodies(a.proc, "qa") == [f"fan-{i}" for i in range(5)]

        # a passive declare on b of a's queue finds it; a conflicting declare fails on
        # either node with the same AMQP error
        ch_b.queue_declare("qa", passive=True)
        for conn in (conn_a, conn_b):
            ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                ch.queue_declare("qa", durable=True, arguments={**CLIENT_LOCAL, "x-max-length": 5})
            assert refused.value.reply_code == 406, refused.value
        ch_b = conn_b.channel()

        # unbind over AMQP on b: a's fanout no longer reaches qa
        ch_b.queue_unbind("qa", "amqp-fan")
        wait_for("unbound on a", lambda: not [x for x in a.proc.request("GET", "/bindings")[1]["bindings"]
                                              if x["queue"] == "qa" and x["exchange"] == "amqp-fan"])
        ch_a.basic_publish("amqp-fan", "", b"after-unbind", pika.BasicProperties(delivery_mode=2))
        assert bodies(b.proc, "qb") == ["after-unbind"] and bodies(a.proc, "qa") == []

        # deletes over AMQP on b remove a's queue and the exchange everywhere
        ch_b.queue_delete("qa")
        ch_b.exchange_delete("amqp-fan")
        assert a.proc.request("GET", "/queues/qa")[0] == 404
        wait_for("the exchange gone on a", lambda: a.proc.request("GET", "/exchanges/amqp-fan")[0] == 404)
        assert owners(b.proc) == {"qb": "b"}
        # a server-named, exclusive queue stays on its node, outside etcd
        private = ch_a.queue_declare("", exclusive=True).method.queue
        assert private.startswith("amq.gen-") and private not in owners(a.proc)
    finally:
        for conn in (conn_a, conn_b):
            if conn.is_open:
                conn.close()

"""Direct reply-to across a cluster (two nodes on a private etcd, pika): the requester
consumes ``amq.rabbitmq.reply-to`` on node a, the responder takes the request and
replies on node b; the reply's address names a, so b forwards it there as it
forwards a publish to a's queues (broker/cluster/forward.py). Over AMQP and REST,
with ``mandatory`` (returned on b, delivered on a, as RabbitMQ does), and to a
requester gone or an address made up (dropped, confirmed)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import wait_for
from tests.cluster.test_cluster_amqp import (
    CLIENT_LOCAL,
    AMQPNode,
    amqp_nodes,
    pump_until,
)
from tests.support.etcd import EtcdProcess

pika = pytest.importorskip("pika")
py_amqp = pytest.importorskip("amqp")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REPLY_TO = "amq.rabbitmq.reply-to"


def _take_request(ch: Any, queue: str, timeout_s: float = 15.0) -> Any:
    """The next request of ``queue`` (published on another node: it may take a moment)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return props, body
        time.sleep(0.02)  # (polls for a publish forwarded from the other node)
    raise AssertionError(f"no request in {queue!r} within {timeout_s} s")


def test_a_reply_published_on_another_node_reaches_the_requester(tmp_path: Path, etcd: EtcdProcess) -> None:
    with amqp_nodes(tmp_path, etcd) as (a, b):
        _round_trips(a, b)


def _round_trips(a: AMQPNode, b: AMQPNode) -> None:
    conn_a, conn_b = a.connect(), b.connect()
    try:
        requester = conn_a.channel()
        got: list[tuple[str, str, Any, bytes]] = []
        requester.basic_consume(
            REPLY_TO, lambda _c, m, p, body: got.append((m.consumer_tag, m.routing_key, p.correlation_id, body)),
            auto_ack=True, consumer_tag="replies")
        requester.queue_declare("rpc", durable=True, arguments=CLIENT_LOCAL)  # a's queue, served to b
        wait_for("b sees rpc", lambda: b.proc.request("GET", "/queues/rpc")[0] == 200)
        requester.basic_publish("", "rpc", b"question", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c1"))
        responder = conn_b.channel()
        responder.confirm_delivery()
        props, body = _take_request(responder, "rpc")
        address = props.reply_to
        assert body == b"question" and address.startswith(REPLY_TO + ".")

        # over AMQP on b: forwarded to a, confirmed once a took it
        responder.basic_publish("", address, b"answer", pika.BasicProperties(correlation_id="c1"))
        pump_until(conn_a, "the reply on a", lambda: got)
        assert got == [("replies", address, "c1", b"answer")]
        assert b.proc.request("GET", "/cluster")[1]["forwarding"]["forwarded"] >= 1
        # mandatory: returned on b (a reply routes to no queue), delivered on a all the same
        with pytest.raises(pika.exceptions.UnroutableError) as returned:
            responder.basic_publish("", address, b"mandatory", mandatory=True)
        assert [m.method.reply_code for m in returned.value.messages] == [312]
        pump_until(conn_a, "the mandatory reply on a", lambda: len(got) == 2)
        # over REST on b
        status, answer = b.proc.request("POST", f"/exchanges/amq.default/publish?routing_key={address}", b"by rest")
        assert status == 200 and answer["confirm"] == "ack", answer
        pump_until(conn_a, "the REST reply on a", lambda: len(got) == 3)
        assert [g[3] for g in got] == [b"answer", b"mandatory", b"by rest"]

        # an address made up with a's label: confirmed, never delivered
        label_and_secret, _dot, number = address[len(REPLY_TO) + 1:].rpartition(".")
        label = label_and_secret.split(".")[0]
        responder.basic_publish("", f"{REPLY_TO}.{label}.guessed.{number}", b"forged")
        # the requester goes: a reply to it is confirmed and dropped
        conn_a.close()
        responder.basic_publish("", address, b"too late")
        conn_a2 = a.connect()
        ch = conn_a2.channel()
        ch.basic_consume(REPLY_TO, lambda *args: got.append(args), auto_ack=True)
        conn_a2.process_data_events(time_limit=0.5)
        assert len(got) == 3
        conn_a2.close()
    finally:
        for conn in (conn_a, conn_b):
            if conn.is_open:
                conn.close()


def test_a_reply_consumer_cannot_take_the_tag_of_a_relayed_consumer(tmp_path: Path, etcd: EtcdProcess) -> None:
    """A consumer of another node's queue is not in this node's core, so the reply
    consumer's own tag check does not see it: the AMQP edge asks the channel's relays
    (RabbitMQ: 530, one tag names one consumer)."""
    with amqp_nodes(tmp_path, etcd) as (a, b):
        conn_b = b.connect()
        try:
            conn_b.channel().queue_declare("there", durable=True, arguments=CLIENT_LOCAL)  # b's queue
            wait_for("a sees there", lambda: a.proc.request("GET", "/queues/there")[0] == 200)
        finally:
            conn_b.close()
        # (py-amqp: pika refuses a tag it already has before sending the method)
        conn = py_amqp.Connection(f"127.0.0.1:{a.amqp_port}", heartbeat=0)
        conn.connect()
        try:
            ch = conn.channel()
            ch.basic_consume("there", consumer_tag="t", callback=lambda _m: None)  # relayed to b
            with pytest.raises(py_amqp.exceptions.NotAllowed) as closed:
                ch.basic_consume(REPLY_TO, consumer_tag="t", no_ack=True, callback=lambda _m: None)
                conn.drain_events(timeout=10)
            assert closed.value.reply_code == 530, closed.value
        finally:
            conn.collect()

"""Direct reply-to across a cluster with an HTTP channel as the requester (two nodes on
a private etcd), as tests/cluster/test_cluster_reply_to.py does for an AMQP one: the
requester consumes ``amq.rabbitmq.reply-to`` on node b and publishes its request to a
queue of node a (forwarded there, its ``reply_to`` already b's reply address); the
responders on a (pika, an HTTP channel, REST) reply to that address, which names b,
so a forwards each reply to b (broker/cluster/forward.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker.core import reply_node
from tests.cluster.conftest import wait_for
from tests.cluster.test_cluster_amqp import CLIENT_LOCAL, amqp_nodes
from tests.support.etcd import EtcdProcess
from tests.support.rawchannel import RawChannel

pika = pytest.importorskip("pika")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REPLY_TO = "amq.rabbitmq.reply-to"


def test_a_reply_published_on_another_node_reaches_the_http_requester(tmp_path: Path, etcd: EtcdProcess) -> None:
    with amqp_nodes(tmp_path, etcd) as (a, b):
        conn_a = a.connect()
        requester = RawChannel(b.proc.port, timeout_s=15)
        http_responder = RawChannel(a.proc.port, timeout_s=15)
        try:
            responder = conn_a.channel()
            responder.confirm_delivery()
            responder.queue_declare("rpc", durable=True, arguments=CLIENT_LOCAL)  # a's queue
            wait_for("b sees rpc", lambda: b.proc.request("GET", "/queues/rpc")[0] == 200)
            ok = requester.call({"op": "consume", "queue": REPLY_TO, "consumer_tag": "replies", "no_ack": True})
            assert ok["ev"] == "consume_ok", ok
            requester.send(*[
                {"op": "publish", "routing_key": "rpc", "body": f"call {n}",
                 "properties": {"reply_to": REPLY_TO, "correlation_id": f"c{n}"}}
                for n in range(3)
            ])
            assert requester.next_of("ack")  # (forwarded to a, confirmed by a)

            # (a) pika on a
            method, props, body = None, None, b""
            deadline = time.monotonic() + 15
            while method is None and time.monotonic() < deadline:
                method, props, body = responder.basic_get("rpc", auto_ack=True)
            assert method is not None and body == b"call 0"
            address = props.reply_to
            assert reply_node(address) == "b", address  # the requester's node, in the address
            responder.basic_publish("", address, body.upper(), pika.BasicProperties(correlation_id="c0"))
            # (b) an HTTP channel on a
            got = http_responder.call({"op": "get", "queue": "rpc", "no_ack": True})
            assert got["ev"] == "get_ok" and got["message"]["properties"]["reply_to"] == address, got
            http_responder.send({"op": "publish", "routing_key": address, "body": "CALL 1",
                                 "properties": {"correlation_id": "c1"}})
            assert http_responder.next_of("ack")["delivery_tag"] == 1
            # (c) REST on a
            status, answer = a.proc.request("POST", f"/exchanges/amq.default/publish?routing_key={address}",
                                            b"CALL 2", headers={"X-Correlation-Id": "c2"})
            assert status == 200 and answer["confirm"] == "ack", answer

            replies = [requester.next_of("deliver") for _ in range(3)]
            assert [(r["message"]["properties"]["correlation_id"], r["message"]["body"]) for r in replies] == [
                ("c0", "CALL 0"), ("c1", "CALL 1"), ("c2", "CALL 2")]
            assert {(r["consumer_tag"], r["exchange"], r["routing_key"]) for r in replies} == {
                ("replies", "", address)}
            assert a.proc.request("GET", "/cluster")[1]["forwarding"]["forwarded"] >= 3
        finally:
            requester.close()
            http_responder.close()
            if conn_a.is_open:
                conn_a.close()

"""AMQP 0-9-1 in cluster mode (pika against two nodes on a private etcd): declares,
binds and deletes made over AMQP go through the same etcd transactions as their REST
twins, so they are seen on every node, placement applies, conflicting declares fail
alike, and publishes over AMQP reach queues other nodes own (forwarded to them);
consumers and gets over AMQP reach queues other nodes own (relayed from them)."""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from pamqp import commands

from tests.amqp.rawclient import RawAMQP
from tests.cluster.conftest import (
    TTL_S,
    cluster_nodes,
    node_process,
    wait_for,
    wait_synced,
)
from tests.support.broker import BrokerProcess, free_port, stop_all
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


@contextlib.contextmanager
def amqp_nodes(tmp_path: Path, etcd: EtcdProcess, extra: tuple[str, ...] = ()) -> Iterator[tuple[AMQPNode, AMQPNode]]:
    """Nodes ``a`` and ``b``, each with an AMQP port (and ``extra`` arguments), once
    both are alive; stopped at the end."""
    started: list[BrokerProcess] = []
    out = []
    try:
        for name in ("a", "b"):
            port = free_port()
            proc = node_process(tmp_path, etcd, name, extra=(*extra, "--amqp-port", str(port)))
            started.append(proc)
            proc.start()
            wait_synced(proc)  # its view read from etcd: before, a declare on it answers 503
            out.append(AMQPNode(proc, port))
        wait_for("both alive", lambda: sum(n["alive"] for n in cluster_nodes(started[0]).values()) == 2)
        yield out[0], out[1]
    finally:
        stop_all(started)


@pytest.fixture
def two(tmp_path: Path, etcd: EtcdProcess) -> Iterator[tuple[AMQPNode, AMQPNode]]:
    with amqp_nodes(tmp_path, etcd) as nodes:
        yield nodes


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
        assert owners(a.proc)["qa"] == "a"  # read-your-writes on a; qb (declared on b) by a's watch
        wait_for("a sees both owners", lambda: owners(a.proc) == {"qa": "a", "qb": "b"})
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
        wait_for("qa gone on a", lambda: a.proc.request("GET", "/queues/qa")[0] == 404)  # (by a's watch)
        wait_for("the exchange gone on a", lambda: a.proc.request("GET", "/exchanges/amqp-fan")[0] == 404)
        assert owners(b.proc) == {"qb": "b"}
        # a server-named, exclusive queue lives on its node, and every node routes to it
        # (an RPC reply from another node)
        private = ch_a.queue_declare("", exclusive=True).method.queue
        assert private.startswith("amq.gen-") and owners(a.proc)[private] == "a"
        wait_for("b routes to it", lambda: owners(b.proc).get(private) == "a")
        ch_b.basic_publish("", private, b"reply")
        got = pump_until(conn_a, "the reply on a", lambda: ch_a.basic_get(private, auto_ack=True)[2])
        assert got == b"reply"
    finally:
        for conn in (conn_a, conn_b):
            if conn.is_open:
                conn.close()


def pump_until(conn: Any, what: str, check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    """Let pika take frames until ``check()`` is true; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        conn.process_data_events(time_limit=0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def queue_counts(node: BrokerProcess, queue: str) -> tuple[int, int]:
    status, body = node.request("GET", f"/queues/{queue}")
    assert status == 200, body
    return body["messages_ready"], body["messages_unacked"]


def _publish_on_a(a: AMQPNode, queue: str, bodies_: list[str]) -> None:
    conn = a.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies_:
            ch.basic_publish("", queue, body.encode(), pika.BasicProperties(delivery_mode=2, message_id=body))
    finally:
        conn.close()


def test_an_amqp_consumer_and_get_on_one_node_reach_a_queue_another_owns(two: tuple[AMQPNode, AMQPNode]) -> None:
    a, b = two
    conn_a = a.connect()
    conn_a.channel().queue_declare("work", durable=True, arguments=CLIENT_LOCAL)
    conn_a.close()
    assert owners(a.proc) == {"work": "a"}
    wait_for("b sees work's owner", lambda: owners(b.proc) == {"work": "a"})
    sent = [f"m{i:03}" for i in range(200)]
    _publish_on_a(a, "work", sent)

    conn = b.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=5)
        got: list[Any] = []
        cancelled: list[Any] = []
        ch.add_on_cancel_callback(cancelled.append)
        tag = ch.basic_consume("work", lambda _ch, method, props, body: got.append((method, props, body)))
        # prefetch holds on the owner: 5 delivered, none acked, no sixth
        pump_until(conn, "5 deliveries", lambda: len(got) >= 5)
        wait_for("5 unacked on the owner", lambda: queue_counts(a.proc, "work") == (195, 5))
        conn.process_data_events(time_limit=0.3)
        assert len(got) == 5
        assert [body.decode() for _m, _p, body in got] == sent[:5]
        assert got[0][1].message_id == "m000" and got[0][1].delivery_mode == 2
        assert len({m.delivery_tag for m, _p, _b in got}) == 5
        # a nack with requeue: the message comes back, redelivered
        first = got[0][0]
        ch.basic_nack(first.delivery_tag, requeue=True)
        pump_until(conn, "the nacked one again", lambda: any(
            m.redelivered and body == b"m000" for m, _p, body in got[5:]))
        # ack everything as it comes (a multiple ack now and then): each once, none lost
        settled = 0

        def ack_new() -> bool:
            nonlocal settled
            for method, _props, _body in got[settled:]:
                if method.delivery_tag == first.delivery_tag:
                    continue  # nacked above
                if method.delivery_tag % 7 == 0:
                    ch.basic_ack(method.delivery_tag, multiple=True)
                elif method.delivery_tag % 7 != 3:
                    ch.basic_ack(method.delivery_tag)
            settled = len(got)
            return len({body for _m, _p, body in got}) == 200

        pump_until(conn, "all 200 delivered", ack_new, timeout_s=60)
        ch.basic_ack(0, multiple=True)  # whatever is left unacked (the tags % 7 == 3)
        conn.process_data_events(time_limit=0.3)
        counts = collections.Counter(body.decode() for _m, _p, body in got)
        assert counts == collections.Counter(sent + ["m000"]), counts  # the nacked one twice, the rest once
        assert [body for m, _p, body in got if m.redelivered] == [b"m000"]
        wait_for("every ack reached the owner", lambda: queue_counts(a.proc, "work") == (0, 0))
        ch.basic_cancel(tag)

        # basic.get on b of a's queue: get-ok, settled later by its tag; get-empty
        _publish_on_a(a, "work", ["g1", "g2", "g3"])
        method, props, body = ch.basic_get("work")
        assert body == b"g1" and method.message_count == 2 and props.message_id == "g1", method
        wait_for("the get is unacked on the owner", lambda: queue_counts(a.proc, "work") == (2, 1))
        ch.basic_ack(method.delivery_tag)
        wait_for("its ack reached the owner", lambda: queue_counts(a.proc, "work") == (2, 0))
        method, _props, body = ch.basic_get("work", auto_ack=True)
        assert body == b"g2" and method.message_count == 1
        method, _props, body = ch.basic_get("work")
        assert body == b"g3" and not method.redelivered
        wait_for("g3 unacked on the owner", lambda: queue_counts(a.proc, "work") == (0, 1))
        ch.basic_recover(requeue=True)  # back on the owner, redelivered
        wait_for("g3 recovered", lambda: queue_counts(a.proc, "work") == (1, 0))
        method, _props, body = ch.basic_get("work")
        assert body == b"g3" and method.redelivered
        assert ch.basic_get("work") == (None, None, None)  # get-empty
        # a get not settled goes back to the owner's queue when the channel closes
        wait_for("g3 unacked", lambda: queue_counts(a.proc, "work") == (0, 1))
        ch.close()
        wait_for("g3 requeued", lambda: queue_counts(a.proc, "work") == (1, 0))

        # a relayed consumer whose queue the owner deletes gets basic.cancel
        ch = conn.channel()
        ch.add_on_cancel_callback(cancelled.append)
        tag = ch.basic_consume("work", lambda *_args: None)
        assert a.proc.request("DELETE", "/queues/work")[0] == 200
        pump_until(conn, "basic.cancel from the server", lambda: cancelled)
        assert cancelled[0].method.consumer_tag == tag
        assert ch.is_open
    finally:
        if conn.is_open:
            conn.close()


async def _reuse_a_relayed_consumer_tag(port: int) -> list[int]:
    """Consume ``jobs`` (another node's) as ``dup``, then consume ``jobs`` and then a
    queue of this node's under the same tag, each on a connection of its own: the
    reply codes of the connection closes (530 is a connection exception)."""
    codes = []
    for second in ("jobs", ""):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            client = RawAMQP(stream)
            await client.handshake()
            await client.open_channel(1)
            if not second:
                second = (await client.declare(1, "", exclusive=True)).queue
            await client.send(1, commands.Basic.Consume(queue="jobs", consumer_tag="dup"))
            await client.expect(commands.Basic.ConsumeOk, 1)
            await client.send(1, commands.Basic.Consume(queue=second, consumer_tag="dup"))
            codes.append((await client.closed_with(None))[0])
        finally:
            await stream.aclose()
    return codes


def test_an_amqp_consumer_relayed_from_a_node_that_dies_is_cancelled(two: tuple[AMQPNode, AMQPNode]) -> None:
    a, b = two
    conn_a = a.connect()
    conn_a.channel().queue_declare("jobs", durable=True, arguments=CLIENT_LOCAL)
    conn_a.close()
    wait_for("b sees jobs' owner", lambda: owners(b.proc) == {"jobs": "a"})
    conn = b.connect()
    try:
        # a consumer tag in use on the channel, relayed or not, is 530 NOT_ALLOWED, a
        # connection exception (pika refuses to send it: a raw client)
        assert trio.run(_reuse_a_relayed_consumer_tag, b.amqp_port) == [530, 530]
        _publish_on_a(a, "jobs", ["j1"])
        ch = conn.channel()
        cancelled: list[Any] = []
        got: list[bytes] = []
        ch.add_on_cancel_callback(cancelled.append)
        tag = ch.basic_consume("jobs", lambda _ch, _m, _p, body: got.append(body))
        pump_until(conn, "j1 delivered", lambda: got == [b"j1"])
        a.proc.kill()
        # RabbitMQ's consumer cancel notification when the queue's node goes down
        pump_until(conn, "basic.cancel from the server", lambda: cancelled)
        assert cancelled[0].method.consumer_tag == tag and ch.is_open
        wait_for("a dead on b", lambda: not cluster_nodes(b.proc)["a"]["alive"], timeout_s=TTL_S + 8)
        # consume and get of a queue whose node is down: 404, as RabbitMQ's classic queue
        for attempt in (lambda c: c.basic_consume("jobs", lambda *_args: None), lambda c: c.basic_get("jobs")):
            ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                attempt(ch)
            assert refused.value.reply_code == 404, refused.value
            assert "home node 'a' of durable queue 'jobs'" in refused.value.reply_text
            assert "is down or inaccessible" in refused.value.reply_text
        assert conn.is_open
    finally:
        if conn.is_open:
            conn.close()
    a.proc.start()
    wait_synced(a.proc)  # (alive on b as soon as it registered, before it read its view)
    wait_for("a back on b", lambda: cluster_nodes(b.proc)["a"]["alive"])
    assert bodies(b.proc, "jobs") == ["j1"]  # delivered, never acked: requeued, not lost


def test_a_declare_ok_of_a_queue_another_node_owns_counts_on_the_owner(two: tuple[AMQPNode, AMQPNode]) -> None:
    """``queue.declare-ok`` on node b of a queue node a owns gives a's counts of ready
    messages and consumers (kombu's ``queue_declare`` returns them)."""
    a, b = two
    conn_a, conn_b = a.connect(), b.connect()
    try:
        ch_a = conn_a.channel()
        ch_a.confirm_delivery()
        ch_a.queue_declare("counted", durable=True, arguments=CLIENT_LOCAL)
        for i in range(3):
            ch_a.basic_publish("", "counted", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        assert owners(a.proc)["counted"] == "a"
        wait_for("b sees the queue", lambda: "counted" in owners(b.proc))
        ch_b = conn_b.channel()
        ok = ch_b.queue_declare("counted", passive=True).method
        assert (ok.message_count, ok.consumer_count) == (3, 0), ok
        # a consumer on the owner taking one message (prefetch 1): 2 ready, 1 consumer
        ch_a.basic_qos(prefetch_count=1)
        ch_a.basic_consume("counted", lambda *args: None)
        wait_for("one delivered on a", lambda: a.proc.request("GET", "/queues/counted")[1]["messages_ready"] == 2)
        ok = ch_b.queue_declare("counted", durable=True, arguments=CLIENT_LOCAL).method
        assert (ok.message_count, ok.consumer_count) == (2, 1), ok
    finally:
        conn_a.close()
        conn_b.close()


def test_amqp_publishes_forwarded_to_the_owner_are_deduplicated_only_when_asked(
    two: tuple[AMQPNode, AMQPNode],
) -> None:
    """Publishes over AMQP on node a to a queue node b owns, each message id twice: b
    enqueues every copy (as RabbitMQ: the forwarded publish says ``"dedup": false``),
    in a transaction too; for a connection that sent ``x-deduplicate: true``, b takes
    one copy of each id (docs/amqp.md, "Deduplication")."""
    a, b = two
    conn_b = b.connect()
    conn_b.channel().queue_declare("dq", durable=True, arguments=CLIENT_LOCAL)
    conn_b.close()
    wait_for("a sees dq's owner", lambda: owners(a.proc).get("dq") == "b")

    def publish_twice(client_properties: dict[str, Any], ids: list[str], *, tx: bool = False) -> None:
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", a.amqp_port, heartbeat=30, client_properties=client_properties))
        try:
            ch = conn.channel()
            if tx:
                ch.tx_select()
            else:
                ch.confirm_delivery()
            for message_id in ids:
                for copy in ("1", "2"):
                    props = pika.BasicProperties(delivery_mode=2, message_id=message_id)
                    ch.basic_publish("", "dq", f"{message_id}/{copy}".encode(), props)
            if tx:
                ch.tx_commit()
        finally:
            conn.close()

    publish_twice({}, ["plain"])
    publish_twice({}, ["in-tx"], tx=True)
    publish_twice({"x-deduplicate": True}, ["asked"])
    publish_twice({"x-deduplicate": True}, ["asked-in-tx"], tx=True)
    messages = b.proc.drain("dq")
    assert [(m["body"], m["properties"]["message_id"]) for m in messages] == [
        ("plain/1", "plain"), ("plain/2", "plain"), ("in-tx/1", "in-tx"), ("in-tx/2", "in-tx"),
        ("asked/1", "asked"), ("asked-in-tx/1", "asked-in-tx"),
    ]
    assert a.proc.request("GET", "/cluster")[1]["forwarding"]["forwarded"] >= 6

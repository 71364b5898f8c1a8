"""A transaction's settles of deliveries relayed from another node's queue (two nodes on
a private etcd; docs/cluster.md, "Transactions"): held on the channel like a local
delivery's, sent to the owner at the commit (whose answer waits for the owner's), and
dropped by a rollback (the deliveries stay unacked on the owner); a ``multiple`` ack
over local and relayed deliveries splits between this node's core and the owner; an
owner lost before the commit fails it with a channel error. Over the channel protocol
(RawChannel) and AMQP (pika), each against node a: queue qa is a's, qb is b's."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.cluster.test_cluster_tx import _until, two
from tests.support.broker import BrokerProcess
from tests.support.rawchannel import RawChannel

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.slow

__all__ = ["two"]  # (the fixture, shared with test_cluster_tx.py)


class _Counts:
    """(ready, unacked) of qa on a and qb on b, as their owners count them, less the
    probes the fixture took as leases (unacked until they run out)."""

    def __init__(self, a: BrokerProcess, b: BrokerProcess) -> None:
        self.owners = {"qa": a, "qb": b}
        self.leased = {q: self._read(q)[1] for q in self.owners}

    def _read(self, queue: str) -> tuple[int, int]:
        status, q = self.owners[queue].request("GET", f"/queues/{queue}")
        assert status == 200, q
        return int(q["messages_ready"]), int(q["messages_unacked"])

    def __call__(self, queue: str) -> tuple[int, int]:
        ready, unacked = self._read(queue)
        return ready, unacked - self.leased[queue]


def _fill(a: BrokerProcess, b: BrokerProcess, count: int) -> _Counts:
    """``count`` messages in qa (on a) and in qb (on b), through fanout txfan; their
    counts from now on."""
    counts = _Counts(a, b)
    for i in range(count):
        status, answer = b.request("POST", "/exchanges/txfan/publish", f"m{i}".encode())
        assert status == 200 and answer.get("routed") == 2, answer
    assert counts("qa") == (count, 0) and counts("qb") == (count, 0)
    return counts


def _get(ch: RawChannel, queue: str) -> int:
    ch.send({"op": "get", "queue": queue, "id": queue})
    ev = ch.next_event()
    assert ev["ev"] == "get_ok", ev
    return int(ev["delivery_tag"])


def _op(ch: RawChannel, op: str) -> dict[str, Any]:
    ch.send({"op": op})
    reply = _until(ch, op)[1]
    assert reply["ev"] == "ok", reply
    return reply


def test_channel_relayed_acks_in_a_transaction_wait_for_the_commit(two: tuple[BrokerProcess, BrokerProcess, int]) -> None:
    a, b, _amqp_port = two
    counts = _fill(a, b, 4)
    ch = RawChannel(a.port)
    try:
        # deliveries 1 and 3 are a's own (qa), 2 and 4 relayed from b (qb)
        tags = [_get(ch, q) for q in ("qa", "qb", "qa", "qb")]
        assert tags == [1, 2, 3, 4]
        assert counts("qb") == (2, 2)
        _op(ch, "tx_select")
        ch.send({"op": "ack", "delivery_tag": 2})
        assert _op(ch, "tx_rollback")["operations"] == 1
        # rolled back: tag 2 stays unacked on b. The commit of an ack of tag 4 answers
        # once b has it (sent on the same relay after anything sent for tag 2 before)
        ch.send({"op": "ack", "delivery_tag": 4})
        assert _op(ch, "tx_commit")["operations"] == 1
        assert counts("qb") == (2, 1)
        # a multiple ack up to a's tag 3: a's 1 and 3 here, the relayed 2 on b, all
        # held until the commit
        ch.send({"op": "ack", "delivery_tag": 3, "multiple": True})
        assert counts("qa") == (2, 2)
        assert _op(ch, "tx_commit")["operations"] == 2
        assert counts("qa") == (2, 0)
        assert counts("qb") == (2, 0)
        # a second settle of the same relayed tag in one transaction is refused at once
        tag = _get(ch, "qb")
        ch.send({"op": "ack", "delivery_tag": tag}, {"op": "ack", "delivery_tag": tag, "id": "again"})
        error = _until(ch, "never")[1]
        assert error["error"] == "unknown_delivery_tag" and error.get("id") == "again", error
    finally:
        ch.close()


def test_amqp_relayed_acks_in_a_transaction_wait_for_the_commit(two: tuple[BrokerProcess, BrokerProcess, int]) -> None:
    a, b, amqp_port = two
    counts = _fill(a, b, 4)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=30))
    try:
        amqp = conn.channel()
        got = [amqp.basic_get(q) for q in ("qa", "qb", "qa", "qb")]
        tags = [method.delivery_tag for method, _props, _body in got]
        assert tags == [1, 2, 3, 4]
        amqp.tx_select()
        amqp.basic_ack(2)
        amqp.tx_rollback()
        amqp.basic_ack(4)
        amqp.tx_commit()  # (answers once b has committed it: after the rolled back ack)
        assert counts("qb") == (2, 1)
        # mixed: a multiple ack up to a's tag 3: 1 and 3 here, the relayed 2 on b
        amqp.basic_ack(3, multiple=True)
        assert counts("qa") == (2, 2)
        amqp.tx_commit()
        assert counts("qa") == (2, 0)
        assert counts("qb") == (2, 0)
        # a nack (requeue) in a transaction, rolled back, then committed
        method, _props, _body = amqp.basic_get("qb")
        amqp.basic_nack(method.delivery_tag, requeue=True)
        amqp.tx_rollback()
        amqp.basic_ack(method.delivery_tag)
        amqp.tx_commit()
        assert counts("qb") == (1, 0)
    finally:
        if conn.is_open:
            conn.close()


@pytest.mark.parametrize("ack_before_the_loss", [True, False])
def test_an_owner_lost_before_the_commit_refuses_it(
    two: tuple[BrokerProcess, BrokerProcess, int], ack_before_the_loss: bool,
) -> None:
    a, b, _amqp_port = two
    counts = _fill(a, b, 1)
    ch = RawChannel(a.port)
    try:
        _op(ch, "tx_select")
        ch.send({"op": "consume", "queue": "qb", "consumer_tag": "c", "prefetch": 1})
        delivered = next(e for e in iter(ch.next_event, None) if e["ev"] == "deliver")
        tag = delivered["delivery_tag"]
        ch.send({"op": "publish", "routing_key": "qa", "body": "in the transaction"})
        if ack_before_the_loss:
            ch.send({"op": "ack", "delivery_tag": tag})
        b.kill()
        # the relayed consumer is cancelled once a sees the connection to b lost
        cancel = next(e for e in iter(ch.next_event, None) if e["ev"] == "cancel")
        assert cancel["consumer_tag"] == "c" and "node 'b'" in cancel["reason"], cancel
        if not ack_before_the_loss:
            ch.send({"op": "ack", "delivery_tag": tag})
        ch.send({"op": "tx_commit"})
        error = _until(ch, "tx_commit")[1]
        assert error["ev"] == "error" and error["error"] == "queue_unavailable", error
        assert "nothing of it applied" in error["message"] and "node 'b'" in error["message"], error
        assert counts("qa") == (1, 0)  # (the publish was not applied either)
    finally:
        ch.close()


def test_amqp_a_relayed_consumers_acks_in_a_transaction(two: tuple[BrokerProcess, BrokerProcess, int]) -> None:
    a, b, amqp_port = two
    counts = _fill(a, b, 3)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=30))
    try:
        amqp = conn.channel()
        amqp.tx_select()
        got: list[Any] = []
        amqp.basic_consume("qb", lambda _ch, method, _props, _body: got.append(method))
        deadline = time.monotonic() + 15
        while len(got) < 3 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        assert len(got) == 3, got
        tags = [m.delivery_tag for m in got]
        amqp.basic_ack(tags[1], multiple=True)  # the first two
        amqp.tx_rollback()
        amqp.basic_ack(tags[2])
        amqp.tx_commit()  # (answers once b has committed it: after the rolled back ack)
        assert counts("qb") == (0, 2)
        amqp.basic_ack(tags[1], multiple=True)
        amqp.tx_commit()
        assert counts("qb") == (0, 0)
    finally:
        if conn.is_open:
            conn.close()

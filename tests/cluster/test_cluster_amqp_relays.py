"""AMQP consumers relayed from another node's queue (docs/cluster.md, docs/amqp.md):
``basic.qos`` after ``basic.consume`` applies on the owner as it does to a local
consumer (RabbitMQ's rules: a per-consumer prefetch for consumers made after it, a
global one to the channel's consumers at once), ``x-priority`` reaches the owner, and
a ``multiple`` ack over this node's and relayed deliveries settles both."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.conftest import wait_for
from tests.cluster.test_cluster_amqp import (
    CLIENT_LOCAL,
    AMQPNode,
    _publish_on_a,
    owners,
    pump_until,
    queue_counts,
    two,
)

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.slow

__all__ = ["two"]  # (the fixture, shared with test_cluster_amqp.py)


def _work_on_a(a: AMQPNode, b: AMQPNode, queue: str, count: int) -> list[str]:
    conn = a.connect()
    conn.channel().queue_declare(queue, durable=True, arguments=CLIENT_LOCAL)
    conn.close()
    wait_for(f"b sees {queue}'s owner", lambda: owners(b.proc).get(queue) == "a")
    sent = [f"{queue}-{i:02}" for i in range(count)]
    _publish_on_a(a, queue, sent)
    return sent


def _settled_for(conn: Any, seconds: float) -> None:
    """Let pika take frames for a while (a check that nothing more arrives)."""
    conn.process_data_events(time_limit=seconds)


def test_a_global_qos_after_consume_changes_the_prefetch_the_owner_applies(two: tuple[AMQPNode, AMQPNode]) -> None:
    a, b = two
    _work_on_a(a, b, "work", 20)
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=2, global_qos=True)
        got: list[Any] = []
        ch.basic_consume("work", lambda _ch, method, _props, _body: got.append(method))
        wait_for("2 unacked on the owner", lambda: queue_counts(a.proc, "work") == (18, 2))
        pump_until(conn, "2 delivered", lambda: len(got) == 2)
        # raised: the owner lets 2 more go at once
        ch.basic_qos(prefetch_count=4, global_qos=True)
        wait_for("4 unacked on the owner", lambda: queue_counts(a.proc, "work") == (16, 4))
        # lowered below what is out: nothing more until acks bring it under
        ch.basic_qos(prefetch_count=1, global_qos=True)
        pump_until(conn, "4 delivered", lambda: len(got) == 4)
        ch.basic_ack(got[0].delivery_tag)
        ch.basic_ack(got[1].delivery_tag)
        wait_for("2 acked on the owner", lambda: queue_counts(a.proc, "work") == (16, 2))
        _settled_for(conn, 0.5)
        assert len(got) == 4 and queue_counts(a.proc, "work") == (16, 2)
        # 0: no limit
        ch.basic_qos(prefetch_count=0, global_qos=True)
        wait_for("everything out", lambda: queue_counts(a.proc, "work") == (0, 18))
    finally:
        if conn.is_open:
            conn.close()


def test_a_per_consumer_qos_after_consume_applies_to_later_consumers_only(two: tuple[AMQPNode, AMQPNode]) -> None:
    a, b = two
    _work_on_a(a, b, "work", 20)
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=2)
        first: list[Any] = []
        second: list[Any] = []
        ch.basic_consume("work", lambda _ch, method, _props, _body: first.append(method))
        wait_for("2 unacked on the owner", lambda: queue_counts(a.proc, "work") == (18, 2))
        ch.basic_qos(prefetch_count=5)  # RabbitMQ: for consumers made after it
        pump_until(conn, "2 delivered", lambda: len(first) == 2)
        _settled_for(conn, 0.5)
        assert len(first) == 2 and queue_counts(a.proc, "work") == (18, 2)
        ch.basic_consume("work", lambda _ch, method, _props, _body: second.append(method))
        wait_for("5 more unacked on the owner", lambda: queue_counts(a.proc, "work") == (13, 7))
        pump_until(conn, "5 delivered to the second", lambda: len(second) == 5)
        assert len(first) == 2
    finally:
        if conn.is_open:
            conn.close()


def test_a_global_qos_bounds_each_relayed_consumer_on_its_own(two: tuple[AMQPNode, AMQPNode]) -> None:
    """A channel-wide limit is not shared across the owners' channels: each relayed
    consumer of the channel gets up to it (docs/cluster.md)."""
    a, b = two
    _work_on_a(a, b, "work", 20)
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=3, global_qos=True)
        got: list[Any] = []
        for _ in range(2):
            ch.basic_consume("work", lambda _ch, method, _props, _body: got.append(method))
        wait_for("3 unacked per relayed consumer", lambda: queue_counts(a.proc, "work") == (14, 6))
        pump_until(conn, "6 delivered", lambda: len(got) == 6)
        assert len({m.consumer_tag for m in got}) == 2
    finally:
        if conn.is_open:
            conn.close()


def test_x_priority_of_a_relayed_consumer_applies_on_the_owner(two: tuple[AMQPNode, AMQPNode]) -> None:
    a, b = two
    _work_on_a(a, b, "work", 0)
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=3)
        got: list[Any] = []
        ch.basic_consume("work", lambda _ch, m, _p, _b: got.append(m), arguments={"x-priority": 0})
        high = ch.basic_consume("work", lambda _ch, m, _p, _b: got.append(m), arguments={"x-priority": 10})
        wait_for("both consumers on the owner", lambda: a.proc.request("GET", "/queues/work")[1]["consumers"] == 2)
        _publish_on_a(a, "work", ["p1", "p2", "p3"])
        pump_until(conn, "3 delivered", lambda: len(got) == 3)
        # both had room for each; the owner chose the higher priority every time
        assert [m.consumer_tag for m in got] == [high, high, high]
    finally:
        if conn.is_open:
            conn.close()


def test_a_multiple_ack_over_local_and_relayed_deliveries_settles_both(two: tuple[AMQPNode, AMQPNode]) -> None:
    a, b = two
    _work_on_a(a, b, "remote", 3)
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("local", durable=True, arguments=CLIENT_LOCAL)
        for i in range(3):
            ch.basic_publish("", "local", f"local-{i}".encode(), pika.BasicProperties(delivery_mode=2))
        got: list[Any] = []
        ch.basic_consume("local", lambda _ch, m, _p, body: got.append((m, body)))
        pump_until(conn, "3 local delivered", lambda: len(got) == 3)
        ch.basic_consume("remote", lambda _ch, m, _p, body: got.append((m, body)))
        pump_until(conn, "3 relayed delivered", lambda: len(got) == 6)
        ch.basic_consume("local", lambda _ch, m, _p, body: got.append((m, body)))  # (none left)
        ch.basic_publish("", "local", b"local-3", pika.BasicProperties(delivery_mode=2))
        pump_until(conn, "one more local delivered", lambda: len(got) == 7)
        tags = [m.delivery_tag for m, _body in got]
        assert tags == sorted(tags) and len(set(tags)) == 7
        # a multiple ack up to a relayed tag: relayed up to it, and this node's before it
        ch.basic_ack(got[4][0].delivery_tag, multiple=True)
        wait_for("2 relayed acked on the owner", lambda: queue_counts(a.proc, "remote") == (0, 1))
        wait_for("3 local acked", lambda: queue_counts(b.proc, "local") == (0, 1))
        # a multiple ack up to a local tag: both kinds before it
        ch.basic_ack(got[6][0].delivery_tag, multiple=True)
        wait_for("the last relayed acked on the owner", lambda: queue_counts(a.proc, "remote") == (0, 0))
        wait_for("the last local acked", lambda: queue_counts(b.proc, "local") == (0, 0))
    finally:
        if conn.is_open:
            conn.close()


def test_a_global_qos_bounds_a_local_and_a_relayed_consumer_of_one_channel_each_on_its_own(
    two: tuple[AMQPNode, AMQPNode],
) -> None:
    """docs/amqp.md: a ``global`` prefetch bounds each relayed consumer on its own, not
    all of the channel's consumers together: on a channel consuming a queue of this
    node and one of another node, each gets up to the limit (the relayed deliveries
    count on the owner's channel, the local ones on this node's)."""
    a, b = two
    _work_on_a(a, b, "remote", 10)
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("local", durable=True, arguments=CLIENT_LOCAL)
        for i in range(10):
            ch.basic_publish("", "local", f"local-{i}".encode(), pika.BasicProperties(delivery_mode=2))
        ch.basic_qos(prefetch_count=2, global_qos=True)
        got: list[Any] = []
        ch.basic_consume("remote", lambda _ch, m, _p, _b: got.append(m))
        ch.basic_consume("local", lambda _ch, m, _p, _b: got.append(m))
        pump_until(conn, "4 delivered", lambda: len(got) == 4)
        wait_for("2 unacked on the owner", lambda: queue_counts(a.proc, "remote") == (8, 2))
        assert queue_counts(b.proc, "local") == (8, 2)
        _settled_for(conn, 0.5)
        assert len(got) == 4 and queue_counts(a.proc, "remote") == (8, 2) and queue_counts(b.proc, "local") == (8, 2)
        # an ack of a relayed delivery makes room for the relayed consumer only
        relayed = [m for m in got if m.routing_key == "remote"]
        ch.basic_ack(relayed[0].delivery_tag)
        pump_until(conn, "one more relayed delivered", lambda: len(got) == 5)
        assert got[-1].routing_key == "remote"
        _settled_for(conn, 0.5)
        assert queue_counts(a.proc, "remote") == (7, 2) and queue_counts(b.proc, "local") == (8, 2)
    finally:
        if conn.is_open:
            conn.close()


def test_a_higher_priority_relayed_consumer_is_served_before_a_lower_one_on_the_owner(
    two: tuple[AMQPNode, AMQPNode],
) -> None:
    """docs/amqp.md: ``x-priority`` of a relayed consumer applies on the owner, against
    the owner's own consumers too: a higher-priority relayed consumer with room gets
    every message before a lower-priority consumer on the owner node itself."""
    a, b = two
    _work_on_a(a, b, "work", 0)
    conn_a, conn_b = a.connect(), b.connect()
    try:
        ch_a, ch_b = conn_a.channel(), conn_b.channel()
        ch_a.basic_qos(prefetch_count=5)
        ch_b.basic_qos(prefetch_count=5)
        local: list[Any] = []
        relayed: list[Any] = []
        ch_a.basic_consume("work", lambda _ch, m, _p, _b: local.append(m), arguments={"x-priority": 1})
        ch_b.basic_consume("work", lambda _ch, m, _p, _b: relayed.append(m), arguments={"x-priority": 5})
        wait_for("both consumers on the owner", lambda: a.proc.request("GET", "/queues/work")[1]["consumers"] == 2)
        _publish_on_a(a, "work", ["p1", "p2", "p3", "p4"])
        pump_until(conn_b, "4 delivered to the relayed consumer", lambda: len(relayed) == 4)
        _settled_for(conn_a, 0.5)
        assert local == [] and queue_counts(a.proc, "work") == (0, 4)
        # once the higher one is full, the lower one on the owner gets the rest
        _publish_on_a(a, "work", ["p5", "p6"])
        pump_until(conn_a, "the rest to the owner's own consumer", lambda: len(local) == 1)
        pump_until(conn_b, "one more to the relayed consumer", lambda: len(relayed) == 5)
        assert len(local) == 1
    finally:
        for conn in (conn_a, conn_b):
            if conn.is_open:
                conn.close()

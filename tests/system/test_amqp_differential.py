"""Differential test: one script of AMQP operations run with pika against ackbus's AMQP
port and against a private RabbitMQ must observe the same things: deliveries and their
order, redelivered flags, message counts, returns, confirms, and the reply codes of
refused operations. Skipped (with the reason) where Debian's rabbitmq-server is not
installed; RabbitMQ is started by PID as the bench does (bench/servers.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.system.amqp_diff_support import Log, RabbitServer, compare
from tests.system.amqp_diff_support import collect as _collect
from tests.system.amqp_diff_support import connect as _connect
from tests.system.amqp_diff_support import get_all as _get_all
from tests.system.amqp_diff_support import refused as _refused

pika = pytest.importorskip("pika")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def script(port: int) -> Log:
    log: Log = []
    conn = _connect(port)
    ch = conn.channel()
    ch.exchange_declare("d.direct", "direct")
    ch.exchange_declare("d.topic", "topic")
    ch.exchange_declare("d.headers", "headers")
    ch.exchange_declare("d.fanout", "fanout")
    ch.queue_declare("d.q1")
    ch.queue_declare("d.q2")
    ch.queue_bind("d.q1", "d.direct", "k1")
    ch.queue_bind("d.q2", "d.topic", "a.*.c")
    ch.queue_bind("d.q2", "d.headers", arguments={"x-match": "any", "h": "1", "g": "2"})
    ch.exchange_bind("d.direct", "d.fanout")  # fanout -> direct (routing key kept)

    # confirms, returns
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("d.direct", "k1", b"m%d" % i)
    try:
        ch.basic_publish("d.direct", "nowhere", b"lost", mandatory=True)
        log.append(("mandatory", "confirmed without return"))
    except pika.exceptions.UnroutableError as exc:
        log.append(("returned", [(m.method.reply_code, m.method.reply_text, m.body) for m in exc.messages]))
    ch.basic_publish("d.direct", "nowhere", b"dropped")  # unroutable, not mandatory: acked
    ch.basic_publish("d.fanout", "k1", b"via-fanout")
    for key in ("a.b.c", "a.b", "a.x.c"):
        ch.basic_publish("d.topic", key, key.encode())
    for headers in ({"h": "1"}, {"g": "2"}, {"h": "0"}):
        ch.basic_publish("d.headers", "", repr(headers).encode(), pika.BasicProperties(headers=headers))
    log.append(("q1 count", ch.queue_declare("d.q1", passive=True).method.message_count))

    # get, nack/requeue, redelivered flags
    method, _p, body = ch.basic_get("d.q1")
    log.append(("get", body, method.redelivered, method.message_count))
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _p, body = ch.basic_get("d.q1")
    log.append(("get again", body, method.redelivered))
    ch.basic_reject(method.delivery_tag, requeue=True)

    # consume with prefetch, ack multiple
    ch.basic_qos(prefetch_count=2)
    got = []
    for method, _props, body in ch.consume("d.q1", inactivity_timeout=3):
        if method is None:
            break
        got.append((body, method.redelivered))
        if len(got) % 2 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if len(got) == 4:
            break
    ch.cancel()
    log.append(("consumed", got))
    log.append(("topic+headers", sorted(_get_all(ch, "d.q2"))))

    # tx
    tx = conn.channel()
    tx.tx_select()
    tx.basic_publish("", "d.q1", b"tx-rolled-back")
    tx.tx_rollback()
    tx.basic_publish("", "d.q1", b"tx-committed")
    tx.tx_commit()
    log.append(("after tx", _get_all(ch, "d.q1")))

    # arguments: priority, max-length, dead letters
    ch.queue_declare("d.prio", arguments={"x-max-priority": 10})
    for p in (1, 5, 3, 5):
        ch.basic_publish("", "d.prio", b"p%d" % p, pika.BasicProperties(priority=p))
    log.append(("priority order", _get_all(ch, "d.prio")))
    ch.queue_declare("d.short", arguments={"x-max-length": 2})
    for i in range(4):
        ch.basic_publish("", "d.short", b"s%d" % i)
    log.append(("max-length", _get_all(ch, "d.short")))
    ch.queue_declare("d.dlq")
    ch.queue_declare("d.work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "d.dlq"})
    ch.basic_publish("", "d.work", b"dead")
    method, _p, _b = ch.basic_get("d.work")
    ch.basic_reject(method.delivery_tag, requeue=False)
    deadline = time.monotonic() + 10  # dead-lettering is asynchronous in RabbitMQ
    method, props, body = ch.basic_get("d.dlq", auto_ack=True)
    while method is None and time.monotonic() < deadline:
        time.sleep(0.02)
        method, props, body = ch.basic_get("d.dlq", auto_ack=True)
    log.append(("dead-lettered", body, props.headers["x-death"][0]["reason"], props.headers["x-death"][0]["queue"]))

    # alternate exchange, channel close requeue, recover, counts with a consumer
    ch.exchange_declare("d.ae", "fanout")
    ch.queue_declare("d.aeq")
    ch.queue_bind("d.aeq", "d.ae")
    ch.exchange_declare("d.withae", "direct", arguments={"alternate-exchange": "d.ae"})
    ch.basic_publish("d.withae", "nobody", b"to-ae")
    log.append(("alternate exchange", _get_all(ch, "d.aeq")))
    ch.basic_publish("", "d.q1", b"unacked")
    holder = conn.channel()
    method, _p, body = holder.basic_get("d.q1")
    log.append(("held", body, method.redelivered))
    holder.close()
    method, _p, body = ch.basic_get("d.q1", auto_ack=True)
    log.append(("after channel close", body, method.redelivered))
    rc = conn.channel()
    rc.basic_publish("", "d.q1", b"recovered")
    method, _p, body = rc.basic_get("d.q1")
    rc.basic_recover(requeue=True)
    method, _p, body = rc.basic_get("d.q1", auto_ack=True)
    log.append(("after recover", body, method.redelivered))
    rc.basic_consume("d.q1", lambda *a: None, consumer_tag="counted")
    ok = ch.queue_declare("d.q1", passive=True).method
    log.append(("declare-ok counts", ok.message_count, ok.consumer_count))
    _refused(log, conn, "delete if-unused with a consumer", lambda c: c.queue_delete("d.q1", if_unused=True))
    _refused(log, conn, "delete exchange if-unused with a binding", lambda c: c.exchange_delete("d.ae", if_unused=True))
    rc.close()

    # purge and delete counts
    for i in range(3):
        ch.basic_publish("", "d.q2", b"x")
    log.append(("purge", ch.queue_purge("d.q2").method.message_count))
    ch.basic_publish("", "d.q2", b"x")
    log.append(("delete", ch.queue_delete("d.q2").method.message_count))
    log.append(("server-named", ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")))

    # refused operations and their reply codes
    _refused(log, conn, "passive missing queue", lambda c: c.queue_declare("d.none", passive=True))
    _refused(log, conn, "passive missing exchange", lambda c: c.exchange_declare("d.none", passive=True))
    _refused(log, conn, "redeclare other args", lambda c: c.queue_declare("d.q1", arguments={"x-max-length": 1}))
    _refused(log, conn, "redeclare other durability", lambda c: c.queue_declare("d.q1", durable=True))
    _refused(log, conn, "exchange redeclare other type", lambda c: c.exchange_declare("d.direct", "fanout"))
    _refused(log, conn, "declare amq.*", lambda c: c.exchange_declare("amq.mine", "direct"))
    _refused(log, conn, "publish to missing exchange", lambda c: c.basic_publish("d.none", "k", b"x"))
    _refused(log, conn, "ack unknown tag", lambda c: c.basic_ack(42))
    _refused(log, conn, "bind missing queue", lambda c: c.queue_bind("d.none", "d.direct", "k"))
    _refused(log, conn, "bind missing exchange", lambda c: c.queue_bind("d.q1", "d.none", "k"))
    _refused(log, conn, "consume missing queue", lambda c: c.basic_consume("d.none", lambda *a: None))
    _refused(log, conn, "tx commit without select", lambda c: c.tx_commit())

    def delete_if_empty(c: Any) -> None:
        c.basic_publish("", "d.q1", b"x")
        c.queue_delete("d.q1", if_empty=True)

    _refused(log, conn, "delete if-empty non-empty", delete_if_empty)

    def tx_then_confirm(c: Any) -> None:
        c.tx_select()
        c.confirm_delivery()

    _refused(log, conn, "confirm after tx", tx_then_confirm)
    other = _connect(port)
    oc = other.channel()
    oc.queue_declare("d.excl", exclusive=True)
    _refused(log, conn, "exclusive queue of another connection", lambda c: c.queue_declare("d.excl"))
    oc.basic_consume("d.q1", lambda *a: None, exclusive=True)
    _refused(log, conn, "consume beside an exclusive consumer", lambda c: c.basic_consume("d.q1", lambda *a: None))
    other.close()
    if _refused(log, conn, "unknown exchange type", lambda c: c.exchange_declare("d.bad", "nonsense")) == "reconnect":
        conn = _connect(port)
    # cleanup (so a rerun starts clean)
    ch = conn.channel()
    for q in ("d.q1", "d.prio", "d.short", "d.dlq", "d.work", "d.aeq"):
        ch.queue_delete(q)
    for x in ("d.direct", "d.topic", "d.headers", "d.fanout", "d.withae", "d.ae"):
        ch.exchange_delete(x)
    conn.close()
    return log


def script_gets_exclusive_priorities(port: int) -> Log:
    """basic.get (get-empty, message-count, exchange and routing key, redelivered),
    exclusive queues per connection, consumer priorities."""
    log: Log = []
    conn = _connect(port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("g.q")
    ch.queue_bind("g.q", "amq.direct", "g.key")
    method, _p, _b = ch.basic_get("g.q")
    log.append(("get-empty", method))
    for i in range(3):
        ch.basic_publish("amq.direct", "g.key", b"g%d" % i)
    method, _p, body = ch.basic_get("g.q")
    log.append(("get", body, method.redelivered, method.exchange, method.routing_key, method.message_count))
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _p, body = ch.basic_get("g.q", auto_ack=True)
    log.append(("get requeued", body, method.redelivered, method.message_count))
    method, _p, body = ch.basic_get("g.q")
    log.append(("get unacked", body, method.redelivered, method.message_count))
    log.append(("declare-ok with one unacked", ch.queue_declare("g.q", passive=True).method.message_count))
    ch.basic_ack(method.delivery_tag)
    method, _p, body = ch.basic_get("g.q", auto_ack=True)
    log.append(("get last", body, method.message_count))
    method, _p, _b = ch.basic_get("g.q")
    log.append(("get-empty again", method))

    # an exclusive queue belongs to the connection
    first = conn.channel()
    first.queue_declare("g.excl", exclusive=True)
    second = conn.channel()
    second.confirm_delivery()  # (RabbitMQ enqueues asynchronously: count it once confirmed)
    second.basic_publish("", "g.excl", b"e")
    log.append(("passive from another channel", second.queue_declare("g.excl", passive=True).method.message_count))
    method, _p, body = second.basic_get("g.excl", auto_ack=True)
    log.append(("get from another channel", body))
    first.close()
    log.append(("after its channel closed", second.queue_declare("g.excl", passive=True).method.message_count))
    other = _connect(port)
    _refused(log, other, "passive declare from another connection", lambda c: c.queue_declare("g.excl", passive=True))
    _refused(log, other, "get from another connection", lambda c: c.basic_get("g.excl"))
    _refused(log, other, "consume from another connection", lambda c: c.basic_consume("g.excl", lambda *a: None))
    _refused(log, other, "delete from another connection", lambda c: c.queue_delete("g.excl"))
    conn.close()
    _refused(log, other, "after the connection closed", lambda c: c.queue_declare("g.excl", passive=True))

    # consumer priorities: the high one while it has prefetch room; equal ones take turns
    conn = _connect(port)
    pub = conn.channel()
    pub.confirm_delivery()
    pub.queue_declare("g.prio")
    got: list[tuple[str, bytes]] = []
    channels = []
    for tag, prefetch, priority in (("low", 10, None), ("high", 2, 5), ("neg", 10, -1)):
        c = conn.channel()
        c.basic_qos(prefetch_count=prefetch)
        c.basic_consume("g.prio", lambda _c, m, _p, b: got.append((m.consumer_tag, b)), consumer_tag=tag,
                        arguments={"x-priority": priority} if priority is not None else None)
        channels.append(c)
    for i in range(5):
        pub.basic_publish("", "g.prio", b"p%d" % i)
    _collect(conn, got, 5)
    log.append(("by priority", sorted(got, key=lambda g: g[1])))
    for c in channels:
        c.close()
    pub.queue_purge("g.prio")
    got.clear()
    channels = []
    for tag, priority in (("low", 0), ("a", 3), ("b", 3)):
        c = conn.channel()
        c.basic_consume("g.prio", lambda _c, m, _p, b: got.append((m.consumer_tag, b)), consumer_tag=tag,
                        auto_ack=True, arguments={"x-priority": priority})
        channels.append(c)
    for i in range(4):
        pub.basic_publish("", "g.prio", b"t%d" % i)
    _collect(conn, got, 4)
    log.append(("equal priorities take turns", sorted(got, key=lambda g: g[1])))
    _refused(log, conn, "x-priority not an integer",
             lambda c: c.basic_consume("g.prio", lambda *a: None, arguments={"x-priority": "high"}))
    pub.queue_delete("g.prio")
    pub.queue_delete("g.q")
    conn.close()
    other.close()
    return log


def test_the_same_script_observes_the_same_results(rabbit: RabbitServer, ackbus: BrokerProcess, tmp_path: Path) -> None:
    theirs = script(rabbit.port)
    ours = script(ackbus.amqp_port)
    compare(theirs, ours)


def test_gets_exclusive_queues_and_consumer_priorities_match(rabbit: RabbitServer, ackbus: BrokerProcess) -> None:
    theirs = script_gets_exclusive_priorities(rabbit.port)
    ours = script_gets_exclusive_priorities(ackbus.amqp_port)
    compare(theirs, ours)

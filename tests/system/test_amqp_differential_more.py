"""More differential scripts (see test_amqp_differential.py): each runs with pika against
a private RabbitMQ and against ackbus's AMQP port, and the two logs must be equal. These
cover expiry, overflow, nack/reject, header tables, the server's consumer cancel,
auto-delete and exclusive queues, qos, refused declares and the routing edge cases of
exchange-to-exchange, topic and headers bindings. What is asynchronous in RabbitMQ
(dead-lettering) is polled for with a deadline; nothing compares timestamps or
server-generated names."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.system.amqp_diff_support import (
    Log,
    RabbitServer,
    collect,
    compare,
    connect,
    get_all,
    refused,
)

pika = pytest.importorskip("pika")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _fresh(ch: Any, queues: tuple[str, ...] = (), exchanges: tuple[str, ...] = ()) -> None:
    """Delete what a script declares, so that a rerun (or a failed run) starts clean."""
    for q in queues:
        ch.queue_delete(q)
    for x in exchanges:
        ch.exchange_delete(x)


def _wait_get(ch: Any, queue: str, timeout_s: float = 10, auto_ack: bool = True) -> tuple[Any, Any, Any]:
    """basic.get until a message comes or the deadline passes: dead-lettering
    and expiry are asynchronous in RabbitMQ."""
    deadline = time.monotonic() + timeout_s
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is not None or time.monotonic() > deadline:
            return method, props, body
        time.sleep(0.02)


def _death(props: Any) -> list[dict[str, Any]]:
    """A dead letter's x-death entries, their time (not deterministic) replaced by its
    type, and the count's type beside it (clients cast them: Java's Long and Date)."""
    out = []
    for entry in props.headers["x-death"]:
        typed = {k: v for k, v in entry.items() if k != "time"}
        typed["time is a"] = type(entry.get("time")).__name__
        typed["count is a"] = type(entry.get("count")).__name__
        out.append(typed)
    return out


def _first_death(props: Any) -> dict[str, Any]:
    """The x-first-death-* headers. (ackbus also sets x-last-death-*, as RabbitMQ does
    from 3.13 on but not the 3.x this test runs: docs/amqp.md, "What differs from
    RabbitMQ".)"""
    return {k: v for k, v in props.headers.items() if k.startswith("x-first-death")}


def _publish_confirmed(ch: Any, exchange: str, key: str, body: bytes, props: Any = None,
                       mandatory: bool = False) -> str:
    """Publish on a confirm channel; "ack", "nack" or "returned"."""
    try:
        ch.basic_publish(exchange, key, body, props, mandatory=mandatory)
        return "ack"
    except pika.exceptions.NackError:
        return "nack"
    except pika.exceptions.UnroutableError:
        return "returned"


# 1. expiry ------------------------------------------------------------------------------

def script_expiry(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    queues = ("e.ttl", "e.dead", "e.plain", "e.zero", "e.both")
    _fresh(ch, queues, ("e.in", "e.dlx"))
    ch.confirm_delivery()
    ch.exchange_declare("e.in", "direct")
    ch.exchange_declare("e.dlx", "fanout")
    ch.queue_declare("e.dead", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "e.ttl"})
    ch.queue_bind("e.dead", "e.dlx")
    ch.queue_declare("e.ttl", arguments={"x-message-ttl": 60, "x-dead-letter-exchange": "e.dlx"})
    ch.queue_bind("e.ttl", "e.in", "k1")

    # a queue's TTL: the messages leave in order, dead-lettered with reason "expired"
    for i in range(3):
        ch.basic_publish("e.in", "k1", b"t%d" % i)
    for _ in range(3):
        method, props, body = _wait_get(ch, "e.dead")
        log.append(("queue ttl", body, method.exchange, method.routing_key, props.expiration, _death(props),
                    _first_death(props)))
    # a dead letter rejected back into the TTL queue expires again: its x-death counts two
    # expiries of e.ttl, most recent first, above the rejection
    ch.basic_publish("e.in", "k1", b"twice")
    method, props, body = _wait_get(ch, "e.dead", auto_ack=False)
    log.append(("first death", body, _death(props)))
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = _wait_get(ch, "e.dead")
    log.append(("expired twice", body, method.exchange, method.routing_key, _death(props), _first_death(props)))

    ch.queue_declare("e.plain", arguments={"x-dead-letter-exchange": "e.dlx"})
    ch.queue_unbind("e.dead", "e.dlx")
    ch.queue_declare("e.sink")
    ch.queue_bind("e.sink", "e.dlx")
    # per-message expiration: it expires at the head of the queue; one without stays
    ch.basic_publish("", "e.plain", b"short", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", "e.plain", b"keeps")
    ch.basic_publish("", "e.plain", b"short-behind", pika.BasicProperties(expiration="50"))
    method, props, body = _wait_get(ch, "e.sink")
    log.append(("per-message", body, props.expiration, _death(props)))
    time.sleep(0.2)  # (both expired by now: what is left is not a race)
    log.append(("left", get_all(ch, "e.plain")))
    method, props, body = _wait_get(ch, "e.sink")
    log.append(("expired behind", body, props.expiration, _death(props)))
    # expiration 0: gone at once when no consumer takes it
    ch.queue_declare("e.zero", arguments={"x-dead-letter-exchange": "e.dlx"})
    ch.basic_publish("", "e.zero", b"zero", pika.BasicProperties(expiration="0"))
    method, props, body = _wait_get(ch, "e.sink")
    log.append(("expiration 0", body, _death(props)))
    log.append(("expiration 0 left", get_all(ch, "e.zero")))
    # queue TTL and a message's expiration: the lower one applies
    ch.queue_declare("e.both", arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "e.dlx"})
    ch.basic_publish("", "e.both", b"long-own", pika.BasicProperties(expiration="600000"))
    method, props, body = _wait_get(ch, "e.sink")
    log.append(("lower ttl wins", body, props.expiration, _death(props)))
    log.append(("sink empty", get_all(ch, "e.sink")))
    # a message held unacked past its TTL expires when it is requeued; one a consumer
    # takes in time does not expire
    ch.basic_publish("", "e.both", b"held")
    method, _p, _b = ch.basic_get("e.both")
    time.sleep(0.2)  # (past its 50 ms: no race, it cannot expire while held)
    log.append(("held past its ttl", get_all(ch, "e.sink")))
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, props, body = _wait_get(ch, "e.sink")
    log.append(("requeued past its ttl", body, _death(props)))
    taker = conn.channel()
    got: list[bytes] = []
    taker.basic_consume("e.both", lambda _c, _m, _p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", "e.both", b"taken in time")
    collect(conn, got, 1)
    log.append(("consumed in time", got, get_all(ch, "e.sink")))
    taker.close()
    # a consumer republishes a dead letter as it got it (x-death and its long count
    # included), and it is dead-lettered again: the count goes on from the one sent
    ch.basic_publish("", "e.both", body, props)
    method, props, body = _wait_get(ch, "e.sink")
    log.append(("republished dead letter", body, _death(props)))
    _fresh(ch, (*queues, "e.sink"), ("e.in", "e.dlx"))
    conn.close()
    return log


# 2. overflow ----------------------------------------------------------------------------

def script_overflow(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    queues = ("o.dead", "o.head", "o.bytes", "o.reject", "o.rdlx", "o.free", "o.rbytes", "o.ready")
    _fresh(ch, queues, ("o.fan",))
    ch.confirm_delivery()
    ch.queue_declare("o.dead")
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "o.dead"}
    ch.queue_declare("o.head", arguments={"x-max-length": 2, **dlx})
    log.append(("drop-head", [_publish_confirmed(ch, "", "o.head", b"h%d" % i) for i in range(4)]))
    log.append(("drop-head kept", get_all(ch, "o.head")))
    for _ in range(2):
        method, props, body = _wait_get(ch, "o.dead")
        log.append(("drop-head dead", body, _death(props)))
    ch.queue_declare("o.bytes", arguments={"x-max-length-bytes": 10})
    log.append(("bytes", [_publish_confirmed(ch, "", "o.bytes", b"b%03d" % i) for i in range(4)]))
    log.append(("bytes kept", get_all(ch, "o.bytes")))
    ch.queue_declare("o.rbytes", arguments={"x-max-length-bytes": 10, "x-overflow": "reject-publish"})
    log.append(("reject bytes", [_publish_confirmed(ch, "", "o.rbytes", b"r%03d" % i) for i in range(4)]))
    log.append(("reject bytes kept", get_all(ch, "o.rbytes")))

    ch.queue_declare("o.reject", arguments={"x-max-length": 2, "x-overflow": "reject-publish", **dlx})
    log.append(("reject-publish", [_publish_confirmed(ch, "", "o.reject", b"r%d" % i) for i in range(4)]))
    method, _p, body = ch.basic_get("o.reject", auto_ack=True)
    log.append(("room again", body, _publish_confirmed(ch, "", "o.reject", b"r-after")))
    log.append(("reject-publish kept", get_all(ch, "o.reject")))
    log.append(("reject-publish dead-letters nothing", get_all(ch, "o.dead")))
    # one queue of two refuses: the publish is nacked, the other queue has it
    ch.exchange_declare("o.fan", "fanout")
    ch.queue_declare("o.free")
    for i in range(2):
        ch.basic_publish("", "o.reject", b"fill%d" % i)
    ch.queue_bind("o.reject", "o.fan")
    ch.queue_bind("o.free", "o.fan")
    log.append(("fanout to a full queue", _publish_confirmed(ch, "o.fan", "", b"both")))
    log.append(("the other queue", get_all(ch, "o.free")))

    ch.queue_declare("o.rdlx", arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx", **dlx})
    log.append(("reject-publish-dlx", [_publish_confirmed(ch, "", "o.rdlx", b"d%d" % i) for i in range(3)]))
    for _ in range(2):
        method, props, body = _wait_get(ch, "o.dead")
        log.append(("reject-publish-dlx dead", body, _death(props)))
    log.append(("reject-publish-dlx kept", get_all(ch, "o.rdlx")))
    # x-max-length counts ready messages only: unacked ones take no room
    ch.queue_declare("o.ready", arguments={"x-max-length": 2, **dlx})
    for i in range(2):
        ch.basic_publish("", "o.ready", b"u%d" % i)
    for _ in range(2):
        ch.basic_get("o.ready")
    log.append(("beside unacked", [_publish_confirmed(ch, "", "o.ready", b"u%d" % i) for i in (2, 3)],
                ch.queue_declare("o.ready", passive=True).method.message_count, get_all(ch, "o.dead")))
    # requeued, they count again: the oldest (the requeued ones) are dropped from the head
    ch.basic_nack(0, multiple=True, requeue=True)
    for _ in range(2):
        method, props, body = _wait_get(ch, "o.dead")
        log.append(("requeued past the limit", body, _death(props)))
    log.append(("ready ones", get_all(ch, "o.ready")))
    refused(log, conn, "redeclare other overflow",
            lambda c: c.queue_declare("o.rdlx", arguments={"x-max-length": 1, "x-overflow": "drop-head", **dlx}))
    _fresh(ch, queues, ("o.fan",))
    conn.close()
    return log


# 3. nack and reject ---------------------------------------------------------------------

def script_nack_reject(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, ("n.q", "n.c"))
    ch.confirm_delivery()
    ch.queue_declare("n.q")
    for i in range(6):
        ch.basic_publish("", "n.q", b"m%d" % i)
    tags = []
    for _ in range(6):
        method, _p, body = ch.basic_get("n.q")
        tags.append(method.delivery_tag)
    ch.basic_nack(tags[2], multiple=True, requeue=True)  # m0..m2 back, in their places
    ch.basic_nack(tags[4], multiple=True, requeue=False)  # m3, m4 dropped (no DLX)
    ch.basic_reject(tags[5], requeue=False)  # m5 dropped
    log.append(("after nack multiple", get_all(ch, "n.q")))

    for i in range(5):
        ch.basic_publish("", "n.q", b"p%d" % i)
    first, _p, _b = ch.basic_get("n.q")
    second, _p, _b = ch.basic_get("n.q")
    ch.basic_nack(second.delivery_tag, requeue=True)  # p1 back before p2
    # (no count here: RabbitMQ's requeue is asynchronous to a passive declare's count)
    ch.basic_reject(first.delivery_tag, requeue=True)  # p0 back before p1
    log.append(("requeued into their places", get_all(ch, "n.q")))

    for i in range(4):
        ch.basic_publish("", "n.q", b"z%d" % i)
    for _ in range(3):
        ch.basic_get("n.q")
    ch.basic_nack(0, multiple=True, requeue=True)  # tag 0 with multiple: every unacked one
    log.append(("nack all (tag 0)", get_all(ch, "n.q")))

    # a consumer: nack multiple with requeue gives the messages to it again, redelivered
    ch.queue_declare("n.c")
    for i in range(4):
        ch.basic_publish("", "n.c", b"c%d" % i)
    c = conn.channel()
    c.basic_qos(prefetch_count=3)
    got: list[Any] = []
    c.basic_consume("n.c", lambda _c, m, _p, b: got.append((b, m.redelivered, m.delivery_tag)), consumer_tag="n")
    collect(conn, got, 3)
    log.append(("consumed", [(b, r) for b, r, _t in got]))
    c.basic_nack(got[1][2], multiple=True, requeue=True)  # c0, c1 again (c2 is still held)
    collect(conn, got, 5)
    log.append(("after nack", [(b, r) for b, r, _t in got[3:]]))
    c.basic_ack(got[3][2], multiple=True)  # c2 and c0
    c.basic_reject(got[4][2], requeue=False)  # c1 dropped
    collect(conn, got, 6)
    log.append(("last", [(b, r) for b, r, _t in got[5:]]))
    c.basic_ack(got[-1][2])
    c.basic_cancel("n")
    log.append(("n.c empty", ch.queue_declare("n.c", passive=True).method.message_count))
    refused(log, conn, "nack an acked tag", lambda x: (x.basic_get("n.q"), x.basic_publish("", "n.q", b"y"),
                                                       _ack_twice(x)))
    refused(log, conn, "reject multiple-acked tag", lambda x: _reject_after_multiple(x))
    _fresh(ch, ("n.q", "n.c"))
    conn.close()
    return log


def _ack_twice(ch: Any) -> None:
    method, _p, _b = ch.basic_get("n.q")
    ch.basic_ack(method.delivery_tag)
    ch.basic_nack(method.delivery_tag, requeue=True)


def _reject_after_multiple(ch: Any) -> None:
    for body in (b"a", b"b"):
        ch.basic_publish("", "n.q", body)
    ch.basic_get("n.q")
    method, _p, _b = ch.basic_get("n.q")
    ch.basic_ack(method.delivery_tag, multiple=True)
    ch.basic_reject(1, requeue=False)


def script_mandatory_and_tx_settles(port: int) -> Log:
    """mandatory publishes to full queues and to none; acks and nacks in a transaction
    (rolled back: nothing happens; committed: all at once)."""
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, ("t.full", "t.zero", "t.q"))
    ch.confirm_delivery()
    ch.queue_declare("t.full", arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    ch.queue_declare("t.zero", arguments={"x-max-length": 0})
    log.append(("mandatory to a full reject-publish queue", _publish_confirmed(ch, "", "t.full", b"x", None, True)))
    log.append(("mandatory to x-max-length 0", _publish_confirmed(ch, "", "t.zero", b"x", None, True)))
    log.append(("mandatory to no queue", _publish_confirmed(ch, "", "t.none", b"x", None, True)))
    ch.queue_declare("t.q")
    for i in range(4):
        ch.basic_publish("", "t.q", b"m%d" % i)
    tx = conn.channel()
    tags = [tx.basic_get("t.q")[0].delivery_tag for _ in range(3)]
    tx.tx_select()
    tx.basic_ack(tags[0])
    tx.basic_nack(tags[1], requeue=True)
    tx.tx_rollback()
    log.append(("after rollback", ch.queue_declare("t.q", passive=True).method.message_count))
    tx.basic_ack(tags[0])
    tx.basic_nack(tags[1], requeue=True)
    tx.basic_publish("", "t.q", b"tx-pub")
    log.append(("before commit", ch.queue_declare("t.q", passive=True).method.message_count))
    tx.tx_commit()  # (no count here: RabbitMQ's requeue is asynchronous to a passive declare)
    tx.close()  # m2, still unacked, back too
    log.append(("after commit and close", get_all(ch, "t.q")))
    _fresh(ch, ("t.full", "t.zero", "t.q"))
    conn.close()
    return log


# 4. header tables -----------------------------------------------------------------------

HEADERS = {
    "str": "text",
    "unicode": "grüße ✓",
    "empty": "",
    "bytes": b"\x00\x01\xff",
    "int0": 0,
    "int-neg": -1,
    "int32-max": 2**31 - 1,
    "int32-min": -(2**31),
    "int64-small": 2**31,
    "int64-max": 2**63 - 1,
    "int64-min": -(2**63),
    "true": True,
    "false": False,
    "decimal": decimal.Decimal("123.45"),
    "decimal-neg": decimal.Decimal("-0.001"),
    "decimal-int": decimal.Decimal("7"),
    "timestamp": datetime.datetime(2021, 3, 4, 5, 6, 7),
    "table": {"a": 1, "b": {"c": [1, "two", None]}, "e": {}},
    "array": [1, 2**40, "s", b"b", True, None, [], [decimal.Decimal("1.5")], {"k": "v"}],
    "none": None,
    "empty-table": {},
    "empty-array": [],
}


@contextlib.contextmanager
def _field_kinds() -> Iterator[list[bytes]]:
    """Record the AMQP field type codes pika decodes meanwhile (the Python values alone do
    not tell `I` from `l`)."""
    kinds: list[bytes] = []
    original = pika.data.decode_value

    def recording(encoded: bytes, offset: int) -> Any:
        kinds.append(bytes(encoded[offset:offset + 1]))
        return original(encoded, offset)

    pika.data.decode_value = recording
    try:
        yield kinds
    finally:
        pika.data.decode_value = original


def script_headers(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, ("h.q",))
    ch.confirm_delivery()
    ch.queue_declare("h.q")
    message_id = uuid.uuid4().hex
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="gzip", headers=HEADERS, delivery_mode=2, priority=3,
        correlation_id="corr", reply_to="h.reply", expiration="600000", message_id=message_id, timestamp=1600000000,
        type="kind", user_id="guest", app_id="app")
    ch.basic_publish("", "h.q", b"with headers", props)
    ch.basic_publish("", "h.q", b"plain", pika.BasicProperties(delivery_mode=1))
    with _field_kinds() as kinds:
        method, got, body = ch.basic_get("h.q", auto_ack=True)
    log.append(("body", body, got.message_id == message_id))
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                 "expiration", "timestamp", "type", "user_id", "app_id"):
        log.append((name, getattr(got, name)))
    for name, value in HEADERS.items():
        log.append(("header", name, got.headers.get(name, "missing"), type(got.headers.get(name)).__name__))
    log.append(("header names", sorted(got.headers)))
    log.append(("field kinds", sorted(kinds)))
    method, got, body = ch.basic_get("h.q", auto_ack=True)
    log.append(("plain", body, got.headers, got.delivery_mode, got.content_type))
    refused(log, conn, "user_id of another user",
            lambda c: c.basic_publish("", "h.q", b"x", pika.BasicProperties(user_id="someone")))
    _fresh(ch, ("h.q",))
    conn.close()
    return log


# 5. the server's consumer cancel, auto-delete and exclusive queues -------------------------

def script_message_id(port: int) -> Log:
    """Publishes that share a ``message_id`` (an entity's id on each of its events, a
    retry that copies the properties): every copy is enqueued and delivered with its
    id, on a confirm channel and a plain one, whatever exchange it went through
    (ackbus deduplicates AMQP publishes only for a connection that asks: docs/amqp.md,
    "Deduplication")."""
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, ("mid.q",))
    ch.queue_declare("mid.q")
    ch.queue_bind("mid.q", "amq.direct", "mid")
    same = pika.BasicProperties(message_id="order-7", delivery_mode=2)
    plain = conn.channel()
    plain.basic_publish("", "mid.q", b"plain 1", same)
    plain.basic_publish("", "mid.q", b"plain 2", same)
    ch.confirm_delivery()
    for body, exchange, key in ((b"confirmed 1", "", "mid.q"), (b"confirmed 2", "", "mid.q"),
                                (b"via amq.direct", "amq.direct", "mid")):
        log.append(("publish", body, _publish_confirmed(ch, exchange, key, body, same)))
    got = []
    for _ in range(10):
        method, props, body = ch.basic_get("mid.q", auto_ack=True)
        if method is None:
            break
        got.append((body, props.message_id))
    log.append(("got", got))
    _fresh(ch, ("mid.q",))
    conn.close()
    return log


def script_cancel_autodelete(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, ("c.q", "c.auto", "c.auto2"))
    ch.queue_declare("c.q")
    cons = conn.channel()
    cancelled: list[Any] = []
    cons.add_on_cancel_callback(lambda frame: cancelled.append(("cancel", frame.method.consumer_tag)))
    cons.basic_consume("c.q", lambda *a: None, consumer_tag="c1")
    ch.queue_delete("c.q")
    collect(conn, cancelled, 1)
    log.append(("queue deleted", cancelled[:], cons.is_open, list(cons.consumer_tags)))
    # the channel goes on: consume again after declaring the queue
    ch.queue_declare("c.q")
    cons.basic_consume("c.q", lambda *a: None, consumer_tag="c2")
    cons.queue_delete("c.q")  # deleted by the consumer's own channel: cancelled too
    collect(conn, cancelled, 2)
    log.append(("deleted by its own channel", cancelled[1:], cons.is_open))

    # auto-delete: goes with its last consumer, not before; never used: stays
    ch.queue_declare("c.auto", auto_delete=True)
    log.append(("auto-delete unused", ch.queue_declare("c.auto", passive=True).method.consumer_count))
    a = conn.channel()
    b = conn.channel()
    a.basic_consume("c.auto", lambda *x: None, consumer_tag="a")
    b.basic_consume("c.auto", lambda *x: None, consumer_tag="b")
    a.basic_cancel("a")
    log.append(("one consumer left", ch.queue_declare("c.auto", passive=True).method.consumer_count))
    b.basic_cancel("b")
    refused(log, conn, "auto-delete after its last consumer", lambda c: c.queue_declare("c.auto", passive=True))
    ch.queue_declare("c.auto2", auto_delete=True)
    d = conn.channel()
    d.basic_consume("c.auto2", lambda *x: None)
    d.close()
    refused(log, conn, "auto-delete after its consumer's channel closed",
            lambda c: c.queue_declare("c.auto2", passive=True))

    # an exclusive queue (with a consumer on another channel) goes with its connection
    owner = connect(port)
    oc = owner.channel()
    excl = oc.queue_declare("", exclusive=True).method.queue
    owner.channel().basic_consume(excl, lambda *x: None)
    refused(log, conn, "exclusive of another connection", lambda c: c.queue_declare(excl, passive=True))
    owner.close()
    refused(log, conn, "exclusive after its connection closed", lambda c: c.queue_declare(excl, passive=True))
    conn.close()
    return log


def script_purge_delete_sac_recover(port: int) -> Log:
    """purge and delete beside unacked messages, exchange if-unused and auto-delete with
    exchange-to-exchange bindings, single active consumer, recover with a consumer."""
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, ("p.q", "p.sac"), ("p.src", "p.dst", "p.ad"))
    ch.confirm_delivery()
    ch.queue_declare("p.q")
    for i in range(4):
        ch.basic_publish("", "p.q", b"m%d" % i)
    holder = conn.channel()
    holder.basic_get("p.q")
    log.append(("purge with one unacked", ch.queue_purge("p.q").method.message_count))
    holder.close()
    log.append(("after its holder closed", get_all(ch, "p.q")))
    for i in range(3):
        ch.basic_publish("", "p.q", b"d%d" % i)
    holder = conn.channel()
    holder.basic_get("p.q")
    log.append(("delete with one unacked", ch.queue_delete("p.q").method.message_count))
    ch.exchange_declare("p.src", "fanout")
    ch.exchange_declare("p.dst", "fanout")
    ch.exchange_bind("p.dst", "p.src")
    refused(log, conn, "delete if-unused: a destination only", lambda c: c.exchange_delete("p.dst", if_unused=True))
    ch.exchange_declare("p.dst", "fanout")
    ch.exchange_declare("p.ad", "fanout", auto_delete=True)
    ch.exchange_bind("p.dst", "p.ad")
    ch.exchange_unbind("p.dst", "p.ad")
    refused(log, conn, "auto-delete source after its binding went", lambda c: c.exchange_declare("p.ad", passive=True))

    ch.queue_declare("p.sac", arguments={"x-single-active-consumer": True})
    got: list[tuple[str, bytes]] = []
    a, b = conn.channel(), conn.channel()
    a.basic_consume("p.sac", lambda _c, _m, _p, body: got.append(("a", body)), auto_ack=True, consumer_tag="a")
    b.basic_consume("p.sac", lambda _c, _m, _p, body: got.append(("b", body)), auto_ack=True, consumer_tag="b")
    for i in range(3):
        ch.basic_publish("", "p.sac", b"s%d" % i)
    collect(conn, got, 3)
    log.append(("single active consumer", got[:], ch.queue_declare("p.sac", passive=True).method.consumer_count))
    a.basic_cancel("a")
    ch.basic_publish("", "p.sac", b"after")
    collect(conn, got, 4)
    log.append(("the next one takes over", got[3:]))
    a.close()
    b.close()

    ch.queue_declare("p.q")
    for i in range(2):
        ch.basic_publish("", "p.q", b"r%d" % i)
    rc = conn.channel()
    again: list[tuple[bytes, bool]] = []
    rc.basic_consume("p.q", lambda _c, m, _p, body: again.append((body, m.redelivered)), consumer_tag="r")
    collect(conn, again, 2)
    rc.basic_recover(requeue=True)
    collect(conn, again, 4)
    log.append(("recover with a consumer", again))
    rc.close()
    _fresh(ch, ("p.q", "p.sac"), ("p.src", "p.dst", "p.ad"))
    conn.close()
    return log


# 6. qos -----------------------------------------------------------------------------------

def script_qos(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, ("q.a", "q.b"))
    ch.confirm_delivery()
    for q in ("q.a", "q.b"):
        ch.queue_declare(q)
        for i in range(10):
            ch.basic_publish("", q, b"%s-%d" % (q.encode(), i))
    got: list[tuple[str, int]] = []
    on = (lambda _c, m, _p, _b: got.append((m.consumer_tag, m.delivery_tag)))

    def held(acked: int = 0, *, at_least: int = 0) -> dict[str, int]:
        """Deliveries per consumer, once nothing more comes (RabbitMQ's limits are
        applied as its queues and channel exchange messages: let them settle).
        ``at_least``: the deliveries past ``acked`` the limits allow, waited for first
        (10 s at most) so that a slow broker on a loaded machine is not taken for one
        that holds back; a broker that does hold back is still seen, after the wait."""
        collect(conn, got, acked + at_least)
        count = len(got)
        conn.process_data_events(time_limit=0.5)
        while len(got) != count:
            count = len(got)
            conn.process_data_events(time_limit=0.5)
        counts: dict[str, int] = {}
        for tag, _t in got[acked:]:
            counts[tag] = counts.get(tag, 0) + 1
        return counts

    # per-consumer 2, then channel-wide 3 (RabbitMQ's documented order): A 2, B the third
    c = conn.channel()
    c.basic_qos(prefetch_count=2)
    c.basic_qos(prefetch_count=3, global_qos=True)
    c.basic_consume("q.a", on, consumer_tag="A")
    c.basic_consume("q.b", on, consumer_tag="B")
    log.append(("both limits", held(at_least=3)))
    c.basic_ack(got[0][1])  # room for one more on the channel: whoever takes it, 3 held
    counts = held(acked=1, at_least=3)
    log.append(("after one ack", sum(counts.values()), max(counts.values()) <= 2))
    acked = len(got)
    c.basic_ack(0, multiple=True)
    counts = held(acked, at_least=3)
    log.append(("after acking all", sum(counts.values()), max(counts.values()) <= 2))
    acked = len(got)
    c.basic_qos(prefetch_count=10, global_qos=True)  # a channel limit raised: each fills its own 2
    log.append(("channel limit raised", sum(held(acked - 3, at_least=4).values())))
    c.close()

    # a per-consumer qos after a channel-wide one lifts the channel-wide one (RabbitMQ)
    got.clear()
    d = conn.channel()
    d.basic_qos(prefetch_count=3, global_qos=True)
    d.basic_qos(prefetch_count=2)
    d.basic_consume("q.a", on, consumer_tag="A")
    d.basic_consume("q.b", on, consumer_tag="B")
    log.append(("channel-wide, then per-consumer", held(at_least=4)))
    d.close()

    # a channel-wide limit alone: the first consumer takes all of it
    got.clear()
    e = conn.channel()
    e.basic_qos(prefetch_count=3, global_qos=True)
    e.basic_consume("q.a", on, consumer_tag="A")
    e.basic_consume("q.b", on, consumer_tag="B")
    log.append(("channel-wide alone", held(at_least=3)))
    e.basic_qos(prefetch_count=4, global_qos=True)  # applies at once to the consumers there
    log.append(("raised", sum(held(at_least=4).values())))
    e.close()
    _fresh(ch, ("q.a", "q.b"))
    conn.close()
    return log


# 7. refused declares ----------------------------------------------------------------------

def script_refused_declares(port: int) -> Log:
    log: Log = []
    conn = connect(port)

    def declare(name: str, **kwargs: Any) -> Any:
        return lambda c: (c.queue_declare(name, **kwargs), c.queue_delete(name))

    cases: list[tuple[str, Any]] = [
        ("queue named amq.*", declare("amq.mine")),
        ("passive missing amq.*", declare("amq.mine", passive=True)),
        ("a name of 255 bytes", declare("r" * 255)),
        # (a name of 256 bytes is refused by pika itself: nothing reaches the broker; a
        # name with a control character is 406 in ackbus and taken by RabbitMQ —
        # docs/amqp.md, "What differs from RabbitMQ")
        ("x-max-priority 0", declare("r.q", arguments={"x-max-priority": 0})),
        ("x-max-priority 255", declare("r.q", arguments={"x-max-priority": 255})),
        ("x-max-priority 256", declare("r.q", arguments={"x-max-priority": 256})),
        ("x-max-priority -1", declare("r.q", arguments={"x-max-priority": -1})),
        ("x-max-priority a string", declare("r.q", arguments={"x-max-priority": "10"})),
        ("x-queue-type classic", declare("r.q", arguments={"x-queue-type": "classic"})),
        ("x-queue-type quorum", declare("r.q", durable=True, arguments={"x-queue-type": "quorum"})),
        ("x-queue-type unknown", declare("r.q", arguments={"x-queue-type": "nonsense"})),
        ("x-queue-type not a string", declare("r.q", arguments={"x-queue-type": 1})),
        ("x-max-length a string", declare("r.q", arguments={"x-max-length": "ten"})),
        ("x-max-length negative", declare("r.q", arguments={"x-max-length": -1})),
        ("x-max-length 0", declare("r.q", arguments={"x-max-length": 0})),
        ("x-max-length-bytes negative", declare("r.q", arguments={"x-max-length-bytes": -1})),
        ("x-message-ttl negative", declare("r.q", arguments={"x-message-ttl": -1})),
        ("x-message-ttl a string", declare("r.q", arguments={"x-message-ttl": "60"})),
        ("x-message-ttl 0", declare("r.q", arguments={"x-message-ttl": 0})),
        ("x-expires 0", declare("r.q", arguments={"x-expires": 0})),
        ("x-expires a string", declare("r.q", arguments={"x-expires": "1000"})),
        ("x-overflow unknown", declare("r.q", arguments={"x-overflow": "nonsense"})),
        ("x-overflow not a string", declare("r.q", arguments={"x-overflow": 1})),
        ("x-dead-letter-exchange not a string", declare("r.q", arguments={"x-dead-letter-exchange": 1})),
        ("x-dead-letter-routing-key alone", declare("r.q", arguments={"x-dead-letter-routing-key": "k"})),
        ("x-single-active-consumer a string", declare("r.q", arguments={"x-single-active-consumer": "yes"})),
        ("x-single-active-consumer true", declare("r.q", arguments={"x-single-active-consumer": True})),
        ("x-delivery-limit negative", declare("r.q", arguments={"x-delivery-limit": -1})),
    ]
    for what, op in cases:
        if refused(log, conn, what, op) == "reconnect":
            conn = connect(port)
    other = connect(port)
    other.channel().queue_declare("r.excl", exclusive=True)
    refused(log, conn, "passive: exclusive of another connection", declare("r.excl", passive=True))
    refused(log, conn, "redeclare: exclusive of another connection", declare("r.excl", exclusive=True))
    other.close()
    conn.close()
    return log


def script_rabbitmq_queue_settings(port: int) -> Log:
    """RabbitMQ's own storage and placement arguments (lazy mode, queue version,
    in-memory limits, dead-letter strategy, leader and master locators), each on the
    kind of queue RabbitMQ takes it on: taken, checked and compared on a redeclare as
    RabbitMQ does. (ackbus takes each on either kind; an argument neither broker knows
    RabbitMQ keeps and ackbus refuses: docs/amqp.md, "What differs from RabbitMQ".)"""
    log: Log = []
    conn = connect(port)

    def declare(name: str, arguments: dict[str, Any], quorum: bool = False, then: Any = None) -> Any:
        if quorum:
            arguments = {"x-queue-type": "quorum", **arguments}

        def op(c: Any) -> None:
            c.queue_declare(name, durable=quorum, arguments=arguments)
            try:
                if then is not None:
                    c.queue_declare(name, durable=quorum, arguments=then if not quorum else {"x-queue-type": "quorum", **then})
            finally:
                c.connection.channel().queue_delete(name)
        return op

    cases: list[tuple[str, Any]] = [
        ("x-queue-mode lazy", declare("s.q", {"x-queue-mode": "lazy"})),
        ("x-queue-mode default", declare("s.q", {"x-queue-mode": "default"})),
        ("x-queue-mode unknown", declare("s.q", {"x-queue-mode": "bogus"})),
        ("x-queue-mode not a string", declare("s.q", {"x-queue-mode": 1})),
        ("x-queue-mode redeclared without", declare("s.q", {"x-queue-mode": "lazy"}, then={})),
        ("x-queue-mode redeclared other", declare("s.q", {"x-queue-mode": "lazy"}, then={"x-queue-mode": "default"})),
        ("x-queue-version 1", declare("s.q", {"x-queue-version": 1})),
        ("x-queue-version 2", declare("s.q", {"x-queue-version": 2})),
        ("x-queue-version 3", declare("s.q", {"x-queue-version": 3})),
        ("x-queue-version a string", declare("s.q", {"x-queue-version": "2"})),
        ("x-queue-version redeclared other", declare("s.q", {"x-queue-version": 1}, then={"x-queue-version": 2})),
        # (a master locator RabbitMQ does not know closes its connection with 541
        # INTERNAL_ERROR; ackbus answers 406 on the channel)
        ("x-queue-master-locator client-local", declare("s.q", {"x-queue-master-locator": "client-local"})),
        ("x-queue-master-locator min-masters", declare("s.q", {"x-queue-master-locator": "min-masters"})),
        ("x-queue-master-locator random", declare("s.q", {"x-queue-master-locator": "random"})),
        ("x-queue-master-locator redeclared without",
         declare("s.q", {"x-queue-master-locator": "random"}, then={})),
        ("x-ha-policy", declare("s.q", {"x-ha-policy": "all"})),
        ("quorum x-queue-leader-locator client-local",
         declare("s.qq", {"x-queue-leader-locator": "client-local"}, quorum=True)),
        ("quorum x-queue-leader-locator balanced", declare("s.qq", {"x-queue-leader-locator": "balanced"}, quorum=True)),
        ("quorum x-queue-leader-locator random", declare("s.qq", {"x-queue-leader-locator": "random"}, quorum=True)),
        ("quorum x-queue-leader-locator least-leaders",
         declare("s.qq", {"x-queue-leader-locator": "least-leaders"}, quorum=True)),
        ("quorum x-queue-leader-locator unknown", declare("s.qq", {"x-queue-leader-locator": "bogus"}, quorum=True)),
        ("quorum x-max-in-memory-length", declare("s.qq", {"x-max-in-memory-length": 5}, quorum=True)),
        ("quorum x-max-in-memory-length a string", declare("s.qq", {"x-max-in-memory-length": "5"}, quorum=True)),
        ("quorum x-max-in-memory-bytes", declare("s.qq", {"x-max-in-memory-bytes": 1024}, quorum=True)),
        ("quorum x-max-in-memory-bytes negative", declare("s.qq", {"x-max-in-memory-bytes": -3}, quorum=True)),
        ("quorum x-max-in-memory-length redeclared without",
         declare("s.qq", {"x-max-in-memory-length": 5}, quorum=True, then={})),
        ("quorum x-dead-letter-strategy at-most-once",
         declare("s.qq", {"x-dead-letter-strategy": "at-most-once"}, quorum=True)),
        ("quorum x-dead-letter-strategy at-least-once",
         declare("s.qq", {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}, quorum=True)),
        ("quorum x-dead-letter-strategy unknown", declare("s.qq", {"x-dead-letter-strategy": "bogus"}, quorum=True)),
        ("quorum x-dead-letter-strategy not a string", declare("s.qq", {"x-dead-letter-strategy": 1}, quorum=True)),
        ("quorum x-dead-letter-strategy redeclared without",
         declare("s.qq", {"x-dead-letter-strategy": "at-most-once"}, quorum=True, then={})),
    ]
    for what, op in cases:
        if refused(log, conn, what, op) == "reconnect":
            conn = connect(port)
    conn.close()
    return log


def script_redeclares_and_refusals(port: int) -> Log:
    """Redeclares with other settings (exclusivity is 405 in RabbitMQ, the rest 406),
    refused publishes, binds and methods, and auto-delete exchanges."""
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, ("m.a", "m.b"), ("m.d", "m.auto", "m.int", "m.h", "m.ae2"))
    ch.confirm_delivery()
    ch.queue_declare("m.a")
    ch.queue_declare("m.b")
    ch.exchange_declare("m.d", "direct")
    ch.queue_bind("m.a", "m.d", "a")
    ch.exchange_declare("m.auto", "fanout", auto_delete=True)
    ch.queue_bind("m.a", "m.auto")
    ch.queue_unbind("m.a", "m.auto")
    ch.exchange_declare("m.int", "fanout", internal=True)
    ch.exchange_declare("m.h", "headers")
    ch.queue_declare("m.mine", exclusive=True)
    cases: list[tuple[str, Any]] = [
        ("auto-delete exchange after its last binding", lambda c: c.exchange_declare("m.auto", passive=True)),
        ("publish to an internal exchange", lambda c: c.basic_publish("m.int", "", b"x")),
        ("x-match any-with-x", lambda c: c.queue_bind("m.a", "m.h", arguments={"x-match": "any-with-x", "x-k": "v"})),
        ("x-match not a string", lambda c: c.queue_bind("m.a", "m.h", arguments={"x-match": 1})),
        ("exclusive consume beside a consumer",
         lambda c: (c.basic_consume("m.a", lambda *a: None), conn.channel().basic_consume("m.a", lambda *a: None,
                                                                                           exclusive=True))),
        ("passive exchange of another type", lambda c: c.exchange_declare("m.d", "fanout", passive=True)),
        ("passive queue with other arguments", lambda c: c.queue_declare("m.a", passive=True,
                                                                         arguments={"x-max-length": 3})),
        ("shared queue redeclared exclusive", lambda c: c.queue_declare("m.a", exclusive=True)),
        ("own exclusive queue redeclared shared", lambda c: c.queue_declare("m.mine")),
        ("own exclusive queue redeclared exclusive", lambda c: c.queue_declare("m.mine", exclusive=True)),
        ("redeclare other auto_delete", lambda c: c.queue_declare("m.a", auto_delete=True)),
        ("exchange redeclared durable", lambda c: c.exchange_declare("m.d", "direct", durable=True)),
        ("exchange redeclared auto_delete", lambda c: c.exchange_declare("m.d", "direct", auto_delete=True)),
        ("exchange redeclared internal", lambda c: c.exchange_declare("m.d", "direct", internal=True)),
        ("exchange redeclared with arguments",
         lambda c: c.exchange_declare("m.d", "direct", arguments={"alternate-exchange": "m.h"})),
        # (binding through "amq.default" is 403 on ackbus, 404 on RabbitMQ: ackbus names
        # the default exchange amq.default too — docs/amqp.md, "What differs from RabbitMQ")
        ("bind to the default exchange", lambda c: c.queue_bind("m.a", "", "m.a")),
        ("exchange bound to the default exchange", lambda c: c.exchange_bind("", "m.d", "k")),
        ("delete amq.direct", lambda c: c.exchange_delete("amq.direct")),
        ("get from a missing queue", lambda c: c.basic_get("m.none")),
        ("purge a missing queue", lambda c: c.queue_purge("m.none")),
        ("expiration negative", lambda c: c.basic_publish("", "m.a", b"x", pika.BasicProperties(expiration="-1"))),
        ("expiration not a number", lambda c: c.basic_publish("", "m.a", b"x",
                                                              pika.BasicProperties(expiration="soon"))),
        ("routing key of 255 bytes", lambda c: c.basic_publish("m.d", "k" * 255, b"x")),
        ("alternate exchange missing", lambda c: (c.exchange_declare("m.ae2", "direct",
                                                                     arguments={"alternate-exchange": "m.none"}),
                                                  c.basic_publish("m.ae2", "x", b"x"))),
        ("recover without requeue", lambda c: c.basic_recover(requeue=False)),
        ("qos prefetch_size", lambda c: c.basic_qos(prefetch_size=10)),
    ]
    for what, op in cases:
        if refused(log, conn, what, op) == "reconnect":
            conn = connect(port)
    log.append(("m.a holds", get_all(conn.channel(), "m.a")))
    conn.close()
    conn = connect(port)  # (m.mine went with the first connection)
    _fresh(conn.channel(), ("m.a", "m.b"), ("m.d", "m.auto", "m.int", "m.h", "m.ae2"))
    conn.close()
    return log


# 8. exchange-to-exchange, topic and headers edge cases ------------------------------------

TOPIC_BINDINGS = ("#", "a.#", "#.b", "a.*", "*", "a.#.b", "*.*", "a..b", "", "#.#", "a.*.#", "*.#.*", "#.*", "*.#",
                  ".", "#.")
TOPIC_KEYS = ("", "a", "b", "a.b", "a..b", ".", "a.", ".a", "a.b.c", "a.x.y.b", "ab", "a.b.b")


def script_routing(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    topic_queues = tuple(f"t.q{i}" for i in range(len(TOPIC_BINDINGS)))
    header_queues = ("hx.all", "hx.any", "hx.default", "hx.empty", "hx.int")
    queues = (*topic_queues, *header_queues, "x.q")
    exchanges = ("t.x", "hx.x", "x.src", "x.mid", "x.dst")
    _fresh(ch, queues, exchanges)
    ch.confirm_delivery()

    # exchange-to-exchange: bind, route, unbind
    for name, kind in (("x.src", "topic"), ("x.mid", "fanout"), ("x.dst", "direct")):
        ch.exchange_declare(name, kind)
    ch.queue_declare("x.q")
    ch.queue_bind("x.q", "x.dst", "k")
    ch.exchange_bind("x.mid", "x.src", "k.#")
    ch.exchange_bind("x.dst", "x.mid")
    ch.basic_publish("x.src", "k", b"through two")
    ch.basic_publish("x.src", "k.x", b"wrong key at the end")
    log.append(("e2e", get_all(ch, "x.q")))
    ch.exchange_unbind("x.mid", "x.src", "k.#")
    log.append(("after unbind", _publish_confirmed(ch, "x.src", "k", b"nowhere"), get_all(ch, "x.q")))
    refused(log, conn, "unbind a binding that is not there", lambda c: c.exchange_unbind("x.mid", "x.src", "k.#"))
    refused(log, conn, "unbind from a missing exchange", lambda c: c.exchange_unbind("x.mid", "x.none", "k"))
    refused(log, conn, "bind to a missing exchange", lambda c: c.exchange_bind("x.none", "x.src", "k"))
    refused(log, conn, "unbind a queue binding that is not there", lambda c: c.queue_unbind("x.q", "x.dst", "zz"))
    ch.exchange_bind("x.dst", "x.dst", "loop")  # a cycle: the message reaches x.q once
    ch.basic_publish("x.dst", "loop", b"looped")
    ch.queue_bind("x.q", "x.dst", "loop")
    ch.basic_publish("x.dst", "loop", b"looped once")
    log.append(("self-bound", get_all(ch, "x.q")))

    # topic wildcards
    ch.exchange_declare("t.x", "topic")
    for q, pattern in zip(topic_queues, TOPIC_BINDINGS):
        ch.queue_declare(q)
        ch.queue_bind(q, "t.x", pattern)
    for key in TOPIC_KEYS:
        ch.basic_publish("t.x", key, key.encode() or b"<empty>")
    for q, pattern in zip(topic_queues, TOPIC_BINDINGS):
        log.append(("topic", pattern, sorted(body for body, _r in get_all(ch, q))))

    # headers: x-match all (the default) and any; x- keys of a binding are ignored
    ch.exchange_declare("hx.x", "headers")
    for q in header_queues:
        ch.queue_declare(q)
    ch.queue_bind("hx.all", "hx.x", arguments={"x-match": "all", "h": "1", "g": "2", "x-ignored": "z"})
    ch.queue_bind("hx.any", "hx.x", arguments={"x-match": "any", "h": "1", "g": "2", "x-ignored": "z"})
    ch.queue_bind("hx.default", "hx.x", arguments={"h": "1", "g": "2"})
    ch.queue_bind("hx.empty", "hx.x", arguments={"x-match": "all"})
    ch.queue_bind("hx.int", "hx.x", arguments={"n": 1})
    samples: list[dict[str, Any] | None] = [
        {"h": "1", "g": "2"}, {"h": "1"}, {"g": "2", "x-ignored": "z"}, {"h": "1", "g": "2", "extra": "e"},
        {"h": 1, "g": "2"}, {"n": 1}, {"n": "1"}, {}, None, {"x-ignored": "z"}, {"h": "1", "g": "3"},
    ]
    for i, headers in enumerate(samples):
        ch.basic_publish("hx.x", "", b"s%d" % i, pika.BasicProperties(headers=headers))
    for q in header_queues:
        log.append(("headers", q, sorted(body for body, _r in get_all(ch, q))))
    refused(log, conn, "x-match unknown", lambda c: c.queue_bind("x.q", "hx.x", arguments={"x-match": "some"}))

    # typed header values: compared by value (an AMQP long 1 is the int 1, a text is the
    # same bytes), a boolean is no number, a nested table compares with its types
    typed_bindings: dict[str, dict[str, Any]] = {
        "int": {"n": 1}, "void": {"v": None}, "str": {"s": "1"}, "bool": {"b": True}, "bytes": {"x": b"1"},
        "any-with-x": {"x-match": "any-with-x", "x-h": "1"},
        "all-with-x": {"x-match": "all-with-x", "x-h": "1", "k": "2"},
        "nested": {"t": {"a": 1}}, "array": {"a": [1, 2]},
    }
    typed_queues = tuple(f"ht.{name}" for name in typed_bindings)
    _fresh(ch, typed_queues)
    for q, arguments in zip(typed_queues, typed_bindings.values()):
        ch.queue_declare(q)
        ch.queue_bind(q, "hx.x", arguments=arguments)
    typed_samples: list[dict[str, Any]] = [
        {"n": pika.compat.long(1)}, {"n": True}, {"n": "1"}, {"n": decimal.Decimal(1)}, {"v": "x"}, {"v": None},
        {"v": 0}, {"s": b"1"}, {"s": "1"}, {"b": 1}, {"b": True}, {"x": "1"}, {"x": b"1"}, {"x-h": "1"},
        {"x-h": "1", "k": "2"}, {"k": "2"}, {"t": {"a": 1}}, {"t": {"a": pika.compat.long(1)}}, {"a": [1, 2]},
        {"a": [2, 1]},
    ]
    for i, headers in enumerate(typed_samples):
        ch.basic_publish("hx.x", "", b"%d" % i, pika.BasicProperties(headers=headers))
    for q in typed_queues:
        log.append(("typed headers", q, sorted(int(body) for body, _r in get_all(ch, q))))
    _fresh(ch, typed_queues)
    _fresh(ch, queues, exchanges)
    conn.close()
    return log


SCRIPTS = [
    script_expiry, script_overflow, script_nack_reject, script_mandatory_and_tx_settles, script_headers,
    script_message_id, script_cancel_autodelete, script_purge_delete_sac_recover, script_qos, script_refused_declares,
    script_rabbitmq_queue_settings, script_redeclares_and_refusals, script_routing,
]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.__name__.removeprefix("script_") for s in SCRIPTS])
def test_rabbitmq_and_ackbus_observe_the_same(script: Any, rabbit: RabbitServer, ackbus: BrokerProcess) -> None:
    theirs = script(rabbit.port)
    ours = script(ackbus.amqp_port)
    compare(theirs, ours)

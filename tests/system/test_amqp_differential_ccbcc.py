"""Differential scripts for sender-selected distribution (the CC and BCC headers; see
test_amqp_differential.py for the method): each runs with pika against a private
RabbitMQ and against ackbus's AMQP port, and the two logs must be equal. They cover
routing by CC and BCC keys through direct, topic, fanout, headers, default and
alternate exchanges and exchange-to-exchange bindings (each queue once, BCC gone
from what is delivered, CC kept), mandatory returns (only when no key routes, BCC
gone from the returned message), the channel error for a CC or BCC that is not an
array, entries that are not strings, and dead-lettering (x-death ``routing-keys``,
CC dropped with ``x-dead-letter-routing-key``). The one difference ackbus keeps
(a dead letter without ``x-dead-letter-routing-key`` is not routed by the BCC keys:
docs/amqp.md) has a test of its own that pins it on both sides."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.system.amqp_diff_support import (
    Log,
    RabbitServer,
    compare,
    connect,
    refused,
)

pika = pytest.importorskip("pika")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

QUEUES = ("cc.a", "cc.b", "cc.c")
EXCHANGES = ("cc.x", "cc.t", "cc.f", "cc.h", "cc.ae", "cc.xa", "cc.src", "cc.dlx")


def _fresh(ch: Any, queues: tuple[str, ...] = (), exchanges: tuple[str, ...] = ()) -> None:
    """Delete what a script declares, so that a rerun (or a failed run) starts clean."""
    for q in queues:
        ch.queue_delete(q)
    for x in exchanges:
        ch.exchange_delete(x)


def _direct(ch: Any, name: str = "cc.x") -> None:
    """Direct exchange ``name`` with cc.a bound by key a, cc.b by b, cc.c by c."""
    ch.exchange_declare(name, "direct")
    for q in QUEUES:
        ch.queue_declare(q)
        ch.queue_bind(q, name, q[-1])


def _taken(ch: Any, *queues: str) -> list[Any]:
    """Every ready message of ``queues`` (auto-ack): per queue, (body, exchange,
    routing key, headers) in order."""
    out = []
    for q in queues:
        got = []
        while True:
            method, props, body = ch.basic_get(q, auto_ack=True)
            if method is None:
                break
            got.append((body, method.exchange, method.routing_key, props.headers))
        out.append((q, got))
    return out


def _publish(ch: Any, exchange: str, key: str, body: bytes, headers: dict[str, Any] | None) -> None:
    ch.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers))


def script_routing(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, (*QUEUES, "cc.ae"), EXCHANGES)
    _direct(ch)

    def routed(what: str, exchange: str, key: str, headers: dict[str, Any] | None) -> None:
        _publish(ch, exchange, key, what.encode(), headers)
        log.append((what, _taken(ch, *QUEUES)))

    routed("cc and bcc", "cc.x", "a", {"CC": ["b"], "BCC": ["c"], "other": 1})
    routed("bcc only", "cc.x", "zz", {"BCC": ["c"]})
    routed("each queue once", "cc.x", "a", {"CC": ["a", "a", "b"], "BCC": ["a", "b"]})
    routed("empty arrays", "cc.x", "a", {"CC": [], "BCC": []})
    routed("lowercase names route nothing", "cc.x", "a", {"cc": ["b"], "bcc": ["c"]})
    routed("entries that are not strings", "cc.x", "a", {"CC": [1, "b", b"c", None, ["c"], {"c": 1}, True]})
    routed("bcc entries that are not strings", "cc.x", "zz", {"BCC": [1, b"c", "b"]})
    routed("a key over 255 bytes", "cc.x", "a", {"CC": ["k" * 300]})
    routed("default exchange", "", "cc.a", {"CC": ["cc.b", "nosuch"], "BCC": ["cc.c"]})
    routed("default exchange, by cc alone", "", "nosuch", {"CC": ["cc.b"]})

    ch.exchange_declare("cc.t", "topic")
    ch.queue_bind("cc.a", "cc.t", "x.*")
    ch.queue_bind("cc.b", "cc.t", "y.#")
    routed("topic", "cc.t", "x.1", {"CC": ["y.1.2", "x.2", "z"]})
    ch.exchange_declare("cc.f", "fanout")
    ch.queue_bind("cc.c", "cc.f")
    routed("fanout", "cc.f", "k", {"CC": ["r", "s"], "BCC": ["t"]})
    ch.exchange_declare("cc.src", "topic")
    ch.exchange_bind("cc.x", "cc.src", "#")
    routed("exchange to exchange", "cc.src", "a", {"CC": ["b"], "BCC": ["c"]})

    # headers: CC is seen by a binding, BCC is not (gone before routing)
    ch.exchange_declare("cc.h", "headers")
    ch.queue_bind("cc.a", "cc.h", arguments={"x-match": "any", "CC": ["k"]})
    ch.queue_bind("cc.b", "cc.h", arguments={"x-match": "any", "BCC": ["k"]})
    routed("headers exchange", "cc.h", "", {"CC": ["k"], "BCC": ["k"]})
    routed("headers exchange, bcc only", "cc.h", "", {"BCC": ["k"]})

    # alternate exchange: it takes every key when none routes in the exchange
    ch.exchange_declare("cc.ae", "direct")
    ch.queue_declare("cc.ae")
    ch.queue_bind("cc.ae", "cc.ae", "ae-key")
    ch.exchange_declare("cc.xa", "direct", arguments={"alternate-exchange": "cc.ae"})
    ch.queue_bind("cc.a", "cc.xa", "a")
    for what, key, headers in (
        ("alternate by a cc key", "nope", {"CC": ["ae-key"]}),
        ("no alternate: a cc key routes", "ae-key", {"CC": ["a"]}),
        ("alternate by a bcc key", "nope", {"BCC": ["ae-key"]}),
    ):
        _publish(ch, "cc.xa", key, what.encode(), headers)
        log.append((what, _taken(ch, "cc.a", "cc.ae")))
    _fresh(ch, (*QUEUES, "cc.ae"), EXCHANGES)
    conn.close()
    return log


def _confirmed(ch: Any, exchange: str, key: str, body: bytes, headers: dict[str, Any]) -> Any:
    """A mandatory publish on a confirm channel: "ack", or what came back."""
    try:
        ch.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers), mandatory=True)
        return "ack"
    except pika.exceptions.UnroutableError as exc:
        return [("returned", m.method.reply_code, m.method.routing_key, m.properties.headers, m.body)
                for m in exc.messages]
    except pika.exceptions.NackError:
        return "nack"


def script_mandatory(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, QUEUES, EXCHANGES)
    _direct(ch)
    ch.confirm_delivery()
    for what, key, headers in (
        ("routed by cc", "none", {"CC": ["b"]}),
        ("routed by bcc", "none", {"BCC": ["c"]}),
        ("routed by nothing", "none", {"CC": ["n2"], "BCC": ["n3"], "h": "v"}),
        ("routed by its own key", "a", {"CC": ["n2"], "BCC": ["n3"]}),
    ):
        log.append((what, _confirmed(ch, "cc.x", key, what.encode(), headers), _taken(ch, *QUEUES)))
    _fresh(ch, QUEUES, EXCHANGES)
    conn.close()
    return log


def script_refused(port: int) -> Log:
    """A CC or BCC that is not an array: the channel is closed (406), nothing routed."""
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _fresh(ch, QUEUES, EXCHANGES)
    _direct(ch)

    def publishing(headers: dict[str, Any], confirm: bool = False) -> Callable[[Any], Any]:
        def op(c: Any) -> None:
            if confirm:
                c.confirm_delivery()
            _publish(c, "cc.x", "a", b"refused", headers)

        return op

    for what, headers in (
        ("cc a string", {"CC": "b"}),
        ("bcc a string", {"BCC": "b"}),
        ("cc a number", {"CC": 1}),
        ("cc a table", {"CC": {"b": 1}}),
        ("cc void", {"CC": None}),
        ("cc bytes", {"CC": b"b"}),
        ("bcc a string beside a good cc", {"CC": ["b"], "BCC": "c"}),
    ):
        refused(log, conn, what, publishing(headers))
    refused(log, conn, "cc a string, confirm channel", publishing({"CC": "b"}, confirm=True))
    log.append(("nothing routed", _taken(ch, *QUEUES)))
    _fresh(ch, QUEUES, EXCHANGES)
    conn.close()
    return log


def _wait_taken(ch: Any, queue: str, timeout_s: float = 10) -> list[Any]:
    """basic.get ``queue`` until a message comes or the deadline passes (RabbitMQ
    dead-letters asynchronously): its one message, as :func:`_taken` shows it."""
    deadline = time.monotonic() + timeout_s
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return [(body, method.exchange, method.routing_key, _comparable_headers(props.headers))]
        if time.monotonic() > deadline:
            return []
        time.sleep(0.02)


def _comparable_headers(headers: dict[str, Any] | None) -> dict[str, Any] | None:
    """A dead letter's headers without what cannot compare: x-death's times (their
    type kept), and the x-last-death-* headers RabbitMQ 3.10 does not write
    (docs/amqp.md)."""
    if headers is None:
        return None
    out = {k: v for k, v in headers.items() if not k.startswith("x-last-death")}
    if "x-death" in out:
        out["x-death"] = [
            {**{k: v for k, v in d.items() if k != "time"}, "time is a": type(d.get("time")).__name__}
            for d in out["x-death"]
        ]
    return out


def _dead_letter_setup(ch: Any, **arguments: Any) -> None:
    """cc.x routes a, b, c (and w to cc.work, which dead-letters to cc.dlx); cc.dlx
    routes a to cc.a, b to cc.b, c to cc.c."""
    _fresh(ch, (*QUEUES, "cc.work"), EXCHANGES)
    _direct(ch)
    ch.exchange_declare("cc.dlx", "direct")
    for q in QUEUES:
        ch.queue_bind(q, "cc.dlx", q[-1])
    ch.queue_declare("cc.work", arguments={"x-dead-letter-exchange": "cc.dlx", **arguments})
    ch.queue_bind("cc.work", "cc.x", "w")


def _reject_one(ch: Any, queue: str) -> Any:
    method, props, _body = ch.basic_get(queue)
    ch.basic_reject(method.delivery_tag, requeue=False)
    return props.headers


def script_dead_letters(port: int) -> Log:
    log: Log = []
    conn = connect(port)
    ch = conn.channel()

    # without x-dead-letter-routing-key: routed by its key and the CC keys, which
    # x-death lists; CC kept
    _dead_letter_setup(ch)
    _publish(ch, "cc.x", "w", b"dead by cc", {"CC": ["b", "zz"]})
    log.append(("published", _taken(ch, *QUEUES)))
    log.append(("in cc.work", _reject_one(ch, "cc.work")))
    log.append(("dead letter", _wait_taken(ch, "cc.b"), _taken(ch, *QUEUES)))

    # its own key routes too; a queue reached by both keys gets it once
    _publish(ch, "cc.x", "w", b"dead by both", {"CC": ["w", "c"]})
    ch.queue_bind("cc.c", "cc.dlx", "w")
    _taken(ch, *QUEUES)
    _reject_one(ch, "cc.work")
    log.append(("dead letter, two keys to one queue", _wait_taken(ch, "cc.c"), _taken(ch, *QUEUES)))

    # with x-dead-letter-routing-key: that key alone, and CC is dropped (BCC was
    # dropped at the publish); x-death still lists the publish's keys
    _dead_letter_setup(ch, **{"x-dead-letter-routing-key": "a"})
    _publish(ch, "cc.x", "w", b"dead by its dead-letter key", {"CC": ["b"], "BCC": ["c"]})
    log.append(("published", _taken(ch, *QUEUES)))
    log.append(("in cc.work", _reject_one(ch, "cc.work")))
    log.append(("dead letter", _wait_taken(ch, "cc.a"), _taken(ch, *QUEUES)))
    _fresh(ch, (*QUEUES, "cc.work"), EXCHANGES)
    conn.close()
    return log


SCRIPTS = [script_routing, script_mandatory, script_refused, script_dead_letters]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.__name__.removeprefix("script_") for s in SCRIPTS])
def test_rabbitmq_and_ackbus_observe_the_same(script: Any, rabbit: RabbitServer, ackbus: BrokerProcess) -> None:
    theirs = script(rabbit.port)
    ours = script(ackbus.amqp_port)
    compare(theirs, ours)


def script_dead_letter_by_bcc(port: int, rabbitmq: bool) -> Log:
    """A dead letter without x-dead-letter-routing-key, published with a BCC key:
    RabbitMQ routes it by that key too (it keeps a message's keys apart from its
    headers), ackbus does not (it keeps no record of BCC). ackbus dead-letters in one
    step, so once cc.b holds the dead letter, cc.c would too: only RabbitMQ is
    waited for."""
    log: Log = []
    conn = connect(port)
    ch = conn.channel()
    _dead_letter_setup(ch)
    _publish(ch, "cc.x", "w", b"m", {"CC": ["b"], "BCC": ["c"]})
    _taken(ch, *QUEUES)
    _reject_one(ch, "cc.work")
    log.append(("by cc", len(_wait_taken(ch, "cc.b"))))
    log.append(("by bcc", len(_wait_taken(ch, "cc.c") if rabbitmq else _taken(ch, "cc.c")[0][1])))
    _fresh(ch, (*QUEUES, "cc.work"), EXCHANGES)
    conn.close()
    return log


def test_a_dead_letter_is_not_routed_by_its_bcc_keys_in_ackbus_as_it_is_in_rabbitmq(
    rabbit: RabbitServer, ackbus: BrokerProcess
) -> None:
    assert script_dead_letter_by_bcc(rabbit.port, True) == [("by cc", 1), ("by bcc", 1)]
    assert script_dead_letter_by_bcc(ackbus.amqp_port, False) == [("by cc", 1), ("by bcc", 0)]

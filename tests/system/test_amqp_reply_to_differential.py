"""Differential scripts for direct reply-to (``amq.rabbitmq.reply-to``; see
test_amqp_differential.py for the method): each runs with pika against a private
RabbitMQ 3.10 and against ackbus's AMQP port, and the two logs must be equal. They
cover the RPC round trip (the rewritten ``reply_to``, the reply's deliver: consumer
tag, delivery tag, exchange, routing key, properties, body), replies published in
confirm mode and with ``mandatory`` (returned even when delivered), made-up
addresses, a requester gone (closed channel, cancelled consumer), the
``queue.declare`` check (counts, and ``404`` for every name that begins like one),
and the refusals (manual acks, a second reply consumer, ``reply_to`` without the
consumer). An address is logged by its prefix only: its token is each broker's own."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.system.amqp_diff_support import (
    Log,
    RabbitServer,
    collect,
    compare,
    connect,
    refused,
)

pika = pytest.importorskip("pika")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

REPLY_TO = "amq.rabbitmq.reply-to"
RPC_QUEUE = "rt.rpc"


def _address(name: str | None) -> Any:
    """An address as both brokers must agree on it: its form, not its token."""
    if name is None:
        return None
    if name.startswith(REPLY_TO + ".") and len(name) > len(REPLY_TO) + 8:
        return "<reply address>"
    return name


def _requester(conn: Any, tag: str, got: list[Any]) -> tuple[Any, str]:
    """A channel of ``conn`` with a reply consumer ``tag`` (deliveries into ``got``);
    one request published through ``rt.rpc`` and taken back: (channel, its address)."""
    ch = conn.channel()

    def on_reply(_ch: Any, method: Any, props: Any, body: bytes) -> None:
        got.append((method.consumer_tag, method.delivery_tag, method.redelivered, method.exchange,
                    _address(method.routing_key), props.correlation_id, props.reply_to, props.headers, body))

    ch.basic_consume(REPLY_TO, on_reply, auto_ack=True, consumer_tag=tag)
    ch.queue_declare(RPC_QUEUE)
    ch.basic_publish("", RPC_QUEUE, b"request", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c1"))
    return ch, _take_request(ch)


def _take_request(ch: Any) -> str:
    """The ``reply_to`` of the next request in ``rt.rpc`` (waiting for it: it may
    have been published on another connection)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        method, props, _body = ch.basic_get(RPC_QUEUE, auto_ack=True)
        if method is not None:
            return str(props.reply_to)
    raise AssertionError("the request never arrived")


def _publish(ch: Any, key: str, body: bytes, mandatory: bool = False, **props: Any) -> Any:
    """A confirmed publish to the default exchange: "ack", or the returns it met."""
    try:
        ch.basic_publish("", key, body, pika.BasicProperties(**props), mandatory=mandatory)
    except pika.exceptions.UnroutableError as exc:
        return [("returned", m.method.reply_code, m.method.reply_text, m.method.exchange,
                 _address(m.method.routing_key), m.body) for m in exc.messages]
    return "ack"


def _declare(conn: Any, name: str, passive: bool = True) -> Any:
    """``queue.declare`` of ``name`` on a fresh channel: its counts, or the code."""
    ch = conn.channel()
    try:
        ok = ch.queue_declare(name, passive=passive)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return (exc.reply_code, exc.reply_text.replace(name, _address(name) or ""))
    ch.close()
    return (_address(ok.method.queue), ok.method.message_count, ok.method.consumer_count)


def script_round_trip(port: int) -> Log:
    log: Log = []
    conn, server = connect(port), connect(port)
    got: list[Any] = []
    ch, address = _requester(conn, "rt.tag", got)
    log.append(("request's reply_to", _address(address)))
    responder = server.channel()
    responder.confirm_delivery()
    log.append(("reply 1", _publish(responder, address, b"one", correlation_id="c1", headers={"h": 1})))
    log.append(("reply 2", _publish(responder, address, b"two", correlation_id="c2")))
    collect(conn, got, 2)
    log.append(("delivered", got[:]))
    log.append(("passive", _declare(server, address)))
    log.append(("declare", _declare(server, address, passive=False)))
    log.append(("bare", _declare(server, REPLY_TO)))
    log.append(("the requester's own check", _declare(conn, address)))
    # mandatory: returned though delivered, and acked
    log.append(("mandatory reply", _publish(responder, address, b"three", mandatory=True)))
    collect(conn, got, 3)
    log.append(("delivered too", got[2:]))
    # a second request on the same channel carries the same address
    ch.basic_publish("", RPC_QUEUE, b"again", pika.BasicProperties(reply_to=REPLY_TO))
    log.append(("same address", _take_request(responder) == address))
    server.close()
    conn.close()
    return log


def script_gone_and_forged(port: int) -> Log:
    log: Log = []
    conn, server = connect(port), connect(port)
    got: list[Any] = []
    ch, address = _requester(conn, "rt.gone", got)
    responder = server.channel()
    responder.confirm_delivery()
    token = address[len(REPLY_TO) + 1:]
    flipped = token[:-3] + ("AAA" if token[-3:] != "AAA" else "BBB")
    for what, key in (("forged", f"{REPLY_TO}.{flipped}"), ("garbage", f"{REPLY_TO}.garbage"),
                      ("empty", f"{REPLY_TO}."), ("unlike", f"{REPLY_TO}X")):
        log.append((what, _publish(responder, key, b"x", mandatory=True), _declare(server, key)))
    log.append(("forged, not mandatory", _publish(responder, f"{REPLY_TO}.{flipped}", b"y")))
    conn.process_data_events(time_limit=0.3)
    log.append(("nothing delivered", got[:]))
    # cancelled: gone (404), a reply dropped; consumed again: a new address
    ch.basic_cancel("rt.gone")
    log.append(("after cancel", _declare(server, address), _publish(responder, address, b"c", mandatory=True)))
    ch.basic_consume(REPLY_TO, lambda *a: got.append(a[3]), auto_ack=True, consumer_tag="rt.gone2")
    ch.basic_publish("", RPC_QUEUE, b"again", pika.BasicProperties(reply_to=REPLY_TO))
    again = _take_request(responder)
    log.append(("a new address", again != address, _address(again), _declare(server, again)))
    # the channel closed: gone
    ch.close()
    log.append(("after close", _declare(server, again), _publish(responder, again, b"d", mandatory=True),
                _publish(responder, again, b"e")))
    conn.process_data_events(time_limit=0.3)
    log.append(("still nothing", got[:]))
    server.close()
    conn.close()
    return log


def script_refused(port: int) -> Log:
    log: Log = []
    conn = connect(port)

    def consume(no_ack: bool, twice: bool = False) -> Any:
        def op(ch: Any) -> None:
            ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=no_ack)
            if twice:
                ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
        return op

    def publish_without_consumer(ch: Any) -> None:
        ch.queue_declare(RPC_QUEUE)
        ch.basic_publish("", RPC_QUEUE, b"req", pika.BasicProperties(reply_to=REPLY_TO))

    def get_pseudo(ch: Any) -> None:
        ch.basic_get(REPLY_TO)

    def consume_address(ch: Any) -> None:
        ch.basic_consume(f"{REPLY_TO}.x.1", lambda *a: None, auto_ack=True)

    for what, op in (("manual acks", consume(False)), ("a second reply consumer", consume(True, twice=True)),
                     ("reply_to without the consumer", publish_without_consumer), ("get", get_pseudo),
                     ("consume an address", consume_address)):
        refused(log, conn, what, op)
    ch = conn.channel()
    ch.queue_purge(RPC_QUEUE)
    ch.basic_publish("", RPC_QUEUE, b"req", pika.BasicProperties(reply_to=f"{REPLY_TO}.other"))
    log.append(("a reply_to only like it", _take_request(ch)))
    ch.queue_delete(RPC_QUEUE)
    conn.close()
    return log


SCRIPTS = [script_round_trip, script_gone_and_forged, script_refused]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.__name__.removeprefix("script_") for s in SCRIPTS])
def test_rabbitmq_and_ackbus_observe_the_same(script: Any, rabbit: RabbitServer, ackbus: BrokerProcess) -> None:
    theirs = script(rabbit.port)
    ours = script(ackbus.amqp_port)
    compare(theirs, ours)

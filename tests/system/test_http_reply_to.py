"""Direct reply-to with an HTTP channel as the requester, against a broker subprocess
(docs/protocol.md, "Direct reply-to"): the requester consumes
``amq.rabbitmq.reply-to`` on ``POST /channel`` and publishes its requests with
``reply_to`` ``amq.rabbitmq.reply-to``; responders over AMQP (pika), an HTTP channel
and REST take them from the queue and reply to the address they carry. Then the
refusals, on the wire: manual acks, a second reply consumer, a tag in use, and a
request on a channel without a reply consumer (nothing of it taken)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.broker import BrokerProcess, amqp_broker
from tests.support.rawchannel import ChannelGone, RawChannel

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.timeout(120)

REPLY_TO = "amq.rabbitmq.reply-to"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with amqp_broker(tmp_path_factory.mktemp("httpreplyto") / "data") as proc:
        yield proc


def _end(ch: RawChannel) -> list[dict[str, Any]]:
    """Every event until the broker ends the channel."""
    events = []
    try:
        while True:
            events.append(ch.next_event())
    except ChannelGone:
        return events


def test_an_http_requester_answered_over_amqp_an_http_channel_and_rest(broker: BrokerProcess) -> None:
    requester = RawChannel(broker.port, timeout_s=10)
    http_responder = RawChannel(broker.port, timeout_s=10)
    amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port, heartbeat=0))
    try:
        ok = requester.call({"op": "consume", "queue": REPLY_TO, "consumer_tag": "replies", "no_ack": True})
        assert (ok["ev"], ok["consumer_tag"], ok["active"]) == ("consume_ok", "replies", True)
        assert requester.call({"op": "declare_queue", "queue": "http_rpc", "durable": False})["ev"] == "ok"
        requester.send(*[
            {"op": "publish", "routing_key": "http_rpc", "body": f"call {n}",
             "properties": {"reply_to": REPLY_TO, "correlation_id": f"c{n}"}}
            for n in range(3)
        ])
        responder = amqp.channel()
        responder.confirm_delivery()
        # (a) AMQP: pika takes the first request and replies to its reply_to
        method, props, body = None, None, b""
        deadline = time.monotonic() + 10
        while method is None and time.monotonic() < deadline:
            method, props, body = responder.basic_get("http_rpc", auto_ack=True)
        assert method is not None and body == b"call 0"
        address = props.reply_to
        assert address.startswith(REPLY_TO + ".")
        responder.basic_publish("", address, body.upper(), pika.BasicProperties(correlation_id=props.correlation_id))
        # (b) an HTTP channel
        got = http_responder.call({"op": "get", "queue": "http_rpc", "no_ack": True})
        assert got["ev"] == "get_ok" and got["message"]["properties"]["reply_to"] == address
        http_responder.send({"op": "publish", "exchange": "", "routing_key": address, "body": "CALL 1",
                             "properties": {"correlation_id": got["message"]["properties"]["correlation_id"]}})
        assert http_responder.next_of("ack")["delivery_tag"] == 1
        # (c) REST
        status, leased = broker.request("POST", "/queues/http_rpc/get")
        assert status == 200, leased
        [message] = leased["messages"]
        status, answer = broker.request(
            "POST", f"/exchanges/amq.default/publish?routing_key={message['properties']['reply_to']}", b"CALL 2",
            headers={"X-Correlation-Id": message["properties"]["correlation_id"]})
        assert status == 200 and answer["confirm"] == "ack", answer
        replies = [requester.next_of("deliver") for _ in range(3)]
        assert [(r["message"]["properties"]["correlation_id"], r["message"]["body"]) for r in replies] == [
            ("c0", "CALL 0"), ("c1", "CALL 1"), ("c2", "CALL 2")]
        for r in replies:
            assert (r["consumer_tag"], r["exchange"], r["routing_key"], r["redelivered"]) == (
                "replies", "", address, False)
        tags = [r["delivery_tag"] for r in replies]
        assert tags == sorted(set(tags))  # each its own
        # the requester goes: a reply to it is confirmed and dropped
        requester.send({"op": "close"})
        assert _end(requester)[-1]["ev"] == "close_ok"
        responder.basic_publish("", address, b"too late")
        status, info = broker.request("GET", "/queues/http_rpc")
        assert status == 200 and info["messages_ready"] == 0, info
    finally:
        amqp.close()
        requester.close()
        http_responder.close()


def test_the_refusals_on_the_wire(broker: BrokerProcess) -> None:
    cases = [
        ([{"op": "consume", "queue": REPLY_TO, "id": 1}],
         ("precondition_failed", "reply consumer cannot acknowledge")),
        ([{"op": "consume", "queue": REPLY_TO, "no_ack": True},
          {"op": "consume", "queue": REPLY_TO, "no_ack": True, "id": 1}],
         ("precondition_failed", "reply consumer already set")),
        ([{"op": "declare_queue", "queue": "http_rpc_refused", "durable": False},
          {"op": "consume", "queue": "http_rpc_refused", "consumer_tag": "t"},
          {"op": "consume", "queue": REPLY_TO, "consumer_tag": "t", "no_ack": True, "id": 1}],
         ("not_allowed", "consumer tag 't' is already in use on this channel")),
        ([{"op": "declare_queue", "queue": "http_rpc_refused", "durable": False},
          {"op": "publish", "routing_key": "http_rpc_refused", "body": "x",
           "properties": {"reply_to": REPLY_TO}, "id": 1}],
         ("precondition_failed", "fast reply consumer does not exist")),
    ]
    for ops, (code, message) in cases:
        ch = RawChannel(broker.port, timeout_s=10)
        try:
            ch.send(*ops)
            error = _end(ch)[-1]
            assert (error["ev"], error.get("id"), error["error"], error["message"]) == ("error", 1, code, message)
        finally:
            ch.close()
    status, info = broker.request("GET", "/queues/http_rpc_refused")
    assert status == 200 and info["messages"] == 0, info  # nothing of the refused request

"""Direct reply-to on the HTTP channel in a cluster (broker/api/channel/
replyto.py, reader.py): a publish whose ``reply_to`` is the literal
``amq.rabbitmq.reply-to`` where that is only an ordinary property (REST has no reply
consumer, a message stored so dead-letters with it) reaches another node's queue
through the forwarding channel between the nodes, which takes what the origin node
decided verbatim: it is not a request of that channel's own (which has no reply
consumer) and must not end it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster.conftest import wait_caught_up, wait_for
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

LOCAL = {"x-queue-leader-locator": "client-local"}
REPLY_TO = "amq.rabbitmq.reply-to"


def test_a_literal_reply_to_is_forwarded_as_an_ordinary_property(nodes: Callable[[str], BrokerProcess]) -> None:
    a, b = nodes("a"), nodes("b")
    assert b.request("PUT", "/queues/there", {"durable": True, "arguments": LOCAL})[0] == 201
    assert a.request("PUT", "/queues/here", {"durable": True, "arguments": LOCAL})[0] == 201
    wait_caught_up(a, b)
    for n in range(3):  # (again: the forwarding channel to b goes on)
        status, answer = a.request(
            "POST", "/exchanges/amq.default/publish?routing_key=there", f"m{n}".encode(),
            headers={"x-reply-to": REPLY_TO},
        )
        assert status == 200 and answer.get("confirm") == "ack", answer
    got = b.drain("there")
    assert [(m["body"], m["properties"].get("reply_to")) for m in got] == [(f"m{n}", REPLY_TO) for n in range(3)]
    # the same on a single node: an ordinary property
    status, answer = a.request(
        "POST", "/exchanges/amq.default/publish?routing_key=here", b"local", headers={"x-reply-to": REPLY_TO}
    )
    assert status == 200 and answer.get("confirm") == "ack", answer
    assert [m["properties"].get("reply_to") for m in a.drain("here")] == [REPLY_TO]
    # such a message dead-lettered to b's queue: taken there (not refused, and so
    # not sent again and again, each time ending the forwarding channel)
    assert b.request("PUT", "/queues/dlq", {"durable": True, "arguments": LOCAL})[0] == 201
    assert b.request("PUT", "/exchanges/dlx", {"type": "fanout"})[0] == 201
    assert b.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq"})[0] == 201
    src = {**LOCAL, "x-dead-letter-exchange": "dlx"}
    assert a.request("PUT", "/queues/src", {"durable": True, "arguments": src})[0] == 201
    wait_caught_up(a, b)
    status, answer = a.request(
        "POST", "/exchanges/amq.default/publish?routing_key=src", b"dead", headers={"x-reply-to": REPLY_TO}
    )
    assert status == 200 and answer.get("confirm") == "ack", answer
    status, got = a.request("POST", "/queues/src/get?max=1&lease=60")
    assert status == 200 and len(got["messages"]) == 1, got
    status, answer = a.request("POST", "/queues/src/nack", {"lease_ids": [got["messages"][0]["lease_id"]], "requeue": False})
    assert status == 200, answer
    wait_for("the dead letter in b's queue", lambda: b.request("GET", "/queues/dlq")[1].get("messages_ready") == 1)
    [dead] = b.drain("dlq")
    assert (dead["body"], dead["properties"].get("reply_to")) == ("dead", REPLY_TO)
    wait_for("the source settled", lambda: a.request("GET", "/queues/src")[1].get("messages") == 0)

"""Direct reply-to on an HTTP channel in a cluster: a consumer of another
node's queue (relayed, broker/api/channel/relayed.py) cannot take the tag of the
channel's reply consumer, as a local consumer cannot (each tag names one consumer;
a cancel of it would end one of the two, the other left behind)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster.conftest import wait_caught_up
from tests.support.broker import BrokerProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow

LOCAL = {"x-queue-leader-locator": "client-local"}
REPLY_TO = "amq.rabbitmq.reply-to"


def test_a_relayed_consumer_cannot_take_the_reply_consumers_tag(nodes: Callable[[str], BrokerProcess]) -> None:
    a, b = nodes("a"), nodes("b")
    assert b.request("PUT", "/queues/there", {"durable": True, "arguments": LOCAL})[0] == 201
    wait_caught_up(a, b)
    ch = RawChannel(a.port)
    try:
        ch.send({"op": "consume", "queue": REPLY_TO, "consumer_tag": "t", "no_ack": True, "id": 1})
        assert ch.next_of("consume_ok")["consumer_tag"] == "t"
        ch.send({"op": "consume", "queue": "there", "consumer_tag": "t", "id": 2})
        ev = ch.next_event()
        assert (ev["ev"], ev.get("error"), ev.get("id")) == ("error", "not_allowed", 2), ev
    finally:
        ch.close()
    status, info = b.request("GET", "/queues/there")
    assert status == 200 and info["consumers"] == 0, info

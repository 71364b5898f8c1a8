"""Reject-publish-dlx in a cluster (core ``hold_confirm`` adding up with the
gateway's forwarding hold): one publish routed both to a full ``reject-publish-dlx``
queue of its node, whose dead letter goes to another node's queue, and to a queue
of that other node. Exactly one confirm comes, a nack (the full queue's), only once
both answers are in; the message reaches the other node's queue and the dead-letter
queue once each. The same in a transaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import node_process, wait_caught_up, wait_for, wait_synced
from tests.support.broker import BrokerProcess, stop_all
from tests.support.etcd import EtcdProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow

LOCAL = {"x-queue-leader-locator": "client-local"}


def _bodies(node: BrokerProcess, queue: str) -> list[str]:
    status, body = node.request("GET", f"/queues/{queue}/messages?limit=1000")
    assert status == 200, body
    return [m["body"] for m in body["messages"]]


def _confirms(ch: RawChannel, until_tag: int) -> list[dict[str, Any]]:
    """The channel's confirms (and any error) until one covers ``until_tag``."""
    got = []
    while True:
        ev = ch.next_event()
        if ev["ev"] in ("ack", "nack", "error"):
            got.append(ev)
        if ev["ev"] == "error" or (ev["ev"] in ("ack", "nack") and ev["delivery_tag"] >= until_tag):
            return got


def test_a_publish_refused_here_and_forwarded_there_has_one_nack(tmp_path: Path, etcd: EtcdProcess) -> None:
    a, b = (node_process(tmp_path, etcd, n) for n in ("a", "b"))
    try:
        for p in (a, b):
            p.start()
        for p in (a, b):
            wait_synced(p)
        # on b: the dead-letter queue and another queue the publish reaches
        for queue in ("dlq", "there"):
            assert b.request("PUT", f"/queues/{queue}", {"durable": True, "arguments": LOCAL})[0] == 201
        assert b.request("PUT", "/exchanges/dlx", {"type": "fanout"})[0] == 201
        assert b.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq"})[0] == 201
        # on a: the full queue that refuses and dead-letters
        src_args = {**LOCAL, "x-dead-letter-exchange": "dlx", "x-max-length": 1, "x-overflow": "reject-publish-dlx"}
        assert a.request("PUT", "/queues/src", {"durable": True, "arguments": src_args})[0] == 201
        assert a.request("PUT", "/exchanges/fan", {"type": "fanout"})[0] == 201
        for queue in ("src", "there"):
            assert a.request("POST", "/bindings", {"exchange": "fan", "queue": queue})[0] == 201
        wait_caught_up(a, b)
        wait_caught_up(b, a)
        ch = RawChannel(a.port)
        try:
            ch.send({"op": "publish", "routing_key": "src", "body": "fill"})
            assert [e["ev"] for e in _confirms(ch, 1)] == ["ack"]
            ch.send({"op": "publish", "exchange": "fan", "body": "both"})
            [nack] = _confirms(ch, 2)
            assert (nack["ev"], nack["delivery_tag"], nack["multiple"]) == ("nack", 2, False), nack
            assert "full" in nack["reason"], nack
            wait_for("the copy there and the dead letter", lambda: (_bodies(b, "there"), _bodies(b, "dlq")) == (
                ["both"], ["both"]))
            # a transaction's publish: the same at its commit
            ch.send({"op": "tx_select", "id": 1})
            assert ch.next_of("ok")["id"] == 1
            ch.send({"op": "publish", "exchange": "fan", "body": "in tx"}, {"op": "tx_commit", "id": 2})
            events = []
            while not any(e.get("id") == 2 for e in events):
                events.append(ch.next_event())
            assert [e for e in events if e["ev"] == "error"] == [], events
            confirms = [e for e in events if e["ev"] in ("ack", "nack")]
            while not confirms:
                ev = ch.next_event()
                assert ev["ev"] != "error", ev
                if ev["ev"] in ("ack", "nack"):
                    confirms.append(ev)
            assert [(e["ev"], e["delivery_tag"]) for e in confirms] == [("nack", 3)], confirms
            wait_for("the transaction's copy there and its dead letter", lambda: (
                _bodies(b, "there"), _bodies(b, "dlq")) == (["both", "in tx"], ["both", "in tx"]))
            # nothing more comes: the next publish (the channel is still transactional)
            # is confirmed alone
            ch.send({"op": "publish", "routing_key": "nowhere", "body": "x"}, {"op": "tx_commit", "id": 3})
            assert [(e["ev"], e["delivery_tag"]) for e in _confirms(ch, 4)] == [("ack", 4)]
        finally:
            ch.close()
        assert _bodies(a, "src") == ["fill"]
    finally:
        stop_all([a, b])

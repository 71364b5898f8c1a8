"""The delayed-message exchange in a cluster: its declare is checked before etcd takes
it, and a publish with ``x-delay`` on one node, routed there to a queue of that node
and to one of another node, is held back once in each queue (the forwarded copy by
its owner) and arrives after the delay (real etcd, real broker subprocesses)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.cluster.conftest import (
    channel_publish,
    cluster_nodes,
    wait_caught_up,
    wait_for,
)
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]


def test_a_delayed_publish_on_one_node_is_held_once_by_each_owner(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("two alive on each", lambda: all(
        sum(v["alive"] for v in cluster_nodes(n).values()) == 2 for n in (a, b)
    ))
    status, answer = a.request("PUT", "/exchanges/dx", {"type": "x-delayed-message"})
    assert status == 400 and "x-delayed-type" in answer["message"], answer  # refused before etcd
    assert b.request("GET", "/exchanges/dx")[0] == 404
    status, answer = a.request(
        "PUT", "/exchanges/dx", {"type": "x-delayed-message", "arguments": {"x-delayed-type": "fanout"}}
    )
    assert status == 201, answer
    for name, owner in (("qa", a), ("qb", b)):
        status, answer = owner.request(
            "PUT", f"/queues/{name}", {"durable": True, "arguments": {"x-queue-leader-locator": "client-local"}}
        )
        assert status == 201, answer
        assert a.request("POST", "/bindings", {"exchange": "dx", "queue": name})[0] == 201
    wait_caught_up(a, b)
    wait_caught_up(b, a)

    def routes_to_both() -> bool:  # a knows both bindings (the probes are not delayed)
        status, answer = a.request("POST", "/exchanges/dx/publish", b"probe", timeout_s=15)
        return status == 200 and answer.get("routed") == 2

    wait_for("a routing to qa and qb", routes_to_both, timeout_s=30)
    for name, owner in (("qa", a), ("qb", b)):
        assert {m["body"] for m in owner.drain(name)} == {"probe"}

    delay_ms = 1000
    sent = time.monotonic()
    events = channel_publish(a, [
        {"exchange": "dx", "routing_key": "", "body": "soon", "properties": {"headers": {"x-delay": delay_ms}}},
        {"exchange": "dx", "routing_key": "", "body": "held", "properties": {"headers": {"x-delay": 600_000}}},
    ])
    assert [(e["ev"], e["delivery_tag"]) for e in events] in ([("ack", 1), ("ack", 2)], [("ack", 2)]), events

    for name, owner in (("qa", a), ("qb", b)):
        def arrived(name: str = name, owner: BrokerProcess = owner) -> list[dict[str, object]]:
            status, answer = owner.request("POST", f"/queues/{name}/get?max=10&lease=600")
            assert status == 200, answer
            return list(answer["messages"])

        (message,) = wait_for(f"the delayed message in {name}", arrived, timeout_s=30)
        assert time.monotonic() - sent >= delay_ms / 1000
        assert message["body"] == "soon", message
        assert message["properties"] == {"headers": {"x-delay": -delay_ms}}, message
        # the ten-minute one is held by the queue's owner, once; nothing else is left
        status, info = owner.request("GET", f"/queues/{name}")
        assert status == 200, info
        assert (info["messages_delayed"], info["messages_ready"]) == (1, 0), (name, info)

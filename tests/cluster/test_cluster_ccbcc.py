"""Sender-selected distribution in a cluster: a publish whose CC and BCC keys reach
queues of other nodes (a quorum queue among them) is forwarded to each owner, which
stores it without BCC; mandatory returns it only when no key routes anywhere (real
etcd, real broker subprocesses on loopback)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster.conftest import channel_publish, cluster_nodes, wait_for
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]


def test_cc_and_bcc_keys_reach_queues_on_other_nodes_without_bcc(nodes: Nodes) -> None:
    a, b, c = nodes("a"), nodes("b"), nodes("c")
    wait_for("three alive on each", lambda: all(
        sum(v["alive"] for v in cluster_nodes(n).values()) == 3 for n in (a, b, c)
    ))
    assert a.request("PUT", "/exchanges/x", {"type": "direct"})[0] == 201
    for name, owner, arguments in (
        ("qa", a, {"x-queue-leader-locator": "client-local"}),
        ("qb", b, {"x-queue-leader-locator": "client-local"}),
        ("qq", a, {"x-queue-type": "quorum"}),
    ):
        status, answer = owner.request("PUT", f"/queues/{name}", {"durable": True, "arguments": arguments})
        assert status == 201, answer
        assert a.request("POST", "/bindings", {"exchange": "x", "queue": name, "routing_key": f"k{name[1]}"})[0] == 201

    def routes_everywhere() -> bool:  # c (owning nothing) knows every binding, and qq has a leader
        status, answer = c.request(
            "POST", "/exchanges/x/publish?routing_key=kq&mandatory=true", b"probe",
            headers={"X-Message-Id": "probe"}, timeout_s=15,
        )
        return status == 200 and answer.get("confirm") == "ack"

    wait_for("c routing to every queue", routes_everywhere, timeout_s=30)
    headers = {"CC": ["kb", "nowhere"], "BCC": ["kq"], "h": "v"}
    events = channel_publish(c, [
        {"exchange": "x", "routing_key": "ka", "body": "sent", "properties": {"headers": headers}, "mandatory": True},
        {"exchange": "x", "routing_key": "none", "body": "lost", "mandatory": True,
         "properties": {"headers": {"CC": ["n2"], "BCC": ["n3"]}}},
    ])
    assert [(e["ev"], e["delivery_tag"]) for e in events] == [("ack", 1), ("return", 2), ("ack", 2)], events
    assert events[1]["message"]["properties"]["headers"] == {"CC": ["n2"]}, events  # BCC not returned either
    for queue, node in (("qa", a), ("qb", b), ("qq", c)):
        got = [m for m in node.drain(queue) if m["body"] == "sent"]
        assert len(got) == 1, (queue, got)
        assert got[0]["properties"]["headers"] == {"CC": ["kb", "nowhere"], "h": "v"}, (queue, got)

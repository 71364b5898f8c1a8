"""The management API's reads, purge and get in a cluster (broker/api/management/
cluster.py): asked on any node they answer for the cluster, as RabbitMQ's nodes do.
A call about one queue goes to the node that serves it (a quorum queue's leader);
a list is merged from every member's own part; a member that is down is left out
(its queues listed from the metadata with ``state: "down"``). Real nodes on a
private etcd: KEDA's scaler and monitors ask whichever node their URL names."""

from __future__ import annotations

import base64
import os
import signal
import time
from typing import Any
from urllib.parse import quote

import pytest

from tests.cluster.conftest import cluster_nodes, wait_caught_up, wait_for
from tests.cluster.test_replication import leader_of
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow

HERE = {"durable": True, "arguments": {"x-queue-leader-locator": "client-local"}}


def _publish(node: Any, queue: str, payload: str) -> None:
    body = {"properties": {}, "routing_key": queue, "payload": payload, "payload_encoding": "string"}
    status, answer = node.request("POST", "/api/exchanges/%2F/amq.default/publish", body)
    assert (status, answer) == (200, {"routed": True})


def _queue(node: Any, name: str) -> dict[str, Any]:
    status, body = node.request("GET", f"/api/queues/%2F/{name}")
    assert status == 200, body
    return dict(body)


def _listed(node: Any, path: str = "/api/queues") -> dict[str, dict[str, Any]]:
    status, body = node.request("GET", path)
    assert status == 200, body
    return {item["name"]: item for item in body}


def test_any_node_answers_for_the_queues_another_node_serves(nodes: Any) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("both alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 2)
    assert a.request("PUT", "/api/queues/%2F/jobs", HERE)[0] == 201
    assert a.request("PUT", "/api/queues/%2F/watched", HERE)[0] == 201
    assert a.request("PUT", "/api/exchanges/%2F/events", {"type": "fanout", "durable": True})[0] == 201
    assert a.request("POST", "/api/bindings/%2F/e/events/q/jobs", {"routing_key": "k"})[0] == 201
    assert b.request("PUT", "/api/queues/%2F/mine", HERE)[0] == 201
    wait_caught_up(b, a)
    wait_caught_up(a, b)
    for payload in ("m1", "m2", "m3"):
        _publish(b, "jobs", payload)  # forwarded to a
    _publish(b, "mine", "x")
    wait_for("3 on a", lambda: _queue(a, "jobs")["messages"] == 3)

    # one queue, asked through b: a's counts, a's node name
    shown = _queue(b, "jobs")
    assert (shown["messages"], shown["messages_ready"], shown["node"]) == (3, 3, "ackbus@a")
    assert _queue(b, "mine")["node"] == "ackbus@b"
    status, bindings = b.request("GET", "/api/queues/%2F/jobs/bindings")
    assert status == 200 and {x["source"] for x in bindings} == {"", "events"}, bindings
    status, pair = b.request("GET", "/api/bindings/%2F/e/events/q/jobs")
    assert status == 200 and [x["routing_key"] for x in pair] == ["k"], pair
    get = {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}
    status, got = b.request("POST", "/api/queues/%2F/jobs/get", get)
    assert status == 200 and [m["payload"] for m in got] == ["m1"] and got[0]["message_count"] == 2, got
    assert _queue(a, "jobs")["messages"] == 2

    # consumers of a's queue: one on a's node, one on b's (relayed to a): each once
    ch, relayed = RawChannel(a.port), RawChannel(b.port)
    try:
        assert ch.call({"op": "consume", "queue": "watched", "consumer_tag": "watcher"})["ev"] == "consume_ok"
        assert relayed.call({"op": "consume", "queue": "watched", "consumer_tag": "far"})["ev"] == "consume_ok"

        # the lists through b: every queue once, with its server's counts
        listed = _listed(b)
        assert {n: (q["node"], q["messages"]) for n, q in listed.items()} == {
            "jobs": ("ackbus@a", 2), "watched": ("ackbus@a", 0), "mine": ("ackbus@b", 1)
        }
        assert set(_listed(a)) == set(_listed(b, "/api/queues/%2F")) == set(listed)
        status, page = b.request("GET", "/api/queues?page=1&page_size=1&sort=messages&sort_reverse=true&columns=name,messages")
        assert status == 200, page
        assert (page["items"], page["total_count"], page["page_count"]) == ([{"name": "jobs", "messages": 2}], 3, 3)
        status, overview = b.request("GET", "/api/overview")
        assert status == 200, overview
        assert (overview["queue_totals"]["messages"], overview["object_totals"]["queues"]) == (3, 3), overview
        assert overview["node"] == "ackbus@b"
        status, consumers = b.request("GET", "/api/consumers")
        assert status == 200, consumers
        assert sorted((c["consumer_tag"], c["queue"]["name"]) for c in consumers) == [("far", "watched"), ("watcher", "watched")]
        status, all_bindings = b.request("GET", "/api/bindings")
        assert status == 200, all_bindings
        assert {(x["source"], x["destination"]) for x in all_bindings} == {
            ("", "jobs"), ("", "watched"), ("", "mine"), ("events", "jobs")
        }
        status, members = b.request("GET", "/api/nodes")
        assert status == 200 and {(n["name"], n["running"]) for n in members} == {("ackbus@a", True), ("ackbus@b", True)}
        assert b.request("GET", "/api/nodes/ackbus@a")[1]["running"] is True
        status, vhost = b.request("GET", "/api/vhosts/%2F")
        assert status == 200 and vhost["messages"] == 3, vhost
        assert vhost["cluster_state"] == {"ackbus@a": "running", "ackbus@b": "running"}
        status, exchanges = b.request("GET", "/api/exchanges")
        assert status == 200 and "events" in {x["name"] for x in exchanges}, exchanges
        # who is connected, through either node: each client's own connection and
        # channel once, on its node (b's channel to a for its relayed consumer is the
        # cluster's, not a connection)
        for asked in (a, b):
            status, connections = asked.request("GET", "/api/connections")
            assert status == 200 and sorted(c["node"] for c in connections) == ["ackbus@a", "ackbus@b"], connections
            status, channels = asked.request("GET", "/api/channels")
            assert status == 200, channels
            assert sorted((c["node"], c["consumer_count"]) for c in channels) == [("ackbus@a", 1), ("ackbus@b", 0)]
        on_a = next(c for c in connections if c["node"] == "ackbus@a")
        status, one = b.request("GET", f"/api/connections/{quote(on_a['name'], safe='')}")
        assert (status, one) == (200, on_a), one
        on_b = next(c for c in channels if c["node"] == "ackbus@b")
        status, one = a.request("GET", f"/api/channels/{quote(on_b['name'], safe='')}")
        assert status == 200 and one["node"] == "ackbus@b", one
        assert b.request("GET", "/api/channels/nope")[1] == {"error": "Object Not Found", "reason": "Not Found"}
        # columns on one queue relayed to its node: applied there
        assert _queue(b, "jobs?columns=name,node") == {"name": "jobs", "node": "ackbus@a"}
    finally:
        ch.close()
        relayed.close()

    # purge through b
    assert b.request("DELETE", "/api/queues/%2F/jobs/contents")[0] == 204
    assert _queue(a, "jobs")["messages"] == 0
    _publish(b, "jobs", "after")
    wait_for("1 on a", lambda: _queue(a, "jobs")["messages"] == 1)

    # a frozen (SIGSTOP: it holds its connections open and answers nothing): b's
    # list still answers, within the time a node is given, a's queues down
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        listed = _listed(b)
        assert time.monotonic() - started < 10
        assert (listed["jobs"]["state"], listed["mine"]["messages"]) == ("down", 1)
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)

    # a stopped: b still lists, a's queues down and without counts; a's queue alone: 503
    a.stop()
    listed = _listed(b)
    assert set(listed) == {"jobs", "watched", "mine"}
    assert (listed["jobs"]["state"], listed["jobs"]["node"], "messages" in listed["jobs"]) == ("down", "ackbus@a", False)
    assert (listed["mine"]["state"], listed["mine"]["messages"]) == ("running", 1)
    status, body = b.request("GET", "/api/queues/%2F/jobs")
    assert status == 503 and body["error"] == "queue_unavailable" and "reason" in body, body
    status, overview = b.request("GET", "/api/overview")
    assert status == 200 and (overview["queue_totals"]["messages"], overview["object_totals"]["queues"]) == (1, 3)
    status, members = b.request("GET", "/api/nodes")
    assert status == 200 and {(n["name"], n["running"]) for n in members} == {("ackbus@a", False), ("ackbus@b", True)}


def test_a_quorum_queues_counts_come_from_its_leader(nodes: Any) -> None:
    procs = {name: nodes(name) for name in ("a", "b")}
    wait_for("both alive", lambda: sum(n["alive"] for n in cluster_nodes(procs["a"]).values()) == 2)
    status, body = procs["a"].request("PUT", "/api/queues/%2F/qq", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    assert status == 201, body
    leader = leader_of(procs, "qq")
    name = next(n for n, p in procs.items() if p is leader)
    follower = next(p for p in procs.values() if p is not leader)
    for payload in ("q1", "q2"):
        _publish(follower, "qq", payload)
    wait_for("2 on the leader", lambda: _queue(leader, "qq")["messages"] == 2)
    shown = _queue(follower, "qq")
    assert (shown["messages"], shown["node"], shown["type"]) == (2, f"ackbus@{name}", "quorum")
    listed = _listed(follower)
    assert (listed["qq"]["messages"], listed["qq"]["node"]) == (2, f"ackbus@{name}")

    # with users: each member checks the client's own credentials
    admin = {"Authorization": "Basic " + base64.b64encode(b"admin:admin-pw").decode()}
    bob = {"Authorization": "Basic " + base64.b64encode(b"bob:bob-pw").decode()}
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert leader.request("PUT", "/users/admin", {"password": "admin-pw", "tags": ["administrator"], "permissions": everything})[0] == 201
    assert leader.request("PUT", "/users/bob", {"password": "bob-pw", "permissions": everything}, headers=admin)[0] == 201
    wait_for("users on the follower", lambda: follower.request("GET", "/api/whoami", headers=bob)[0] == 200)
    status, body = follower.request("GET", "/api/queues", headers=bob)
    assert status == 200 and [(q["name"], q["messages"]) for q in body] == [("qq", 2)], body
    status, body = follower.request("GET", "/api/queues")
    assert status == 401 and body["error"] == "not_authorized" and body["reason"], body  # RabbitMQ's body
    assert follower.request("GET", "/api/queues/%2F/qq")[0] == 401
    status, body = follower.request("GET", "/api/consumers", headers=bob)  # needs the administrator tag
    assert status == 401 and body["error"] == "not_authorised", body
    assert follower.request("GET", "/api/consumers", headers=admin)[0] == 200

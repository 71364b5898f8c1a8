"""Any node serves any queue: publishes forwarded to the queues' owners over channels
between nodes, REST calls about a queue relayed to its owner, and a dead owner's
queues answering 503 while every other queue keeps working (real etcd, real broker
subprocesses on loopback)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster.conftest import (
    TTL_S,
    channel_publish,
    cluster_nodes,
    wait_caught_up,
    wait_for,
    wait_synced,
)
from tests.support.broker import BrokerProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]


def _three(nodes: Nodes) -> tuple[BrokerProcess, BrokerProcess, BrokerProcess]:
    a, b, c = nodes("a"), nodes("b"), nodes("c")
    wait_for("three alive on each", lambda: all(
        sum(v["alive"] for v in cluster_nodes(n).values()) == 3 for n in (a, b, c)
    ))
    return a, b, c


def _declare_on(node: BrokerProcess, name: str, owner_node: BrokerProcess, *also: BrokerProcess, **body: Any) -> None:
    """Declare ``name`` owned by ``owner_node`` (client-local there), from ``node``'s
    view: wait until ``node`` (and each node in ``also``) sees it. Each node learns it
    by its own watch: one that has seen it says nothing of another."""
    args = dict(body.pop("arguments", {}))
    args["x-queue-leader-locator"] = "client-local"
    status, answer = owner_node.request("PUT", f"/queues/{name}", {"arguments": args, **body})
    assert status in (200, 201), answer
    for seer in (node, *also):
        wait_for(f"{name} seen on {seer.url}", lambda seer=seer: seer.request("GET", f"/queues/{name}")[0] == 200)


def _bodies(node: BrokerProcess, queue: str) -> list[str]:
    return [m["body"] for m in node.drain(queue)]


def test_declare_on_one_publish_on_a_second_consume_on_a_third(nodes: Nodes) -> None:
    a, b, c = _three(nodes)
    assert a.request("PUT", "/exchanges/fan", {"type": "fanout"})[0] == 201
    # one queue on each node, all bound to one fanout exchange
    for name, owner in (("qa", a), ("qb", b), ("qc", c)):
        _declare_on(a, name, owner, c)  # (c publishes to qa and gets from qa and qb)
        assert a.request("POST", "/bindings", {"exchange": "fan", "queue": name})[0] == 201
    wait_caught_up(b, a)  # the bindings seen on b
    # REST publish on b reaches every owner once; the confirm waits for all of them
    status, answer = b.request("POST", "/exchanges/fan/publish", b"rest-1")
    assert status == 200 and answer["confirm"] == "ack" and answer["routed"] == 3, answer
    # channel publishes on b, batched over the node-to-node channels
    events = channel_publish(b, [{"exchange": "fan", "body": f"ch-{i}"} for i in range(50)])
    assert all(e["ev"] == "ack" for e in events), events
    # the default exchange, to a queue owned elsewhere
    events = channel_publish(c, [{"routing_key": "qa", "body": "direct-1"}])
    assert events[-1]["ev"] == "ack"
    forwarding = b.request("GET", "/cluster")[1]["forwarding"]
    assert forwarding["forwarded"] >= 2 * 51 and set(forwarding["peers"]) == {"a", "c"}, forwarding
    # batched: one channel per peer carried them all
    assert all(p["sent"] >= 51 for p in forwarding["peers"].values())
    expected = ["rest-1"] + [f"ch-{i}" for i in range(50)]
    # consumed through a third node: gets relayed to each owner
    assert _bodies(c, "qa") == expected + ["direct-1"]
    assert _bodies(c, "qb") == expected  # no duplicate: each owner routes to its own queues only
    assert _bodies(a, "qc") == expected


def test_gets_acks_and_purges_reach_the_owner_from_any_node(nodes: Nodes) -> None:
    a, b, c = _three(nodes)
    _declare_on(c, "jobs", a, b)
    for i in range(3):
        assert c.request("POST", "/exchanges/amq.default/publish?routing_key=jobs", f"j{i}".encode())[1]["confirm"] == "ack"
    status, got = b.request("POST", "/queues/jobs/get?max=2&lease=60")
    assert status == 200 and [m["body"] for m in got["messages"]] == ["j0", "j1"], got
    lease_ids = [m["lease_id"] for m in got["messages"]]
    status, acked = c.request("POST", "/queues/jobs/ack", {"lease_ids": lease_ids})
    assert status == 200, acked
    status, info = b.request("GET", "/queues/jobs")
    assert status == 200 and info["messages_ready"] == 1, info
    assert c.request("POST", "/queues/jobs/purge")[0] == 200
    assert a.request("GET", "/queues/jobs")[1]["messages_ready"] == 0
    # a queue nobody has is still a 404
    assert b.request("POST", "/queues/nowhere/get")[0] == 404


def test_mandatory_return_and_alternate_exchange_across_owners(nodes: Nodes) -> None:
    a, b, c = _three(nodes)
    assert a.request("PUT", "/exchanges/alt", {"type": "fanout"})[0] == 201
    assert a.request("PUT", "/exchanges/main", {"type": "direct", "arguments": {"alternate-exchange": "alt"}})[0] == 201
    _declare_on(a, "routed", b)
    _declare_on(a, "unrouted", c, b)
    assert a.request("POST", "/bindings", {"exchange": "main", "queue": "routed", "routing_key": "k"})[0] == 201
    assert a.request("POST", "/bindings", {"exchange": "alt", "queue": "unrouted"})[0] == 201
    assert a.request("PUT", "/exchanges/lonely", {"type": "direct"})[0] == 201
    wait_for("bindings on a", lambda: len(a.request("GET", "/bindings")[1]["bindings"]) >= 0)
    events = channel_publish(a, [
        {"exchange": "main", "routing_key": "k", "body": "to-b"},
        {"exchange": "main", "routing_key": "other", "body": "to-alt"},
        {"exchange": "lonely", "routing_key": "x", "body": "back", "mandatory": True},
    ])
    kinds = [e["ev"] for e in events]
    assert kinds.count("return") == 1 and kinds[-1] == "ack", events
    assert _bodies(a, "routed") == ["to-b"]
    assert _bodies(b, "unrouted") == ["to-alt"]


def test_a_dead_owner_gives_503_for_its_queues_only_and_keeps_what_it_confirmed(nodes: Nodes) -> None:
    a, b, c = _three(nodes)
    assert a.request("PUT", "/exchanges/fan", {"type": "fanout"})[0] == 201
    _declare_on(a, "on-b", b)
    _declare_on(a, "on-c", c)
    for q in ("on-b", "on-c"):
        assert a.request("POST", "/bindings", {"exchange": "fan", "queue": q})[0] == 201
    events = channel_publish(a, [{"exchange": "fan", "body": f"m{i}"} for i in range(20)])
    assert all(e["ev"] == "ack" for e in events)
    c.kill()
    wait_for("c dead on a", lambda: not cluster_nodes(a)["c"]["alive"], timeout_s=TTL_S + 8)
    status, err = a.request("POST", "/queues/on-c/get")
    assert status == 503 and err["error"] == "queue_unavailable", err
    # the other queue keeps working
    status, answer = a.request("POST", "/exchanges/fan/publish", b"while-down")
    assert status == 503 and answer["confirm"] == "nack" and answer["reason"].startswith("queue_unavailable"), answer
    events = channel_publish(b, [{"exchange": "fan", "body": "ch-while-down"}])
    assert events[-1]["ev"] == "nack" and events[-1]["reason"].startswith("queue_unavailable"), events
    assert _bodies(b, "on-b") == [f"m{i}" for i in range(20)] + ["while-down", "ch-while-down"]
    c.start()
    wait_synced(c)
    wait_for("c alive on a", lambda: cluster_nodes(a)["c"]["alive"])
    # everything c confirmed before it died is there
    assert _bodies(a, "on-c") == [f"m{i}" for i in range(20)]


def _channel_ops(node: BrokerProcess, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send ``ops`` (each with an ``id``) on one channel; their replies, in order."""
    ch = RawChannel(node.port)
    try:
        ch.send(*[{**op, "id": i} for i, op in enumerate(ops)])
        replies: list[dict[str, Any]] = []
        while len(replies) < len(ops):
            ev = ch.next_event()
            assert ev["ev"] != "error", ev
            if "id" in ev:
                replies.append(ev)
        return replies
    finally:
        ch.close()


def test_channel_declares_and_binds_go_through_etcd(nodes: Nodes) -> None:
    a, b, c = _three(nodes)
    replies = _channel_ops(b, [
        {"op": "declare_exchange", "exchange": "events", "type": "topic"},
        {"op": "declare_queue", "queue": "audit", "arguments": {"x-queue-leader-locator": "client-local"}},
        {"op": "declare_queue", "queue": "mail"},
        {"op": "bind", "exchange": "events", "queue": "audit", "routing_key": "#"},
        {"op": "bind", "exchange": "events", "queue": "mail", "routing_key": "user.*"},
    ])
    assert [r["ev"] for r in replies] == ["ok"] * 5 and replies[1]["created"] is True, replies
    owners = {q: n["name"] for n in cluster_nodes(a).values() for q in n["queues"]}
    assert owners["audit"] == "b" and "mail" in owners
    # the same declare on another node's channel is not a conflict; another one is, everywhere
    again = _channel_ops(c, [{"op": "declare_queue", "queue": "audit"}])
    assert again[0]["ev"] == "ok" and again[0]["created"] is False
    ch = RawChannel(a.port)
    try:
        ch.send({"op": "declare_queue", "queue": "audit", "arguments": {"x-message-ttl": 5}, "id": 1})
        ev = ch.next_event()
        assert ev["ev"] == "error" and ev["error"] == "precondition_failed", ev
    finally:
        ch.close()
    wait_for("bindings on c", lambda: a.request("GET", "/queues/mail")[0] == 200)
    events = channel_publish(c, [{"exchange": "events", "routing_key": "user.new", "body": "u1"},
                                  {"exchange": "events", "routing_key": "disk.full", "body": "d1"}])
    assert all(e["ev"] == "ack" for e in events)
    assert _bodies(a, "audit") == ["u1", "d1"]
    assert _bodies(a, "mail") == ["u1"]
    # a restart keeps them: they are in etcd, not only in b's core
    b.terminate()
    b.start()
    wait_synced(b)  # (alive on a as soon as it registered; its unbind and delete answer 503 until it read its view)
    wait_for("b back", lambda: cluster_nodes(a)["b"]["alive"])
    assert b.request("GET", "/exchanges/events")[0] == 200
    replies = _channel_ops(b, [{"op": "unbind", "exchange": "events", "queue": "mail", "routing_key": "user.*"},
                               {"op": "delete_queue", "queue": "audit"}])
    assert [r["ev"] for r in replies] == ["ok", "ok"], replies
    wait_for("audit gone everywhere", lambda: "audit" not in {q for n in cluster_nodes(c).values() for q in n["queues"]})


def test_a_relayed_consumer_without_prefetch_takes_the_channels_qos(nodes: Nodes) -> None:
    """A consume that names no prefetch takes the channel's qos, on the owner too."""
    a, b = nodes("a"), nodes("b")
    wait_for("two alive on each", lambda: all(
        sum(v["alive"] for v in cluster_nodes(n).values()) == 2 for n in (a, b)))
    _declare_on(b, "work", a)
    assert all(e["ev"] == "ack" for e in channel_publish(a, [{"routing_key": "work", "body": f"w{i}"} for i in range(6)]))
    ch = RawChannel(b.port)
    try:
        ch.send({"op": "qos", "prefetch": 2, "id": 1}, {"op": "consume", "queue": "work", "id": 2})
        got = []
        while len(got) < 2:
            ev = ch.next_event()
            if ev["ev"] == "deliver":
                got.append(ev)
        wait_for("the owner holds two unacked", lambda: a.request("GET", "/queues/work")[1]["messages_unacked"] == 2)
        assert a.request("GET", "/queues/work")[1]["messages_ready"] == 4  # prefetch 2 holds on the owner
        # a per-consumer qos now is for later consumers; a global one bounds each relayed
        # consumer on the owner, from its consume on and at once when it changes
        ch.send({"op": "qos", "prefetch": 5, "id": 3}, {"op": "qos", "prefetch": 3, "global": True, "id": 4},
                {"op": "consume", "queue": "work", "id": 5})
        wait_for("3 more out on the owner", lambda: a.request("GET", "/queues/work")[1]["messages_unacked"] == 5)
        ch.send({"op": "qos", "prefetch": 0, "global": True, "id": 6})
        wait_for("the last one out", lambda: a.request("GET", "/queues/work")[1]["messages_unacked"] == 6)
    finally:
        ch.close()


def test_a_channel_consumer_on_one_node_consumes_a_queue_owned_by_another(nodes: Nodes) -> None:
    a, b, c = _three(nodes)
    _declare_on(b, "work", a)
    _declare_on(b, "local", b)
    # c routes the publishes: it must have seen both declares (its watch)
    wait_for("work and local seen on c", lambda: all(
        c.request("GET", f"/queues/{name}")[0] == 200 for name in ("work", "local")))
    events = channel_publish(c, [{"routing_key": "work", "body": f"w{i}"} for i in range(5)]
                              + [{"routing_key": "local", "body": "l0"}])
    assert all(e["ev"] == "ack" for e in events)
    ch = RawChannel(b.port)
    try:
        ch.send({"op": "consume", "queue": "work", "prefetch": 2, "id": 1},
                {"op": "consume", "queue": "local", "id": 2})
        got: list[dict[str, Any]] = []
        oks = 0
        while len(got) < 3 or oks < 2:
            ev = ch.next_event()
            assert ev["ev"] in ("consume_ok", "deliver"), ev
            if ev["ev"] == "consume_ok":
                oks += 1
            else:
                got.append(ev)
        # prefetch 2 holds on the owner; the tags are this channel's, all distinct
        assert sorted(m["message"]["body"] for m in got) == ["l0", "w0", "w1"]
        assert len({m["delivery_tag"] for m in got}) == 3
        for m in got:
            ch.send({"op": "ack", "delivery_tag": m["delivery_tag"]})
        seen = [m["message"]["body"] for m in got]
        while len(seen) < 6:
            ev = ch.next_event()
            assert ev["ev"] == "deliver", ev
            seen.append(ev["message"]["body"])
            ch.send({"op": "ack", "delivery_tag": ev["delivery_tag"]})
        assert sorted(seen) == ["l0"] + [f"w{i}" for i in range(5)]
        ch.send({"op": "declare_exchange", "exchange": "amq.direct", "passive": True, "id": 3})  # a barrier
        assert ch.next_event()["ev"] == "ok"
    finally:
        ch.close()
    wait_for("acks reached the owner", lambda: a.request("GET", "/queues/work")[1]["messages_unacked"] == 0)
    assert a.request("GET", "/queues/work")[1]["messages_ready"] == 0
    # unacked relayed deliveries go back to the owner's queue when the channel ends
    channel_publish(c, [{"routing_key": "work", "body": "again"}])
    ch = RawChannel(c.port)
    try:
        ch.send({"op": "consume", "queue": "work", "id": 1})
        evs = [ch.next_event(), ch.next_event()]
        assert [e["ev"] for e in evs] == ["consume_ok", "deliver"], evs
        a.kill()
        ev = ch.next_event()
        assert ev["ev"] == "cancel" and ev["reason"].startswith("queue_unavailable"), ev
        wait_for("a dead on c", lambda: not cluster_nodes(c)["a"]["alive"], timeout_s=TTL_S + 8)
        ch.send({"op": "consume", "queue": "work", "id": 2})
        ev = ch.next_event()
        assert ev["ev"] == "error" and ev["error"] == "queue_unavailable", ev
    finally:
        ch.close()
    a.start()
    wait_synced(a)
    wait_for("a back on b", lambda: cluster_nodes(b)["a"]["alive"])
    assert _bodies(b, "work") == ["again"]


def test_delays_and_priorities_cross_owners(nodes: Nodes) -> None:
    a, b, c = _three(nodes)
    _declare_on(a, "prio", b, c, arguments={"x-max-priority": 9})
    _declare_on(a, "later", c)
    events = channel_publish(a, [
        {"routing_key": "prio", "body": "low", "properties": {"priority": 1}},
        {"routing_key": "prio", "body": "high", "properties": {"priority": 8}},
        {"routing_key": "later", "body": "delayed", "delay_s": 1.5},
    ])
    assert all(e["ev"] == "ack" for e in events)
    assert _bodies(c, "prio") == ["high", "low"]
    status, now = a.request("POST", "/queues/later/get")
    assert status == 200 and now["messages"] == []  # held back on its owner
    wait_for("the delayed message", lambda: a.request("GET", "/queues/later")[1]["messages_ready"] == 1, timeout_s=10)
    assert _bodies(a, "later") == ["delayed"]


def test_a_dead_letter_reaches_a_queue_on_another_node(nodes: Nodes) -> None:
    a, b, c = _three(nodes)
    assert a.request("PUT", "/exchanges/dlx", {"type": "fanout"})[0] == 201
    _declare_on(c, "dead", b)
    assert a.request("POST", "/bindings", {"exchange": "dlx", "queue": "dead"})[0] == 201
    _declare_on(c, "work", a, arguments={"x-dead-letter-exchange": "dlx"})
    wait_for("the binding on a", lambda: a.request("GET", "/queues/dead")[0] == 200)
    events = channel_publish(c, [{"routing_key": "work", "body": "doomed"}])
    assert events[-1]["ev"] == "ack"
    status, got = c.request("POST", "/queues/work/get?lease=60")
    assert status == 200 and len(got["messages"]) == 1, got
    status, _ = c.request("POST", "/queues/work/nack", {"lease_ids": [got["messages"][0]["lease_id"]], "requeue": False})
    assert status == 200
    dead = wait_for("the dead letter on b", lambda: c.request("POST", "/queues/dead/get?lease=60")[1]["messages"])
    assert dead[0]["body"] == "doomed"
    death = dead[0]["properties"]["headers"]["x-death"][0]
    assert death["queue"] == "work" and death["reason"] == "rejected"


def test_exchange_to_exchange_bindings_and_a_stream_across_owners(nodes: Nodes) -> None:
    import http.client
    import json

    a, b, c = _three(nodes)
    assert a.request("PUT", "/exchanges/front", {"type": "direct"})[0] == 201
    assert a.request("PUT", "/exchanges/back", {"type": "fanout"})[0] == 201
    assert a.request("POST", "/bindings", {"exchange": "front", "to_exchange": "back", "routing_key": "k"})[0] == 201
    _declare_on(c, "q1", a, b)
    _declare_on(c, "q2", b)
    for q in ("q1", "q2"):
        assert a.request("POST", "/bindings", {"exchange": "back", "queue": q})[0] == 201
    wait_caught_up(c, a)  # the bindings seen on c
    events = channel_publish(c, [{"exchange": "front", "routing_key": "k", "body": f"e{i}"} for i in range(3)]
                              + [{"exchange": "front", "routing_key": "other", "body": "nowhere"}])
    assert all(e["ev"] == "ack" for e in events)
    assert _bodies(b, "q1") == ["e0", "e1", "e2"]
    # a streaming consume through a node that does not own the queue
    conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=20)
    try:
        conn.request("GET", "/queues/q2/stream?prefetch=10")
        answer = conn.getresponse()
        assert answer.status == 200
        lines = [json.loads(answer.readline()) for _ in range(3)]
        bodies = [line.get("body") or line.get("message", {}).get("body") for line in lines]
        assert bodies == ["e0", "e1", "e2"], lines
    finally:
        conn.close()


def test_a_channel_purges_a_queue_another_node_owns(nodes: Nodes) -> None:
    a, b, c = _three(nodes)
    _declare_on(c, "full", a, b)
    assert all(e["ev"] == "ack" for e in channel_publish(c, [{"routing_key": "full", "body": f"m{i}"} for i in range(4)]))
    replies = _channel_ops(b, [{"op": "purge_queue", "queue": "full"}])
    assert replies[0]["ev"] == "ok" and replies[0]["messages"] == 4, replies
    assert a.request("GET", "/queues/full")[1]["messages_ready"] == 0


def test_a_channel_get_of_a_queue_another_node_owns_is_settled_there(nodes: Nodes) -> None:
    a, b, _c = _three(nodes)
    _declare_on(b, "gq", a)
    assert all(e["ev"] == "ack" for e in channel_publish(b, [{"routing_key": "gq", "body": f"g{i}"} for i in range(3)]))
    ch = RawChannel(b.port)
    try:
        ch.send({"op": "get", "queue": "gq", "id": 1})
        got = ch.next_event()
        assert got["ev"] == "get_ok" and got["id"] == 1 and got["message"]["body"] == "g0", got
        assert got["message_count"] == 2
        wait_for("unacked on the owner", lambda: a.request("GET", "/queues/gq")[1]["messages_unacked"] == 1)
        ch.send({"op": "ack", "delivery_tag": got["delivery_tag"]}, {"op": "get", "queue": "gq", "id": 2})
        second = ch.next_event()
        assert second["ev"] == "get_ok" and second["message"]["body"] == "g1", second
        assert second["delivery_tag"] != got["delivery_tag"]
        wait_for("the ack reached the owner", lambda: (
            a.request("GET", "/queues/gq")[1]["messages_ready"], a.request("GET", "/queues/gq")[1]["messages_unacked"]
        ) == (1, 1))
    finally:
        ch.close()
    # the unsettled get goes back to the owner's queue with the channel
    wait_for("g1 requeued", lambda: a.request("GET", "/queues/gq")[1]["messages_ready"] == 2)
    assert _bodies(a, "gq") == ["g1", "g2"]


def test_a_hung_owner_does_not_hold_confirms_for_ever(nodes: Nodes) -> None:
    import os
    import signal
    import time

    a, b, c = _three(nodes)
    assert a.request("PUT", "/exchanges/both", {"type": "fanout"})[0] == 201
    _declare_on(c, "qa", a)
    _declare_on(c, "qb", b, a)
    for q in ("qa", "qb"):
        assert a.request("POST", "/bindings", {"exchange": "both", "queue": q})[0] == 201
    assert all(e["ev"] == "ack" for e in channel_publish(a, [{"exchange": "both", "body": "warm"}]))
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGSTOP)  # hung: its connections stay open, it answers nothing
    try:
        started = time.monotonic()
        events = channel_publish(a, [{"exchange": "both", "body": "stuck"}])
        waited = time.monotonic() - started
        assert events[-1]["ev"] == "nack" and events[-1]["reason"].startswith("queue_unavailable"), events
        assert waited < TTL_S + 10, waited
        # a publish to this node's own queue is not held behind it
        assert channel_publish(a, [{"routing_key": "qa", "body": "fine"}])[-1]["ev"] == "ack"
        assert [m["body"] for m in a.drain("qa")] == ["warm", "stuck", "fine"]
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)


def test_a_rest_call_relayed_to_a_hung_owner_answers_503(nodes: Nodes) -> None:
    """A REST call relayed to an owner that hangs (its connections open, nothing
    answered) gets 503 ``queue_unavailable`` once the owner has had its time to
    answer, not a wait as long as the client's."""
    import os
    import signal
    import time

    a, b, _ = _three(nodes)
    _declare_on(a, "hung-q", b)
    assert a.request("GET", "/queues/hung-q")[0] == 200  # relayed while b answers
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        status, body = a.request("GET", "/queues/hung-q", timeout_s=TTL_S + 20)
        waited = time.monotonic() - started
        assert status == 503 and body["error"] == "queue_unavailable", (status, body)
        assert waited < TTL_S + 10, waited
        # a long poll is given its own wait on top
        started = time.monotonic()
        status, body = a.request("POST", "/queues/hung-q/get?wait=1", timeout_s=TTL_S + 20)
        assert status == 503 and body["error"] == "queue_unavailable", (status, body)
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    wait_for("the owner answers again", lambda: a.request("GET", "/queues/hung-q")[0] == 200)


def test_a_get_over_queues_on_several_nodes(nodes: Nodes) -> None:
    """``POST /get`` (the kombu transport's long poll) over queues on several nodes."""
    import threading

    a, b, c = _three(nodes)
    for name, owner in (("g-a", a), ("g-b", b), ("g-c", c)):
        _declare_on(a, name, owner, c)
    assert all(e["ev"] == "ack" for e in channel_publish(a, [{"routing_key": "g-c", "body": "from-c"}]))
    status, got = a.request("POST", "/get", {"queues": ["g-a", "g-b", "g-c"], "lease": 60})
    assert status == 200 and [m["body"] for m in got["messages"]] == ["from-c"] and got["queue"] == "g-c", got
    # preference across nodes: g-b (listed first) before g-a
    channel_publish(a, [{"routing_key": "g-a", "body": "from-a"}, {"routing_key": "g-b", "body": "from-b"}])
    status, got = c.request("POST", "/get", {"queues": ["g-b", "g-a"], "lease": 60})
    assert status == 200 and [m["body"] for m in got["messages"]] == ["from-b"], got
    # a long poll over several nodes' queues answers when one of them gets a message
    result: dict[str, object] = {}

    def poll() -> None:
        result["answer"] = c.request("POST", "/get", {"queues": ["g-c", "g-b"], "wait": 10, "lease": 60})

    thread = threading.Thread(target=poll)
    thread.start()
    channel_publish(a, [{"routing_key": "g-b", "body": "late"}])
    thread.join(timeout=20)
    status, got = result["answer"]  # type: ignore[misc]
    assert status == 200 and [m["body"] for m in got["messages"]] == ["late"], got
    assert a.request("POST", "/get", {"queues": ["g-a", "nowhere"]})[0] == 404

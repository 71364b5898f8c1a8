"""Nodes cut off from etcd without a sign (no error, no close: every packet dropped),
as a partition cuts them in the fault test: here each node reaches etcd through a
proxy of its own that the test silences (``silent_proxy.py``), on loopback.

- A quorum queue's leader cut off from etcd (and so from the cluster's word) steps
  down when its lease is counted lost; its view still names it leader, but it answers
  for the queue as a node that knows no leader (``503 queue_unavailable``, retryable),
  not ``404 no_route`` nor an ack of a publish routed nowhere, so that clients move to
  a node that can serve it, and the client library does (a REST call's ``503``, a
  channel's ``queue_unavailable`` nacks).
- A node whose watch is on an etcd endpoint that went silent follows the cluster's
  changes anyway, through its other endpoint.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import client
from tests.cluster.conftest import TTL_S, node_process, wait_for, wait_synced
from tests.cluster.silent_proxy import SilentProxy, silent_proxies
from tests.support.broker import BrokerProcess, stop_all
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.slow

QUORUM = {"durable": True, "arguments": {"x-queue-type": "quorum"}}
NAMES = ("a", "b", "c")


def replication(node: BrokerProcess, queue: str) -> dict[str, Any]:
    status, body = node.request("GET", "/cluster", timeout_s=5)
    assert status == 200, body
    return dict(body["replicated_queues"].get(queue) or {})


def agreed_leader(nodes: dict[str, BrokerProcess], queue: str, asked: list[str]) -> str | None:
    """The leader every node of ``asked`` names, once it says it leads."""
    names = {replication(nodes[n], queue).get("leader") for n in asked}
    if len(names) != 1:
        return None
    (only,) = names
    if only in nodes and replication(nodes[only], queue).get("local", {}).get("role") == "leader":
        return str(only)
    return None


def answer(node: BrokerProcess, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, headers) of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=15)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else {}, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


async def client_moves_on(cut_url: str, other_url: str) -> int:
    """REST and a channel, each first on the cut-off node, end up served by the other;
    returns how many publishes the cut-off node refused before the channel moved."""
    async with client.connect([cut_url, other_url]) as conn:
        with pytest.raises(client.BrokerRequestError) as refused:
            await conn.queue_info("q")
        assert refused.value.status == 503 and refused.value.code == "queue_unavailable"
        assert (await conn.queue_info("q")).name == "q"  # the next call went to the other node
    refusals = 0
    async with client.connect([cut_url, other_url]) as conn, conn.channel() as ch:
        props = client.Properties(message_id="via-client")
        with trio.fail_after(30):
            while True:
                try:
                    await ch.publish("", "q", b"via-client", properties=props, timeout_s=5)
                    return refusals
                except client.PublishNacked as exc:
                    assert exc.reason.startswith("queue_unavailable"), exc.reason
                    refusals += 1
                except (client.ConfirmTimeout, client.ConnectionLost):
                    pass
                await trio.sleep(0.1)


@pytest.fixture
def proxied(tmp_path: Path, etcd: EtcdProcess) -> Iterator[tuple[dict[str, BrokerProcess], dict[str, SilentProxy]]]:
    """Three nodes, each reaching etcd only through a proxy of its own."""
    etcd_port = int(etcd.url.rsplit(":", 1)[1])
    started: list[BrokerProcess] = []
    with silent_proxies(etcd_port, len(NAMES)) as proxies:
        by_name = dict(zip(NAMES, proxies, strict=True))
        try:
            nodes = {}
            for name in NAMES:
                proc = node_process(tmp_path, etcd, name, extra=("--etcd", f"http://127.0.0.1:{by_name[name].port}"))
                started.append(proc)
                proc.start()
                wait_synced(proc)
                nodes[name] = proc
            yield nodes, by_name
        finally:
            stop_all(started)


def test_a_leader_cut_off_from_etcd_answers_queue_unavailable_not_no_route(
    proxied: tuple[dict[str, BrokerProcess], dict[str, SilentProxy]],
) -> None:
    nodes, proxies = proxied
    status, body = nodes["a"].request("PUT", "/queues/q", QUORUM)
    assert status == 201, body
    old = wait_for("a leader", lambda: agreed_leader(nodes, "q", list(NAMES)), timeout_s=TTL_S * 4 + 10)
    status, body = nodes[old].request("POST", "/exchanges/amq.default/publish?routing_key=q", b"before", timeout_s=15)
    assert status == 200 and body["confirm"] == "ack", body

    proxies[old].silent = True  # cut off from etcd: its view stops where it is
    others = [n for n in NAMES if n != old]
    new = wait_for(
        "a new leader elected by the others",
        lambda: (leader := agreed_leader(nodes, "q", others)) != old and leader,
        timeout_s=TTL_S * 4 + 10,
    )
    cut = nodes[old]
    # its view still holds the leader key it wrote (it cannot see it go), but it does
    # not lead: it knows no leader
    wait_for("the cut-off node no longer naming itself leader", lambda: replication(cut, "q").get("leader") is None)
    for mandatory in ("true", "false"):
        status, body, _headers = answer(
            cut, "POST", f"/exchanges/amq.default/publish?routing_key=q&mandatory={mandatory}", b"to the cut-off node"
        )
        assert status == 503, (mandatory, status, body)  # not 404 no_route, nor 200 routed 0
        assert body["reason"].startswith("queue_unavailable"), body
    status, body, headers = answer(cut, "POST", "/queues/q/get?max=1")
    assert status == 503 and body["error"] == "queue_unavailable", body
    assert "retry-after" in headers
    # the new leader serves the queue meanwhile
    status, body = nodes[new].request("POST", "/exchanges/amq.default/publish?routing_key=q", b"after", timeout_s=15)
    assert status == 200 and body["confirm"] == "ack", body
    # and the client library, given the cut-off node first, moves on from it
    assert trio.run(client_moves_on, cut.url, nodes[new].url) >= 1

    proxies[old].silent = False  # healed: it learns the new leader and serves through it
    wait_for("the healed node naming the new leader", lambda: replication(cut, "q").get("leader") == new, timeout_s=30)
    status, body = cut.request("POST", "/exchanges/amq.default/publish?routing_key=q", b"healed", timeout_s=15)
    assert status == 200 and body["confirm"] == "ack", body
    got = sorted(m["body"] for m in nodes[new].drain("q"))
    assert got == ["after", "before", "healed", "via-client"], got


def test_a_node_whose_watched_etcd_endpoint_goes_silent_follows_changes_through_another(
    tmp_path: Path, etcd: EtcdProcess,
) -> None:
    etcd_port = int(etcd.url.rsplit(":", 1)[1])
    with silent_proxies(etcd_port, 1) as (proxy,):
        # its calls and its watch start at the proxy (listed first)
        watcher = node_process(tmp_path, etcd, "w", extra=("--etcd", f"http://127.0.0.1:{proxy.port},{etcd.url}"))
        other = node_process(tmp_path, etcd, "o")
        try:
            for node in (watcher, other):
                node.start()
                wait_synced(node)
            status, body = other.request("PUT", "/exchanges/before", {"type": "fanout"})
            assert status == 201, body
            wait_for("the watcher seeing a change", lambda: watcher.request("GET", "/exchanges/before")[0] == 200)
            proxy.silent = True
            status, body = other.request("PUT", "/exchanges/after", {"type": "fanout"})
            assert status == 201, body
            # its next lease renewal through the proxy gets no answer, and its calls and
            # watch move to the other endpoint (else: a stale view until the cut heals)
            wait_for("the watcher seeing a change made after the cut",
                     lambda: watcher.request("GET", "/exchanges/after")[0] == 200, timeout_s=TTL_S * 3 + 5)
            # its lease was renewed through the other endpoint in time: never counted lost
            # (which would have made it register again)
            assert watcher.log_path.read_text().count("joined the cluster") == 1
        finally:
            watcher.stop()
            other.stop()

"""Several real broker processes on one real etcd: membership and its lapse, a taken
name, metadata declared on one node and seen on another, racing declares, a change
made while a node was down, and etcd stopping and coming back."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import TTL_S, cluster_nodes, node_process, wait_for
from tests.support.broker import ROOT, BrokerProcess
from tests.support.etcd import EtcdProcess
from tests.support.rawchannel import RawChannel
from tests.support.security import basic_headers

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]


def test_members_are_listed_and_a_lapsed_one_is_shown_dead(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("both alive on a", lambda: {n: v["alive"] for n, v in cluster_nodes(a).items()} == {"a": True, "b": True})
    status, body = b.request("GET", "/cluster")
    assert body["enabled"] is True and body["node"] == "b" and body["etcd"]["ok"] is True
    assert body["etcd"]["endpoints"][0]["healthy"] is True and body["revision"] > 0
    table = _cli(a, "cluster")
    assert "node-" not in table and "a *" in table and "alive" in table and "healthy" in table
    b.kill()  # no goodbye: its lease lapses in etcd
    seen_dead = wait_for("b dead on a", lambda: not cluster_nodes(a)["b"]["alive"], timeout_s=TTL_S + 5)
    assert seen_dead
    assert cluster_nodes(a)["b"]["url"] == b.url  # still listed, as dead
    assert "DEAD" in _cli(a, "cluster")
    b.start()
    wait_for("b alive again", lambda: cluster_nodes(a)["b"]["alive"])


def _cli(node: BrokerProcess, *words: str) -> str:
    """``ackbus --url NODE WORDS...``'s output (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-m", "client", "--url", node.url, *words],
        capture_output=True, text=True, timeout=30, cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_second_process_with_a_taken_name_refuses_to_start(tmp_path: Path, etcd: EtcdProcess, nodes: Nodes) -> None:
    nodes("a")
    (tmp_path / "twin").mkdir()
    twin = node_process(tmp_path / "twin", etcd, "a")
    try:
        with pytest.raises(RuntimeError, match="exited with 1"):
            twin.start()
        assert "node name 'a' is already in use" in twin.log_tail()
    finally:
        twin.stop()


def test_a_single_node_says_cluster_mode_is_off(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "single") as single:
        status, body = single.request("GET", "/cluster")
        assert status == 200 and body["enabled"] is False and "--etcd" in body["reason"]
        assert "cluster" not in single.request("GET", "/healthz")[1]
        assert "not clustered" in _cli(single, "cluster")


def test_metadata_declared_on_one_node_is_applied_on_the_others(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("b alive on a", lambda: cluster_nodes(a).get("b", {}).get("alive"))
    assert a.request("PUT", "/exchanges/x", {"type": "fanout"})[0] == 201
    status, q1 = a.request("PUT", "/queues/q1", {"arguments": {"x-queue-leader-locator": "client-local"}})
    assert status == 201 and q1["owner"] == "a"
    # balanced: the live node owning the fewest queues
    status, q2 = a.request("PUT", "/queues/q2", {})
    assert status == 201 and q2["owner"] == "b"
    assert a.request("POST", "/bindings", {"exchange": "x", "queue": "q1"})[0] == 201
    assert a.request("POST", "/bindings", {"exchange": "x", "queue": "q2"})[0] == 201
    # read-your-writes on a; the others by their watch
    assert a.request("GET", "/queues/q1")[0] == 200
    wait_for("x on b", lambda: b.request("GET", "/exchanges/x")[0] == 200)
    wait_for("q2 on its owner b", lambda: b.request("GET", "/queues/q2")[0] == 200)
    assert a.request("GET", "/queues/q2")[0] == 200  # relayed to its owner b
    wait_for("x->q2 bound on b", lambda: any(bd["queue"] == "q2" for bd in b.request("GET", "/bindings")[1]["bindings"]))
    owned = cluster_nodes(b)
    assert owned["a"]["queues"] == ["q1"] and owned["b"]["queues"] == ["q2"]
    # the same declare on another node is not a conflict
    assert b.request("PUT", "/exchanges/x", {"type": "fanout"})[0] == 200
    assert b.request("PUT", "/queues/q1", {})[0] == 200
    # deleting on b removes it from its owner a
    assert b.request("DELETE", "/queues/q1")[0] == 200
    wait_for("q1 gone from a", lambda: a.request("GET", "/queues/q1")[0] == 404)


def test_rabbitmqs_classic_placement_argument_places_a_queue_when_the_quorum_one_is_absent(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("b alive on a", lambda: cluster_nodes(a).get("b", {}).get("alive"))
    # client-local: here, though b owns fewer queues
    status, q1 = a.request("PUT", "/queues/q1", {"arguments": {"x-queue-master-locator": "client-local"}})
    assert status == 201 and q1["owner"] == "a"
    status, q2 = a.request("PUT", "/queues/q2", {"arguments": {"x-queue-master-locator": "client-local"}})
    assert status == 201 and q2["owner"] == "a"
    # min-masters spreads queues out (balanced): b owns none
    status, q3 = a.request("PUT", "/queues/q3", {"arguments": {"x-queue-master-locator": "min-masters"}})
    assert status == 201 and q3["owner"] == "b"
    # the quorum name wins over the classic one
    status, q4 = a.request("PUT", "/queues/q4", {"arguments": {"x-queue-leader-locator": "client-local",
                                                               "x-queue-master-locator": "random"}})
    assert status == 201 and q4["owner"] == "a"
    status, body = a.request("PUT", "/queues/q5", {"arguments": {"x-queue-master-locator": "balanced"}})
    assert status == 400 and "x-queue-master-locator" in body["message"]
    # a placement, not a setting: not compared when the queue is declared again
    assert b.request("PUT", "/queues/q1", {})[0] == 200


def test_racing_declares_one_wins_and_the_other_fails_the_same_everywhere(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    for round_ in range(3):
        name = f"race{round_}"
        results: dict[str, tuple[int, Any]] = {}
        barrier = threading.Barrier(2)

        def declare(node: BrokerProcess, ttl: int) -> None:
            barrier.wait(timeout=10)
            results[node.url] = node.request("PUT", f"/queues/{name}", {"arguments": {"x-message-ttl": ttl}})

        threads = [threading.Thread(target=declare, args=(a, 1000)), threading.Thread(target=declare, args=(b, 2000))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        statuses = sorted(status for status, _ in results.values())
        assert statuses == [201, 409], results
        loser_ttl = 1000 if results[b.url][0] == 201 else 2000
        refusals = [
            node.request("PUT", f"/queues/{name}", {"arguments": {"x-message-ttl": loser_ttl}}) for node in (a, b)
        ]
        the_409 = next(body for status, body in results.values() if status == 409)
        for status, body in refusals:
            assert status == 409 and body == the_409, (body, the_409)
        assert body["error"] == "precondition_failed"


def test_a_change_made_while_a_node_was_down_is_applied_when_it_returns(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    assert b.request("PUT", "/queues/on-b", {"arguments": {"x-queue-leader-locator": "client-local"}})[0] == 201
    assert a.request("PUT", "/exchanges/old", {})[0] == 201
    wait_for("old on b", lambda: b.request("GET", "/exchanges/old")[0] == 200)
    assert b.terminate() == 0
    assert a.request("PUT", "/exchanges/new", {"type": "topic"})[0] == 201
    assert a.request("DELETE", "/exchanges/old")[0] == 200
    assert a.request("DELETE", "/queues/on-b")[0] == 200
    b.start()
    wait_for("new on b", lambda: b.request("GET", "/exchanges/new")[0] == 200)
    assert b.request("GET", "/exchanges/old")[0] == 404
    assert b.request("GET", "/queues/on-b")[0] == 404


def test_etcd_stopping_refuses_metadata_changes_and_recovery_is_automatic(etcd: EtcdProcess, nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    assert a.request("PUT", "/queues/kept", {"arguments": {"x-queue-leader-locator": "client-local"}})[0] == 201
    etcd.stop()
    health = wait_for(
        "etcd reported down on a",
        lambda: (lambda body: body if body["cluster"]["etcd"] == "unavailable" else None)(a.request("GET", "/healthz")[1]),
    )
    assert health["status"] == "ok" and "etcd_error" in health["cluster"]
    status, body = a.request("PUT", "/queues/refused", {})
    assert status == 503 and body["error"] == "etcd_unavailable", body
    assert a.request("GET", "/queues/kept")[0] == 200  # still serving
    assert a.request("GET", "/cluster")[1]["etcd"]["ok"] is False
    # a channel's declare is refused the same way; a publish to a queue it owns goes on
    ch = RawChannel(a.port)
    try:
        ch.send({"op": "publish", "routing_key": "kept", "body": "m"}, {"op": "declare_queue", "queue": "refused", "id": 1})
        events = [ch.next_event(), ch.next_event()]
        assert events[0]["ev"] == "ack", events
        assert events[1]["ev"] == "error" and events[1]["error"] == "etcd_unavailable", events
    finally:
        ch.close()
    status, lock = b.request("POST", "/locks/l/acquire", {"owner": "x"})
    assert status == 503 and lock["error"] == "etcd_unavailable", lock
    etcd.start()
    wait_for("a recovers", lambda: a.request("GET", "/healthz")[1]["cluster"]["etcd"] == "ok")
    wait_for("a accepts changes", lambda: a.request("PUT", "/queues/after", {})[0] in (200, 201))
    wait_for("b sees it", lambda: "after" in sum((n["queues"] for n in cluster_nodes(b).values()), []))




def test_users_permissions_and_tokens_apply_on_every_node(nodes: Nodes) -> None:
    a, b = nodes("a"), nodes("b")
    wait_for("b alive on a", lambda: cluster_nodes(a).get("b", {}).get("alive"))
    status, body = a.request("PUT", "/users/admin", {"password": "s3cret-pass", "tags": ["administrator"]})
    assert status == 201, body
    admin = basic_headers("admin", "s3cret-pass")
    # b now has a user too: it asks for credentials, and takes a's
    wait_for("b asks for credentials", lambda: b.request("GET", "/queues")[0] == 401)
    status, body = b.request("GET", "/whoami", headers=admin)
    assert status == 200 and body["authenticated"] is True and body["name"] == "admin"
    # a user with narrow permissions, made on b, is held to them on a
    status, _ = b.request(
        "PUT", "/users/app", {"password": "app-pass-1", "permissions": {"configure": "^app\\.", "write": ".*", "read": ".*"}},
        headers=admin,
    )
    assert status == 201
    app = basic_headers("app", "app-pass-1")
    wait_for("app on a", lambda: a.request("GET", "/whoami", headers=app)[0] == 200)
    assert a.request("PUT", "/queues/app.jobs", {}, headers=app)[0] == 201
    assert a.request("PUT", "/queues/other", {}, headers=app)[0] == 403
    # a token made on b works on a, and its revocation on a reaches b
    status, token = b.request("POST", "/users/app/tokens", {"description": "ci"}, headers=app)
    assert status == 201, token
    bearer = {"Authorization": f"Bearer {token['token']}"}
    wait_for("token on a", lambda: a.request("GET", "/whoami", headers=bearer)[0] == 200)
    # a long poll on b with the token ends when a revokes it (enforced on every node)
    assert b.request("PUT", "/queues/app.b", {"arguments": {"x-queue-leader-locator": "client-local"}}, headers=app)[0] == 201
    polled: list[tuple[int, Any]] = []
    poller = threading.Thread(target=lambda: polled.append(b.request("POST", "/queues/app.b/get?wait=20", headers=bearer)))
    started = time.monotonic()
    poller.start()
    time.sleep(0.3)  # not a bet: a poll that starts after the revocation is refused the same way
    assert a.request("DELETE", f"/tokens/{token['id']}", headers=app)[0] == 200
    poller.join(timeout=30)
    assert polled and polled[0][0] == 401 and polled[0][1]["error"] in ("credentials_revoked", "unauthorized"), polled
    assert time.monotonic() - started < 15
    wait_for("token revoked on b", lambda: b.request("GET", "/whoami", headers=bearer)[0] == 401)
    assert a.request("DELETE", "/users/app", headers=admin)[0] == 200
    wait_for("app gone on b", lambda: b.request("GET", "/whoami", headers=app)[0] == 401)


def test_a_node_whose_lease_lapsed_and_whose_name_was_taken_stops_serving(
    tmp_path: Path, etcd: EtcdProcess, nodes: Nodes
) -> None:
    a = nodes("a")
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)  # hung: no keepalives
    (tmp_path / "twin").mkdir()
    twin = node_process(tmp_path / "twin", etcd, "a")
    try:
        deadline = time.monotonic() + TTL_S + 10
        while True:  # the name frees itself once a's lease lapses in etcd
            try:
                twin.start(timeout_s=30)
                break
            except RuntimeError:
                assert time.monotonic() < deadline, twin.log_tail()
                time.sleep(0.2)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    try:
        assert a.proc.wait(timeout=TTL_S + 15) == 1  # it must not serve under a name another holds
        assert "already in use" in a.log_tail()
        assert cluster_nodes(twin)["a"]["url"] == twin.url
    finally:
        twin.stop()

"""Permissions are the same on every node, and nodes authenticate to one another
with the cluster secret: forwarding and relaying work for an authorized user, are
refused for others the same way on every node, and a node with the wrong secret (or
none) cannot forward (real etcd, real broker subprocesses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import (
    cluster_nodes,
    node_process,
    queues_owned_by,
    wait_for,
    wait_synced,
)
from tests.support.broker import BrokerProcess, stop_all
from tests.support.etcd import EtcdProcess
from tests.support.security import basic_headers

pytestmark = pytest.mark.slow




ADMIN = basic_headers("admin", "admin-pw")
ALICE = basic_headers("alice", "alice-pw")


@pytest.fixture
def secured(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[BrokerProcess]]:
    procs = [
        node_process(tmp_path, etcd, "a", extra=("--cluster-secret", "s3cret")),
        node_process(tmp_path, etcd, "b", extra=("--cluster-secret", "s3cret")),
        node_process(tmp_path, etcd, "w", extra=("--cluster-secret", "wrong")),
    ]
    try:
        for p in procs:
            p.start()
            wait_synced(p)  # its view read from etcd: before, it knows no queue or user of the others
        yield procs
    finally:
        stop_all(procs)



def test_permissions_and_the_cluster_secret(secured: list[BrokerProcess]) -> None:
    a, b, w = secured
    wait_for("three alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 3)
    assert a.request("PUT", "/users/admin", {"password": "admin-pw", "tags": ["administrator"],
                                             "permissions": {"configure": ".*", "write": ".*", "read": ".*"}})[0] == 201
    assert a.request("PUT", "/users/alice", {"password": "alice-pw", "permissions": {
        "configure": "^$", "write": "^(amq\\.default|jobs)$", "read": "^jobs$"}}, headers=ADMIN)[0] == 201
    for q in ("jobs", "secret"):
        status, _ = a.request("PUT", f"/queues/{q}", {"arguments": {"x-queue-leader-locator": "client-local"}}, headers=ADMIN)
        assert status == 201
    wait_for("users on b", lambda: b.request("GET", "/whoami", headers=ALICE)[0] == 200)
    wait_for("users on w", lambda: w.request("GET", "/whoami", headers=ALICE)[0] == 200)
    # (the users came before the queues: a watch may have applied them and not yet the queues)
    wait_for("the queues on b and w", lambda: all(queues_owned_by(node, "a", ADMIN) >= {"jobs", "secret"} for node in (b, w)))
    # alice publishes through b to a queue owned by a: b forwards it with the secret
    status, answer = b.request("POST", "/exchanges/amq.default/publish?routing_key=jobs", b"j1", headers=ALICE)
    assert status == 200 and answer["confirm"] == "ack", answer
    status, got = b.request("POST", "/queues/jobs/get?lease=60", headers=ALICE)
    assert status == 200 and [m["body"] for m in got["messages"]] == ["j1"], got
    # refused the same on a node that relays as on the owner
    for node in (a, b):
        status, err = node.request("POST", "/queues/secret/get", headers=ALICE)
        assert status == 403 and err["error"] == "access_refused", err
        assert node.request("POST", "/queues/jobs/get", headers={})[0] == 401
    # a node with the wrong secret cannot forward: its publish is nacked, not taken
    status, answer = w.request("POST", "/exchanges/amq.default/publish?routing_key=jobs", b"j2", headers=ALICE)
    assert status == 503 and answer["reason"].startswith("queue_unavailable"), answer
    status, got = a.request("POST", "/queues/jobs/get?max=10", headers=ADMIN)
    assert status == 200 and got["messages"] == [], got  # j1 is leased; j2 never arrived


def test_only_nodes_may_call_the_replica_endpoints(secured: list[BrokerProcess]) -> None:
    """The endpoints followers fetch a quorum queue's log from hand out every message
    without a permission check: a user, even an administrator, is refused (403); a
    request with the cluster secret passes (and meets the endpoint's own answer)."""
    a, _b, _w = secured
    wait_for("a alive", lambda: cluster_nodes(a)["a"]["alive"])
    assert a.request("PUT", "/users/admin", {"password": "admin-pw", "tags": ["administrator"],
                                             "permissions": {"configure": ".*", "write": ".*", "read": ".*"}})[0] == 201
    fetch = {"node": "x", "epoch": 1, "offset": 1, "wait_s": 0}
    for path, body in (("/cluster/replicas/q/fetch", fetch), ("/cluster/replicas/q/epoch-end", {"epoch": 0, "leader_epoch": 1})):
        status, err = a.request("POST", path, body, headers=ADMIN)
        assert status == 403 and err["error"] == "node_only", err
        assert a.request("POST", path, body, headers={})[0] == 401
        assert a.request("POST", path, body, headers={"X-Ackbus-Cluster-Secret": "wrong"})[0] == 401
        status, err = a.request("POST", path, body, headers={"X-Ackbus-Cluster-Secret": "s3cret"})
        assert status == 409 and err["error"] == "stale_epoch", err  # a node: let in, and a leads no q

"""The validated user id in a cluster (docs/security.md, "Validated user id"): a user
publishing through node b to a queue node a owns is checked at b, the entry node,
against the user's own name; b forwards what it took over its forwarding channel
(the cluster secret), which a does not check again against b's identity (real etcd,
real broker subprocesses)."""

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
from tests.support.rawchannel import RawChannel
from tests.support.security import basic_headers

pytestmark = pytest.mark.slow




ADMIN = basic_headers("admin", "admin-pw")
ALICE = basic_headers("alice", "alice-pw")
FORGED = "user_id property set to 'admin' but authenticated user was 'alice'"


@pytest.fixture
def pair(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[BrokerProcess]]:
    procs = [node_process(tmp_path, etcd, name, extra=("--cluster-secret", "s3cret")) for name in ("a", "b")]
    try:
        for p in procs:
            p.start()
            wait_synced(p)
        yield procs
    finally:
        stop_all(procs)



def test_a_user_id_is_checked_at_the_entry_node_only(pair: list[BrokerProcess]) -> None:
    a, b = pair
    wait_for("two alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 2)
    every = {"configure": ".*", "write": ".*", "read": ".*"}
    assert a.request("PUT", "/users/admin", {"password": "admin-pw", "tags": ["administrator"],
                                             "permissions": every})[0] == 201
    assert a.request("PUT", "/users/alice", {"password": "alice-pw", "permissions": every}, headers=ADMIN)[0] == 201
    status, _ = a.request("PUT", "/queues/jobs", {"arguments": {"x-queue-leader-locator": "client-local"}}, headers=ADMIN)
    assert status == 201
    wait_for("users on b", lambda: b.request("GET", "/whoami", headers=ALICE)[0] == 200)
    wait_for("the queue on b", lambda: "jobs" in queues_owned_by(b, "a", ADMIN))
    target = "/exchanges/amq.default/publish?routing_key=jobs"
    # REST through b: her own name forwarded to a and taken there; a forged one refused at b
    status, answer = b.request("POST", target, b"own", headers={**ALICE, "X-User-Id": "alice"})
    assert status == 200 and answer == {"confirm": "ack", "routed": 1}, answer
    status, answer = b.request("POST", target, b"forged", headers={**ALICE, "X-User-Id": "admin"})
    assert status == 400 and (answer["error"], answer["message"]) == ("invalid_argument", FORGED), answer
    # a channel on b: the same
    ch = RawChannel(b.port, headers=ALICE)
    try:
        ch.send({"op": "publish", "routing_key": "jobs", "body": "own-ch", "properties": {"user_id": "alice"}})
        assert ch.next_event()["ev"] == "ack"
        ch.send({"op": "publish", "routing_key": "jobs", "body": "forged-ch", "properties": {"user_id": "admin"}})
        error = ch.next_event()
        assert (error["ev"], error["error"], error["message"]) == ("error", "invalid_argument", FORGED), error
    finally:
        ch.close()
    status, got = a.request("POST", "/queues/jobs/get?max=10", headers=ADMIN)
    assert status == 200, got
    assert [(m["body"], m["properties"]["user_id"]) for m in got["messages"]] == [
        ("own", "alice"), ("own-ch", "alice"),
    ], got

"""A user's permission revoked, or the user deleted, on any node reaches its consumers
relayed from another node's queue as it reaches local ones (docs/security.md,
"Revocation"; docs/cluster.md): an AMQP consumer gets ``basic.cancel`` (the client
asked for it), an HTTP channel's consumer a ``cancel`` event, and the owner requeues
what it had delivered unacked; a deleted user's connection and channel end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import wait_for
from tests.cluster.test_cluster_amqp import AMQPNode, amqp_nodes, pump_until
from tests.support.broker import BrokerProcess
from tests.support.etcd import EtcdProcess
from tests.support.rawchannel import RawChannel
from tests.support.security import basic_headers

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.slow

ALL = {"configure": ".*", "write": ".*", "read": ".*"}




ADMIN = basic_headers("admin", "admin-pw")
ALICE = basic_headers("alice", "alice-pw")


@pytest.fixture
def secured(tmp_path: Path, etcd: EtcdProcess) -> Iterator[tuple[AMQPNode, AMQPNode]]:
    with amqp_nodes(tmp_path, etcd, extra=("--cluster-secret", "s3cret")) as nodes:
        yield nodes


def _setup(a: BrokerProcess, b: BrokerProcess, messages: int) -> None:
    """admin and alice (all permissions), queue ``jobs`` on a with ``messages``."""
    assert a.request("PUT", "/users/admin", {"password": "admin-pw", "tags": ["administrator"], "permissions": ALL})[0] == 201
    assert a.request("PUT", "/users/alice", {"password": "alice-pw", "permissions": ALL}, headers=ADMIN)[0] == 201
    status, _ = a.request("PUT", "/queues/jobs", {"durable": True, "arguments": {"x-queue-leader-locator": "client-local"}}, headers=ADMIN)
    assert status == 201
    for i in range(messages):
        status, answer = a.request("POST", "/exchanges/amq.default/publish?routing_key=jobs", f"j{i}".encode(), headers=ADMIN)
        assert status == 200 and answer["confirm"] == "ack", answer
    wait_for("alice known on b", lambda: b.request("GET", "/whoami", headers=ALICE)[0] == 200)
    wait_for("b knows jobs", lambda: b.request("GET", "/queues/jobs", headers=ADMIN)[0] == 200)


def _reads_on(node: BrokerProcess) -> str | None:
    """alice's read permission as ``node`` knows it."""
    status, body = node.request("GET", "/users/alice", headers=ADMIN)
    return body.get("permissions", {}).get("read") if status == 200 else None


def _counts(a: BrokerProcess) -> tuple[int, int]:
    status, body = a.request("GET", "/queues/jobs", headers=ADMIN)
    assert status == 200, body
    return body["messages_ready"], body["messages_unacked"]


def test_a_relayed_amqp_consumer_is_cancelled_when_read_is_revoked_or_its_user_deleted(
    secured: tuple[AMQPNode, AMQPNode],
) -> None:
    a, b = secured
    _setup(a.proc, b.proc, 3)
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", b.amqp_port, credentials=pika.PlainCredentials("alice", "alice-pw"), heartbeat=30))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=2)
        cancelled: list[Any] = []
        got: list[Any] = []
        ch.add_on_cancel_callback(cancelled.append)
        tag = ch.basic_consume("jobs", lambda _ch, m, _p, _b: got.append(m))
        pump_until(conn, "2 delivered", lambda: len(got) == 2)
        assert _counts(a.proc) == (1, 2)
        # read revoked on a (not b, where the consumer is): b cancels it
        status, _ = a.proc.request("PUT", "/users/alice/permissions", {"configure": ".*", "write": ".*", "read": "^$"}, headers=ADMIN)
        assert status in (200, 204)
        pump_until(conn, "basic.cancel from the server", lambda: cancelled)
        assert cancelled[0].method.consumer_tag == tag and ch.is_open
        wait_for("the owner requeued its deliveries", lambda: _counts(a.proc) == (3, 0))
        # a consume now is refused on b
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            conn.channel().basic_consume("jobs", lambda *_args: None)
        assert refused.value.reply_code == 403, refused.value

        # read again, a consumer again; the user deleted on a: the connection ends
        status, _ = a.proc.request("PUT", "/users/alice/permissions", ALL, headers=ADMIN)
        assert status in (200, 204)
        wait_for("read back on b", lambda: _reads_on(b.proc) == ".*")
        ch = conn.channel()
        got.clear()
        ch.basic_consume("jobs", lambda _ch, m, _p, _b: got.append(m))
        pump_until(conn, "delivered again", lambda: len(got) >= 1)
        assert a.proc.request("DELETE", "/users/alice", headers=ADMIN)[0] in (200, 204)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            pump_until(conn, "the connection closed", lambda: False)
        assert closed.value.reply_code == 320, closed.value
        wait_for("the owner requeued its deliveries again", lambda: _counts(a.proc) == (3, 0))
    finally:
        if conn.is_open:
            conn.close()


def test_a_relayed_channel_consumer_is_cancelled_when_read_is_revoked(secured: tuple[AMQPNode, AMQPNode]) -> None:
    a, b = secured
    _setup(a.proc, b.proc, 3)
    ch = RawChannel(b.proc.port, headers=ALICE)
    try:
        ch.send({"op": "qos", "prefetch": 2, "id": 1}, {"op": "consume", "queue": "jobs", "consumer_tag": "c1", "id": 2})
        delivered = []
        while len(delivered) < 2:
            ev = ch.next_event()
            assert ev["ev"] != "error", ev
            if ev["ev"] == "deliver":
                delivered.append(ev)
        status, _ = a.proc.request("PUT", "/users/alice/permissions", {"configure": ".*", "write": ".*", "read": "^$"}, headers=ADMIN)
        assert status in (200, 204)
        ev = ch.next_event()
        while ev["ev"] == "deliver":
            ev = ch.next_event()
        assert ev == {"ev": "cancel", "consumer_tag": "c1",
                      "reason": "read permission on queue 'jobs' was revoked for user 'alice'"}, ev
        wait_for("the owner requeued its deliveries", lambda: _counts(a.proc) == (3, 0))
        # the channel goes on: a consume now is refused there
        ch.send({"op": "consume", "queue": "jobs", "id": 3})
        ev = ch.next_event()
        assert ev["ev"] == "error" and ev["error"] == "access_refused", ev
    finally:
        ch.close()
    # read again, a relayed consumer again; the user deleted on a: the channel on b ends
    status, _ = a.proc.request("PUT", "/users/alice/permissions", ALL, headers=ADMIN)
    assert status in (200, 204)
    wait_for("read back on b", lambda: _reads_on(b.proc) == ".*")
    ch = RawChannel(b.proc.port, headers=ALICE)
    try:
        ch.send({"op": "qos", "prefetch": 2, "id": 1}, {"op": "consume", "queue": "jobs", "consumer_tag": "c2", "id": 2})
        ev = ch.next_event()
        while ev["ev"] != "deliver":
            assert ev["ev"] != "error", ev
            ev = ch.next_event()
        wait_for("2 out on the owner", lambda: _counts(a.proc) == (1, 2))
        assert a.proc.request("DELETE", "/users/alice", headers=ADMIN)[0] in (200, 204)
        while ev["ev"] != "error":
            ev = ch.next_event()
        assert ev["error"] == "credentials_revoked" and ev["message"] == "user 'alice' was deleted", ev
        wait_for("the owner requeued its deliveries again", lambda: _counts(a.proc) == (3, 0))
    finally:
        ch.close()

"""Nodes serving HTTPS forward to one another over TLS, verifying each other's
certificates against the cluster's CA bundle (``--cluster-ca-file``); a node that
does not trust the others' CA cannot forward (real etcd, real brokers)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.cluster.conftest import https_call, wait_for
from tests.support.broker import BrokerProcess, free_port, stop_all
from tests.support.etcd import EtcdProcess

trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.slow

#: the nodes serve https and answer once up: a refused connection is a "not yet"
_wait = partial(wait_for, timeout_s=30.0, retry_on=(OSError,))


@pytest.fixture
def tls_nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[tuple[list[BrokerProcess], Path]]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_path, key_path, ca_path = tmp_path / "node.pem", tmp_path / "node.key", tmp_path / "ca.pem"
    cert.private_key_pem.write_to_path(str(key_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    ca.cert_pem.write_to_path(str(ca_path))
    procs = []
    for name, trusted in (("a", True), ("b", True), ("u", False)):
        port = free_port()
        args = (
            "--etcd", etcd.url, "--node-name", name, "--advertise-url", f"https://localhost:{port}",
            "--cluster-lease-ttl-s", "2", "--tls-cert", str(cert_path), "--tls-key", str(key_path),
        ) + (("--cluster-ca-file", str(ca_path)) if trusted else ())
        procs.append(BrokerProcess(tmp_path / name, port=port, args=args, env={"ACKBUS_AMQPS_PORT": "0"}))
    try:
        for p in procs:
            p.start(wait_ready=False)
            _wait(f"{p.port} up", lambda p=p: https_call(p.port, ca_path, "GET", "/healthz")[0] == 200)
            # its view read from etcd and its registration made (before, a declare on it answers 503)
            _wait(f"{p.port} synced", lambda p=p: (lambda c: c["synced"] and c["member"])(https_call(p.port, ca_path, "GET", "/cluster")[1]))
        yield procs, ca_path
    finally:
        stop_all(procs)


def test_forwarding_over_tls(tls_nodes: tuple[list[BrokerProcess], Path]) -> None:
    (a, b, u), ca = tls_nodes
    _wait("three alive", lambda: sum(n["alive"] for n in https_call(a.port, ca, "GET", "/cluster")[1]["nodes"]) == 3)
    status, q = https_call(b.port, ca, "PUT", "/queues/secure", {"arguments": {"x-queue-leader-locator": "client-local"}})
    assert status == 201 and q["owner"] == "b"
    _wait("secure seen on a and u", lambda: all(
        [n["queues"] for n in https_call(node.port, ca, "GET", "/cluster")[1]["nodes"] if n["name"] == "b"] == [["secure"]]
        for node in (a, u)
    ))
    status, answer = https_call(a.port, ca, "POST", "/exchanges/amq.default/publish?routing_key=secure", b"over tls")
    assert status == 200 and answer["confirm"] == "ack", answer
    status, got = https_call(a.port, ca, "POST", "/queues/secure/get?lease=60")  # relayed over TLS
    assert status == 200 and [m["body"] for m in got["messages"]] == ["over tls"], got
    # u does not trust the CA (the system's CAs only): it cannot reach b
    status, answer = https_call(u.port, ca, "POST", "/exchanges/amq.default/publish?routing_key=secure", b"x")
    assert status == 503 and answer["reason"].startswith("queue_unavailable"), answer

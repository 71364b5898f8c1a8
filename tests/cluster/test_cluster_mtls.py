"""Mutual TLS between nodes: nodes that require client certificates
(``--tls-client-ca``) reach one another when each presents one (``--cluster-cert``,
``--cluster-key``); a node that presents none cannot forward to them (real etcd, real
brokers)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import https_call, wait_for
from tests.support.broker import BrokerProcess, free_port, stop_all
from tests.support.etcd import EtcdProcess

trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.slow

#: the nodes serve https and answer once up: a refused connection is a "not yet"
_wait = partial(wait_for, timeout_s=30.0, retry_on=(OSError,))


class _PKI:
    """A CA, the nodes' server certificate and a client certificate, as PEM files."""

    def __init__(self, directory: Path) -> None:
        ca = trustme.CA()
        server = ca.issue_cert("localhost", "127.0.0.1")
        client = ca.issue_cert("ackbus-node")
        self.ca, self.cert, self.key = directory / "ca.pem", directory / "node.pem", directory / "node.key"
        self.client_cert, self.client_key = directory / "client.pem", directory / "client.key"
        ca.cert_pem.write_to_path(str(self.ca))
        server.cert_chain_pems[0].write_to_path(str(self.cert))
        server.private_key_pem.write_to_path(str(self.key))
        client.cert_chain_pems[0].write_to_path(str(self.client_cert))
        client.private_key_pem.write_to_path(str(self.client_key))

    def https(self, port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A request to a node, presenting the client certificate (the nodes want one)."""
        return https_call(port, self.ca, method, path, body, client_cert=(self.client_cert, self.client_key))


@pytest.fixture
def mtls_nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[tuple[list[BrokerProcess], _PKI]]:
    """Nodes a and b present the client certificate to their peers; u presents none.
    All three serve https and require a client certificate signed by the CA."""
    pki = _PKI(tmp_path)
    procs = []
    for name, presents in (("a", True), ("b", True), ("u", False)):
        port = free_port()
        args = (
            "--etcd", etcd.url, "--node-name", name, "--advertise-url", f"https://localhost:{port}",
            "--cluster-lease-ttl-s", "2", "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
            "--tls-client-ca", str(pki.ca), "--cluster-ca-file", str(pki.ca),
        ) + (("--cluster-cert", str(pki.client_cert), "--cluster-key", str(pki.client_key)) if presents else ())
        procs.append(BrokerProcess(tmp_path / name, port=port, args=args, env={"ACKBUS_AMQPS_PORT": "0"}))
    try:
        for p in procs:
            p.start(wait_ready=False)
            _wait(f"{p.port} up", lambda p=p: pki.https(p.port, "GET", "/healthz")[0] == 200)
            _wait(f"{p.port} synced", lambda p=p: (lambda c: c["synced"] and c["member"])(pki.https(p.port, "GET", "/cluster")[1]))
        yield procs, pki
    finally:
        stop_all(procs)


def test_nodes_that_require_client_certificates_forward_to_one_another(
    mtls_nodes: tuple[list[BrokerProcess], _PKI],
) -> None:
    (a, b, u), pki = mtls_nodes
    _wait("three alive", lambda: sum(n["alive"] for n in pki.https(a.port, "GET", "/cluster")[1]["nodes"]) == 3)
    status, q = pki.https(b.port, "PUT", "/queues/mutual", {"arguments": {"x-queue-leader-locator": "client-local"}})
    assert status == 201 and q["owner"] == "b"
    _wait("mutual seen on a and u", lambda: all(
        [n["queues"] for n in pki.https(node.port, "GET", "/cluster")[1]["nodes"] if n["name"] == "b"] == [["mutual"]]
        for node in (a, u)
    ))
    status, answer = pki.https(a.port, "POST", "/exchanges/amq.default/publish?routing_key=mutual", b"over mtls")
    assert status == 200 and answer["confirm"] == "ack", answer
    status, got = pki.https(a.port, "POST", "/queues/mutual/get?lease=60")  # relayed, a presenting its certificate
    assert status == 200 and [m["body"] for m in got["messages"]] == ["over mtls"], got
    # u presents no certificate: b refuses its connection, so it cannot forward there
    status, answer = pki.https(u.port, "POST", "/exchanges/amq.default/publish?routing_key=mutual", b"x")
    assert status == 503 and answer["reason"].startswith("queue_unavailable"), answer
    assert not answer["reason"].endswith(": "), answer  # the cause is named (a TLS alert)


def test_a_quorum_queues_followers_fetch_from_their_leader_over_mutual_tls(
    mtls_nodes: tuple[list[BrokerProcess], _PKI],
) -> None:
    """A publish to a quorum queue is confirmed once a majority holds it: with its
    leader on a, that is b's follower fetching from a, presenting its certificate."""
    (a, b, u), pki = mtls_nodes
    _wait("three alive", lambda: sum(n["alive"] for n in pki.https(a.port, "GET", "/cluster")[1]["nodes"]) == 3)
    status, q = pki.https(a.port, "PUT", "/queues/qq", {
        "durable": True, "arguments": {"x-queue-type": "quorum", "x-queue-leader-locator": "client-local"},
    })
    assert status == 201, q

    def confirmed() -> bool:
        status, answer = pki.https(b.port, "POST", "/exchanges/amq.default/publish?routing_key=qq&mandatory=true", b"replicated")
        return status == 200 and answer.get("confirm") == "ack"

    _wait("a publish to qq confirmed", confirmed)
    status, got = pki.https(a.port, "POST", "/queues/qq/get?lease=60&max=10")
    assert status == 200 and "replicated" in [m["body"] for m in got["messages"]], got


def test_a_certificate_rotated_on_disk_is_presented_after_sighup(tmp_path: Path, etcd: EtcdProcess) -> None:
    """Node r starts presenting a certificate b does not trust; its files are then
    replaced by one b trusts and r gets SIGHUP: its next connection to b presents the
    new one, and it forwards there (no restart)."""
    pki = _PKI(tmp_path)
    cert, key = tmp_path / "rotating.pem", tmp_path / "rotating.key"
    rogue = trustme.CA().issue_cert("ackbus-node")
    rogue.cert_chain_pems[0].write_to_path(str(cert))
    rogue.private_key_pem.write_to_path(str(key))
    procs = []
    for name, presents in (("b", (pki.client_cert, pki.client_key)), ("r", (cert, key))):
        port = free_port()
        args = (
            "--etcd", etcd.url, "--node-name", name, "--advertise-url", f"https://localhost:{port}",
            "--cluster-lease-ttl-s", "2", "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
            "--tls-client-ca", str(pki.ca), "--cluster-ca-file", str(pki.ca),
            "--cluster-cert", str(presents[0]), "--cluster-key", str(presents[1]),
        )
        procs.append(BrokerProcess(tmp_path / name, port=port, args=args, env={"ACKBUS_AMQPS_PORT": "0"}))
    try:
        for p in procs:
            p.start(wait_ready=False)
            _wait(f"{p.port} up", lambda p=p: pki.https(p.port, "GET", "/healthz")[0] == 200)
            _wait(f"{p.port} synced", lambda p=p: (lambda c: c["synced"] and c["member"])(pki.https(p.port, "GET", "/cluster")[1]))
        b, r = procs
        status, q = pki.https(b.port, "PUT", "/queues/rotated", {"arguments": {"x-queue-leader-locator": "client-local"}})
        assert status == 201 and q["owner"] == "b", q
        _wait("rotated seen on r", lambda: [
            n["queues"] for n in pki.https(r.port, "GET", "/cluster")[1]["nodes"] if n["name"] == "b"
        ] == [["rotated"]])

        def publish() -> tuple[int, Any]:
            return pki.https(r.port, "POST", "/exchanges/amq.default/publish?routing_key=rotated", b"after sighup")

        status, answer = publish()
        assert status == 503 and answer["reason"].startswith("queue_unavailable"), answer  # b refuses the rogue one
        for new, old in ((pki.client_cert, cert), (pki.client_key, key)):  # rotated on disk,
            staged = old.with_suffix(".new")  # as renewal tools do it: written aside, renamed
            staged.write_bytes(new.read_bytes())
            staged.replace(old)
        r.proc.send_signal(signal.SIGHUP)
        _wait("r reloaded its certificate", lambda: "cluster_cert reloaded" in r.log_path.read_text(errors="replace"))
        _wait("r forwards to b", lambda: (lambda s, a: s == 200 and a["confirm"] == "ack")(*publish()))
        status, got = pki.https(b.port, "POST", "/queues/rotated/get?lease=60&max=10")
        assert status == 200 and "after sighup" in [m["body"] for m in got["messages"]], got
        assert r.proc.poll() is None
    finally:
        stop_all(procs)

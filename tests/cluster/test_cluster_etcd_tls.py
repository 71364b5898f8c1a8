"""Nodes reach an etcd that serves https only, wants client certificates
(``--client-cert-auth``) and has its authentication on: a two-node cluster works
through it, a node that etcd (or that etcd's certificate) cannot satisfy refuses to
start with the reason in its log, and a token etcd forgot when it restarted is renewed
(real etcd, real brokers)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import cluster_nodes, wait_for, wait_synced
from tests.support.broker import BrokerProcess, free_port, stop_all
from tests.support.etcd import EtcdProcess, EtcdTLS, make_etcd_tls, require_etcd

trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.slow

PASSWORD = "etcd-pw-7c1e"
ROOT_PASSWORD = "root-pw-93ab"


@pytest.fixture
def secure_etcd(tmp_path: Path) -> Iterator[tuple[EtcdProcess, EtcdTLS]]:
    """etcd over https with client certificates required, and a user ``ack`` that may
    read and write the cluster's keys (``/ackbus/``) only."""
    require_etcd()
    tls = make_etcd_tls(tmp_path / "pki")
    proc = EtcdProcess(tmp_path / "etcd", tls=tls)
    try:
        proc.start()
        proc.enable_auth(ROOT_PASSWORD, {"ack": (PASSWORD, "/ackbus/")})
        yield proc, tls
    finally:
        proc.stop()


def _node(
    tmp: Path, etcd: EtcdProcess, tls: EtcdTLS, name: str, *, extra: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> BrokerProcess:
    """A node of ``etcd`` with its CA, the client certificate and user ``ack``
    (password from the environment unless ``env`` says otherwise); not started."""
    port = free_port()
    return BrokerProcess(
        tmp / name,
        port=port,
        args=(
            "--etcd", etcd.url, "--node-name", name, "--advertise-url", f"http://127.0.0.1:{port}",
            "--cluster-lease-ttl-s", "2", "--etcd-user", "ack",
            *extra,
        ),
        env={"ACKBUS_ETCD_PASSWORD": PASSWORD} if env is None else env,
    )


def _tls_args(tls: EtcdTLS) -> tuple[str, ...]:
    return ("--etcd-ca-file", str(tls.ca), "--etcd-cert", str(tls.client_cert), "--etcd-key", str(tls.client_key))


def test_a_two_node_cluster_through_etcd_over_tls_with_a_user(
    tmp_path: Path, secure_etcd: tuple[EtcdProcess, EtcdTLS]
) -> None:
    etcd, tls = secure_etcd
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    a = _node(tmp_path, etcd, tls, "a", extra=_tls_args(tls))
    b = _node(tmp_path, etcd, tls, "b", extra=(*_tls_args(tls), "--etcd-password-file", str(tmp_path / "pw")), env={})
    try:
        for node in (a, b):
            node.start()
            wait_synced(node)
        wait_for("b alive on a", lambda: cluster_nodes(a).get("b", {}).get("alive"))
        status, q = a.request("PUT", "/queues/classic", {"arguments": {"x-queue-leader-locator": "client-local"}})
        assert status == 201 and q["owner"] == "a", q
        status, q = a.request("PUT", "/queues/qq", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
        assert status == 201, q

        def published(queue: str) -> bool:
            status, answer = b.request("POST", f"/exchanges/amq.default/publish?routing_key={queue}&mandatory=true",
                                       f"via b to {queue}".encode(), timeout_s=15)
            return status == 200 and answer.get("confirm") == "ack"

        for queue in ("classic", "qq"):
            wait_for(f"b publishing to {queue}", lambda queue=queue: published(queue), timeout_s=30)
        assert [m["body"] for m in a.drain("classic")] == ["via b to classic"]
        assert [m["body"] for m in b.drain("qq")][:1] == ["via b to qq"]
        status, body = a.request("GET", "/cluster")
        assert status == 200 and body["etcd"]["ok"] and body["etcd"]["endpoints"][0]["url"] == etcd.url
        assert "(set)" in a.log_path.read_text()  # its password, in the start-up line
        for node in (a, b):
            assert PASSWORD not in node.log_path.read_text()
            assert PASSWORD not in str(node.request("GET", "/cluster")[1])
    finally:
        stop_all([a, b])


def test_nodes_etcd_cannot_satisfy_refuse_to_start(tmp_path: Path, secure_etcd: tuple[EtcdProcess, EtcdTLS]) -> None:
    etcd, tls = secure_etcd
    stranger = trustme.CA()
    stranger.cert_pem.write_to_path(str(tmp_path / "stranger.pem"))
    cases = {
        # we do not trust etcd's certificate
        "untrusted": (("--etcd-ca-file", str(tmp_path / "stranger.pem"), "--etcd-cert", str(tls.client_cert),
                       "--etcd-key", str(tls.client_key)), None, "certificate verify failed"),
        # etcd wants a client certificate
        "nocert": (("--etcd-ca-file", str(tls.ca)), None, "refused the TLS connection"),
        "badpw": (_tls_args(tls), {"ACKBUS_ETCD_PASSWORD": "not-it"}, "authentication failed"),
    }
    for name, (extra, env, reason) in cases.items():
        node = _node(tmp_path, etcd, tls, name, extra=extra, env=env)
        try:
            with pytest.raises(RuntimeError, match="exited with 1"):
                node.start(timeout_s=60)
            log = node.log_tail()
            assert "cannot join the cluster" in log and reason in log, (name, log)
            assert "not-it" not in node.log_path.read_text()
        finally:
            node.stop()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--etcd", "https://127.0.0.1:1,http://127.0.0.1:2"), "mixes http:// and https://"),
        (("--etcd", "https://127.0.0.1:1", "--etcd-cert", "c.pem"), "needs etcd_cert and etcd_key together"),
        (("--etcd", "http://127.0.0.1:1", "--etcd-ca-file", "ca.pem"), "is for https:// etcd endpoints"),
        (("--etcd", "http://127.0.0.1:1", "--etcd-user", "ack"), "etcd_user"),
    ],
)
def test_settings_that_do_not_fit_together_are_a_startup_error(tmp_path: Path, extra: tuple[str, ...], says: str) -> None:
    port = free_port()
    node = BrokerProcess(tmp_path / "n", port=port,
                         args=("--node-name", "n", "--advertise-url", f"http://127.0.0.1:{port}", *extra))
    try:
        with pytest.raises(RuntimeError, match="exited with 2"):
            node.start(timeout_s=60)
        assert says in node.log_tail()
    finally:
        node.stop()


def test_a_token_etcd_forgot_in_a_restart_is_renewed(tmp_path: Path, secure_etcd: tuple[EtcdProcess, EtcdTLS]) -> None:
    """etcd keeps its tokens in memory: after it restarts, the node's calls are
    refused for their token; the node authenticates again and goes on (a queue can
    be declared; the node is a member and synced)."""
    etcd, tls = secure_etcd
    a = _node(tmp_path, etcd, tls, "a", extra=_tls_args(tls))
    try:
        a.start()
        wait_synced(a)
        assert a.request("PUT", "/queues/before", {})[0] == 201
        etcd.stop()
        etcd.start()
        wait_for("a declaring after etcd's restart", lambda: a.request("PUT", "/queues/after", {})[0] == 201, timeout_s=30)
        wait_synced(a)
        assert "etcd token renewed" in a.log_path.read_text()
    finally:
        a.stop()


def test_a_password_changed_in_its_file_is_used_after_sighup(tmp_path: Path, secure_etcd: tuple[EtcdProcess, EtcdTLS]) -> None:
    """The password rotated: written to the node's password file, the node told by
    SIGHUP, then changed in etcd, whose restart forgets every token: the node
    authenticates with the new password and goes on."""
    etcd, tls = secure_etcd
    password_file = tmp_path / "etcd-password"
    password_file.write_text(PASSWORD + "\n")
    a = _node(tmp_path, etcd, tls, "a", extra=(*_tls_args(tls), "--etcd-password-file", str(password_file)), env={})
    try:
        a.start()
        wait_synced(a)
        assert a.request("PUT", "/queues/before", {})[0] == 201
        new_password = "etcd-pw-rotated-55d0"
        password_file.write_text(new_password + "\n")
        a.proc.send_signal(signal.SIGHUP)
        wait_for("a reloaded its password", lambda: "etcd password reloaded" in a.log_path.read_text(errors="replace"))
        status, answer = etcd.call("/v3/auth/authenticate", {"name": "root", "password": ROOT_PASSWORD})
        assert status == 200, answer
        status, answer = etcd.call("/v3/auth/user/changepw", {"name": "ack", "password": new_password}, answer["token"])
        assert status == 200, answer
        etcd.stop()
        etcd.start()
        wait_for("a declaring with the new password", lambda: a.request("PUT", "/queues/after", {})[0] == 201, timeout_s=30)
        wait_synced(a)
        log = a.log_path.read_text(errors="replace")
        assert new_password not in log and PASSWORD not in log
    finally:
        a.stop()


def _copy_tls(tls: EtcdTLS, ca: Path, cert: Path, key: Path) -> None:
    ca.write_bytes(tls.ca.read_bytes())
    cert.write_bytes(tls.client_cert.read_bytes())
    key.write_bytes(tls.client_key.read_bytes())


def test_a_node_follows_etcd_to_a_new_ca_after_sighup(tmp_path: Path) -> None:
    """A whole CA rotation: etcd moves to a certificate of a new CA and trusts client
    certificates of that CA only. The node's files were replaced first (its CA file
    now the new CA, its client certificate one the new CA signed) and the node was
    told by SIGHUP: after etcd's restart it verifies etcd with the new CA, presents
    the new certificate and goes on. (Without the SIGHUP the same node is cut off,
    "certificate verify failed": the test fails if the reload does not happen.)"""
    require_etcd()
    old, new = make_etcd_tls(tmp_path / "old"), make_etcd_tls(tmp_path / "new")
    etcd = EtcdProcess(tmp_path / "etcd", tls=old)
    files = tmp_path / "node-ca.pem", tmp_path / "node.pem", tmp_path / "node.key"
    _copy_tls(old, *files)
    port = free_port()
    a = BrokerProcess(
        tmp_path / "a", port=port,
        args=("--etcd", etcd.url, "--node-name", "a", "--advertise-url", f"http://127.0.0.1:{port}",
              "--cluster-lease-ttl-s", "2", "--etcd-ca-file", str(files[0]), "--etcd-cert", str(files[1]),
              "--etcd-key", str(files[2])),
    )
    try:
        etcd.start()
        a.start()
        wait_synced(a)
        assert a.request("PUT", "/queues/before", {})[0] == 201
        _copy_tls(new, *files)
        a.proc.send_signal(signal.SIGHUP)
        wait_for("a reloaded its etcd certificate", lambda: "etcd_cert reloaded" in a.log_path.read_text(errors="replace"))
        etcd.stop()
        etcd.tls = new
        etcd.start()

        def declared() -> bool:
            return a.request("PUT", "/queues/after", {}, timeout_s=5)[0] == 201

        wait_for("a declaring through the rotated etcd", declared, timeout_s=30)
        wait_synced(a)
        status, body = a.request("GET", "/cluster")
        assert status == 200 and body["etcd"]["ok"], body
    finally:
        stop_all([a])
        etcd.stop()

"""Security with real broker processes: users and tokens survive kill -9, a broker
with no users refuses to listen beyond loopback, the offline user tool refuses a data
directory a broker holds, and TLS certificates reload on SIGHUP without dropping an
open connection."""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.support.broker import ROOT, BrokerProcess, free_port

pytestmark = pytest.mark.slow  # broker subprocesses, restarts and kill -9


def users_cli(data_dir: Path, *args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "broker", "users", "--data-dir", str(data_dir), *args],
        input=None if password is None else password + "\n",
        capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=60,
    )


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_users_and_tokens_survive_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    made = users_cli(data, "add", "admin", "--tags", "administrator", "--configure", ".*", "--write", ".*",
                     "--read", ".*", "--password-stdin", password="s3cret")
    assert made.returncode == 0, made.stderr
    assert "s3cret" not in made.stdout + made.stderr
    token = users_cli(data, "token", "admin", "--description", "deploy")
    assert token.returncode == 0 and token.stdout.startswith("ackbus_"), token.stderr
    offline_token = token.stdout.strip()
    with BrokerProcess(data) as broker:
        admin = basic("admin", "s3cret")
        assert broker.request("GET", "/queues")[0] == 401
        assert broker.request("GET", "/whoami", headers=admin)[1]["name"] == "admin"
        status, _ = broker.request("PUT", "/users/bob", {"password": "pw", "permissions": {"read": ".*"}}, headers=admin)
        assert status == 201
        status, body = broker.request("POST", "/users/bob/tokens", {}, headers=admin)
        assert status == 201
        bob_token, bob_token_id = body["token"], body["id"]
        status, body = broker.request("POST", "/users/bob/tokens", {}, headers=admin)
        revoked_id, revoked_token = body["id"], body["token"]
        assert broker.request("DELETE", f"/tokens/{revoked_id}", headers=admin)[0] == 200
        broker.kill()  # no checkpoint: the log alone brings them back
        broker.start()
        assert broker.request("GET", "/whoami", headers=basic("bob", "pw"))[1]["name"] == "bob"
        assert broker.request("GET", "/whoami", headers={"Authorization": f"Bearer {bob_token}"})[0] == 200
        assert broker.request("GET", "/whoami", headers={"Authorization": f"Bearer {offline_token}"})[0] == 200
        assert broker.request("GET", "/whoami", headers={"Authorization": f"Bearer {revoked_token}"})[0] == 401
        assert broker.request("GET", "/whoami", headers=basic("bob", "wrong"))[0] == 401
        # metrics are an operator's: administrators only
        assert broker.request("GET", "/metrics")[0] == 401
        assert broker.request("GET", "/metrics", headers=basic("bob", "pw"))[0] == 403
        status, text = broker.request("GET", "/metrics", headers=admin)
        assert status == 200 and b"ackbus_auth_failures_total 2" in text  # the revoked token, the wrong password
        # and through a checkpoint (a clean stop) too
        assert broker.terminate() == 0
        broker.start()
        assert broker.request("GET", "/whoami", headers=admin)[0] == 200
        status, body = broker.request("GET", "/users/bob/tokens", headers=admin)
        assert [t["id"] for t in body["tokens"]] == [bob_token_id]


def test_no_users_means_loopback_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(data, args=("--host", "0.0.0.0"))
    broker.start(wait_ready=False)
    assert broker.proc is not None
    assert broker.proc.wait(timeout=60) == 1
    log = broker.log_tail()
    assert "refusing to serve on 0.0.0.0: no users exist" in log and "users add" in log
    assert users_cli(data, "add", "ops", "--password-stdin", password="pw").returncode == 0
    with broker:  # now it serves there, with credentials
        assert broker.request("GET", "/queues")[0] == 401
        assert broker.request("GET", "/healthz")[0] == 200


def test_the_offline_tool_refuses_a_running_brokers_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with BrokerProcess(data):
        refused = users_cli(data, "add", "ops", "--password-stdin", password="pw")
        assert refused.returncode == 1 and "in use" in refused.stderr
        assert users_cli(data, "list").returncode == 1
    assert users_cli(data, "list").stdout == ""
    assert users_cli(data, "delete", "ghost").returncode == 2


def test_offline_tool_errors_are_clear(tmp_path: Path) -> None:
    data = tmp_path / "data"
    missing = users_cli(data, "list")
    assert missing.returncode == 1 and "no data directory" in missing.stderr and not data.exists()
    bad = users_cli(data, "add", "a:b", "--password-stdin", password="pw")
    assert bad.returncode == 2 and "':'" in bad.stderr
    bad = users_cli(data, "add", "x", "--read", "(", "--password-stdin", password="pw")
    assert bad.returncode == 2 and "regular expression" in bad.stderr
    nopw = users_cli(data, "add", "x")
    assert nopw.returncode == 2 and "password" in nopw.stderr
    assert users_cli(data, "add", "x", "--password-stdin", password="pw").returncode == 0
    listed = users_cli(data, "list")
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == ["x"]


# -- TLS ------------------------------------------------------------------------------


def write_cert(ca: trustme.CA, directory: Path) -> tuple[Path, Path]:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_path, key_path = directory / "broker.pem", directory / "broker.key"
    cert.private_key_pem.write_to_path(str(key_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    return cert_path, key_path


def https_get(port: int, ca_file: Path, path: str = "/healthz") -> tuple[int, Any]:
    context = ssl.create_default_context(cafile=str(ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def wait_tls_ready(broker: BrokerProcess, ca_file: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert broker.proc is not None and broker.proc.poll() is None, broker.log_tail()
        try:
            if https_get(broker.port, ca_file)[0] == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(broker.log_tail())


def test_tls_certificate_reloads_on_sighup_without_dropping_a_connection(tmp_path: Path) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    certs = tmp_path / "certs"
    certs.mkdir()
    cert, key = write_cert(old_ca, certs)
    old_ca_file, new_ca_file = tmp_path / "old-ca.pem", tmp_path / "new-ca.pem"
    old_ca.cert_pem.write_to_path(str(old_ca_file))
    new_ca.cert_pem.write_to_path(str(new_ca_file))
    broker = BrokerProcess(tmp_path / "data", args=("--tls-cert", str(cert), "--tls-key", str(key)))
    broker.start(wait_ready=False)
    try:
        wait_tls_ready(broker, old_ca_file)
        # a keep-alive connection open across the reload
        kept = http.client.HTTPSConnection(
            "127.0.0.1", broker.port, context=ssl.create_default_context(cafile=str(old_ca_file)), timeout=10
        )
        kept.request("GET", "/healthz")
        assert kept.getresponse().read()
        write_cert(new_ca, certs)  # replaced in place, as certbot does
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "TLS certificate reloaded" not in broker.log_tail():
            assert time.monotonic() < deadline, broker.log_tail()
            time.sleep(0.05)
        assert https_get(broker.port, new_ca_file)[0] == 200
        with pytest.raises(ssl.SSLError):
            https_get(broker.port, old_ca_file)
        kept.request("GET", "/overview")
        resp = kept.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["version"]
        kept.close()
        # a broken file on the next SIGHUP keeps the working certificate
        key.write_text("not a key")
        broker.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "TLS files not reloaded" not in broker.log_tail():
            assert time.monotonic() < deadline, broker.log_tail()
            time.sleep(0.05)
        assert https_get(broker.port, new_ca_file)[0] == 200
        assert broker.terminate() == 0
    finally:
        broker.stop()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_with_cacert_as_the_docs_show(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = write_cert(ca, tmp_path)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    data = tmp_path / "data"
    assert users_cli(data, "add", "app", "--configure", ".*", "--write", ".*", "--read", ".*",
                     "--password-stdin", password="pw").returncode == 0
    port = free_port()
    broker = BrokerProcess(data, args=("--tls-cert", str(cert), "--tls-key", str(key)), port=port)
    broker.start(wait_ready=False)
    try:
        wait_tls_ready(broker, ca_file)
        base = f"https://localhost:{port}"

        def curl(*args: str) -> str:
            out = subprocess.run(["curl", "-sS", "--cacert", str(ca_file), *args], capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            return out.stdout

        assert json.loads(curl("-u", "app:pw", "-X", "PUT", f"{base}/queues/jobs", "-d", "{}"))["name"] == "jobs"
        assert json.loads(curl("-u", "app:pw", "-X", "POST", f"{base}/exchanges/amq.default/publish?routing_key=jobs",
                               "--data-binary", "hello"))["confirm"] == "ack"
        got = json.loads(curl("-u", "app:pw", "-X", "POST", f"{base}/queues/jobs/get"))
        assert got["messages"][0]["body"] == "hello"
        assert json.loads(curl(f"{base}/queues"))["error"] == "unauthorized"
    finally:
        broker.stop()

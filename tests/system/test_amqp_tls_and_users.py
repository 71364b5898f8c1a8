"""The AMQP listener with TLS (``amqps_port`` on the broker's certificate) and with
users: PLAIN against ackbus's users, wrong passwords refused, permissions enforced per
operation with 403."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import pytest
import trustme

from tests.support.broker import BrokerProcess, free_port
from tests.system.test_security import wait_tls_ready, write_cert

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.timeout(120)


def _tls_broker(tmp_path: Path) -> tuple[BrokerProcess, Path, int, int]:
    """A broker serving https and AMQPS on a new CA's certificate and plain AMQP beside
    them, started and ready: (broker, the CA's file, AMQP port, AMQPS port)."""
    ca = trustme.CA()
    cert, key = write_cert(ca, tmp_path)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    plain, secure = free_port(), free_port()
    broker = BrokerProcess(tmp_path / "data", args=("--tls-cert", str(cert), "--tls-key", str(key)),
                           env={"ACKBUS_AMQP_PORT": str(plain), "ACKBUS_AMQPS_PORT": str(secure)})
    broker.start(wait_ready=False)
    try:
        wait_tls_ready(broker, ca_file)
    except BaseException:
        broker.stop()
        raise
    return broker, ca_file, plain, secure


def test_amqps_serves_pika_over_tls_and_plain_amqp_beside_it(tmp_path: Path) -> None:
    broker, ca_file, plain, secure = _tls_broker(tmp_path)
    try:
        context = ssl.create_default_context(cafile=str(ca_file))
        params = pika.ConnectionParameters("127.0.0.1", secure, ssl_options=pika.SSLOptions(context, "localhost"))
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.queue_declare("over-tls")
        ch.basic_publish("", "over-tls", b"secret")
        assert ch.basic_get("over-tls", auto_ack=True)[2] == b"secret"
        conn.close()
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", plain))
        assert conn.channel().queue_declare("over-tls", passive=True).method.message_count == 0
        conn.close()
    finally:
        broker.stop()


def test_users_and_permissions(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.support.broker import ROOT

    data = tmp_path / "data"
    for name, allowed, tags in (("alice", ".*", "administrator"), ("bob", "^bob\\.", "")):
        subprocess.run([sys.executable, "-m", "broker", "users", "--data-dir", str(data), "add", name, "--tags", tags,
                        "--password-stdin", "--configure", allowed, "--write", allowed, "--read", allowed],
                       input=b"pw-123456\n", cwd=ROOT, check=True, capture_output=True)
    port = free_port()
    broker = BrokerProcess(data, env={"ACKBUS_AMQP_PORT": str(port)})
    broker.start(wait_ready=False)
    try:
        import time

        deadline = time.monotonic() + 60
        while True:
            try:
                conn = pika.BlockingConnection(pika.ConnectionParameters(
                    "127.0.0.1", port, credentials=pika.PlainCredentials("alice", "pw-123456")))
                break
            except pika.exceptions.AMQPConnectionError:
                assert time.monotonic() < deadline, broker.log_tail()
                time.sleep(0.1)
        conn.channel().queue_declare("alice.q")
        conn.close()
        auth = {"authorization": "Basic " + base64.b64encode(b"alice:pw-123456").decode()}
        # an API token as the password; revoking it closes the connection
        status, made = broker.request("POST", "/users/alice/tokens", {}, headers=auth)
        assert status in (200, 201), made
        by_token = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, credentials=pika.PlainCredentials("alice", made["token"])))
        by_token.channel().queue_declare("alice.q", passive=True)
        assert broker.request("DELETE", f"/tokens/{made['id']}", headers=auth)[0] in (200, 204)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as revoked:
            for _ in range(100):
                by_token.process_data_events(time_limit=0.1)
        assert revoked.value.reply_code == 320
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", port, credentials=pika.PlainCredentials("alice", "wrong")))
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))  # guest: no such user
        bob = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, credentials=pika.PlainCredentials("bob", "pw-123456")))
        ch = bob.channel()
        ch.queue_declare("bob.q")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare("alice.q2")
        assert err.value.reply_code == 403
        ch = bob.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_get("alice.q")
        assert err.value.reply_code == 403
        # deleting the user closes its connections (RabbitMQ's 320)
        assert broker.request("DELETE", "/users/bob", headers=auth)[0] in (200, 204)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _ in range(100):
                bob.process_data_events(time_limit=0.1)
        assert closed.value.reply_code == 320
    finally:
        broker.stop()


def test_the_management_api_lists_the_sockets_the_broker_bound(tmp_path: Path) -> None:
    """``/api/overview``'s listeners and the port and protocol health checks name the
    ports the broker really bound: its HTTP port (``https`` with TLS), AMQP and AMQPS."""
    import http.client
    import json

    broker, ca_file, plain, secure = _tls_broker(tmp_path)
    try:
        context = ssl.create_default_context(cafile=str(ca_file))

        def get(path: str) -> tuple[int, object]:
            conn = http.client.HTTPSConnection("localhost", broker.port, context=context, timeout=10)
            try:
                conn.request("GET", path)
                reply = conn.getresponse()
                return reply.status, json.loads(reply.read())
            finally:
                conn.close()

        status, overview = get("/api/overview")
        assert status == 200, overview
        assert isinstance(overview, dict)
        assert sorted((item["protocol"], item["port"]) for item in overview["listeners"]) == [
            ("amqp", plain), ("amqps", secure), ("https", broker.port),
        ]
        for port in (plain, secure, broker.port):
            assert get(f"/api/health/checks/port-listener/{port}") == (200, {"status": "ok", "port": port})
        assert get("/api/health/checks/protocol-listener/amqps") == (200, {"status": "ok", "protocol": "amqps"})
        assert get("/api/health/checks/protocol-listener/http")[0] == 503
    finally:
        broker.stop()

"""A refused login fails at once with the broker's reason: 429 (too many failed
logins from this address) on a channel's first open, and a TLS connection the broker
ends after the handshake because the client has no certificate (mutual TLS); neither
is retried for the reconnect policy's 30 s, and neither says nothing about why."""

from __future__ import annotations

import io
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trustme

import client
from broker.app import BrokerApp
from broker.http import server_ssl_context
from broker.runtime import RuntimeOptions
from client import ReconnectPolicy
from client.__main__ import run
from tests.support.app import open_broker_app
from tests.support.security import add_user

PATIENT = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.05, first_connect_give_up_after_s=60)


@pytest.fixture
async def locked_out() -> AsyncIterator[BrokerApp]:
    """A broker with user app/pw that has refused 2 logins from 127.0.0.1, its limit:
    it now answers 429 to unverified credentials from there, right ones included."""
    async with open_broker_app(options=RuntimeOptions(data_dir=None, auth_failure_limit=2)) as app:
        add_user(app.runtime.core, "app", "pw")
        await app.runtime.wait_durable()
        async with client.connect(f"http://app:wrong@127.0.0.1:{app.port}") as conn:
            for _ in range(2):
                with pytest.raises(client.BrokerRequestError):
                    await conn.queue_info("jobs")
        yield app


async def test_429_on_first_open_fails_at_once_with_the_reason(locked_out: BrokerApp) -> None:
    url = f"http://app:pw@127.0.0.1:{locked_out.port}"
    async with client.connect(url, reconnect=PATIENT) as conn:
        with trio.fail_after(10):  # well before the policy would give up
            with pytest.raises(client.ClientError) as info:
                async with conn.channel():
                    pass
    text = str(info.value)
    assert "429" in text and "too_many_failures" in text and "too many failed authentications" in text
    assert "retry after" in text
    assert locked_out.auth.refused == 1  # one attempt, not one per backoff step


async def test_the_cli_says_why_at_once(locked_out: BrokerApp, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKBUS_PASSWORD", "pw")
    out, err = io.StringIO(), io.StringIO()
    with trio.fail_after(10):
        status = await run(["--url", f"127.0.0.1:{locked_out.port}", "--user", "app", "publish", "-k", "jobs", "x"],
                           stdout=out, stderr=err, handle_signals=False)
    assert status in (1, 3) and "too many failed authentications" in err.getvalue(), err.getvalue()


def test_a_429_states_its_retry_after() -> None:
    error = client.BrokerRequestError(429, "too_many_failures", "try again later", 12.0)
    assert str(error) == "HTTP 429 too_many_failures: try again later (retry after 12 s)"
    assert str(client.BrokerRequestError(404, "not_found", "no queue 'q'")) == "HTTP 404 not_found: no queue 'q'"


@pytest.fixture
async def mutual_tls(tmp_path: Path) -> AsyncIterator[tuple[BrokerApp, Path]]:
    """A broker that wants a client certificate signed by its CA."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_path, key_path, ca_path = tmp_path / "c.pem", tmp_path / "c.key", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    ca.cert_pem.write_to_path(str(ca_path))
    async with open_broker_app() as app:
        add_user(app.runtime.core, "app", "pw")
        await app.runtime.wait_durable()
        app.server.set_ssl_context(server_ssl_context(cert_path, key_path, client_ca=ca_path))
        yield app, ca_path


async def test_no_client_certificate_is_named_at_once(mutual_tls: tuple[BrokerApp, Path]) -> None:
    app, ca_path = mutual_tls
    url = f"https://app:pw@localhost:{app.port}"
    async with client.connect(url, ca_file=ca_path, reconnect=PATIENT) as conn:
        with trio.fail_after(10):
            with pytest.raises(client.ConnectionLost) as info:
                async with conn.channel():
                    pass
        assert isinstance(info.value.__cause__, client.TLSRefused)
        assert "client certificate" in str(info.value) or "certificate it trusts" in str(info.value)
        with pytest.raises(client.TLSRefused) as rest:
            await conn.queue_info("jobs")
    assert "refused the TLS connection" in str(rest.value)
    assert "certificate" in str(rest.value)


async def test_with_its_certificate_the_client_gets_in(mutual_tls: tuple[BrokerApp, Path], tmp_path: Path) -> None:
    app, ca_path = mutual_tls
    context = ssl.create_default_context(cafile=str(ca_path))
    context.load_cert_chain(str(tmp_path / "c.pem"), str(tmp_path / "c.key"))  # signed by the same CA
    async with client.connect(f"https://app:pw@localhost:{app.port}", ssl_context=context) as conn:
        async with conn.channel() as ch:
            await ch.declare_queue("jobs")
        assert (await conn.queue_info("jobs")).messages_ready == 0

"""The client's credentials and TLS: Basic from arguments, the URL or the environment,
Bearer tokens, never in str/repr; refused credentials fail at once, not after retries;
https verified by default (a CA bundle option, never an unverified context); the CLI
takes --user with the password from the environment."""

from __future__ import annotations

import io
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

import client
from broker.app import BrokerApp
from broker.http import server_ssl_context
from client import ReconnectPolicy
from client.__main__ import run
from client.endpoint import Endpoint
from tests.support.app import open_broker_app
from tests.support.security import add_user

POLICY = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.05, give_up_after_s=5)


@pytest.fixture
async def secured() -> AsyncIterator[BrokerApp]:
    async with open_broker_app() as app:
        add_user(app.runtime.core, "app", "pw")
        await app.runtime.wait_durable()
        yield app


def test_url_credentials_become_basic_auth_and_never_show() -> None:
    endpoint = Endpoint.parse("https://app:p%40ss@broker.example:8443/base")
    assert endpoint.authorization == "Basic YXBwOnBAc3M="  # app:p@ss
    assert "p@ss" not in str(endpoint) + repr(endpoint) and "YXBw" not in repr(endpoint)
    assert str(endpoint) == "https://broker.example:8443/base"
    assert Endpoint.parse("http://h").with_credentials(token="t").authorization == "Bearer t"
    with pytest.raises(ValueError):
        Endpoint.parse("http://h").with_credentials(username="a:b", password="x")


async def test_username_password_token_and_environment(secured: BrokerApp, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{secured.port}"
    async with client.connect(url, username="app", password="pw", reconnect=POLICY) as conn:
        await conn.declare_queue("jobs")
        async with conn.channel() as ch:
            await ch.publish("", "jobs", b"hello")
    async with client.connect(f"http://app:pw@127.0.0.1:{secured.port}") as conn:
        assert (await conn.queue_info("jobs")).messages_ready == 1
    monkeypatch.setenv("ACKBUS_USERNAME", "app")
    monkeypatch.setenv("ACKBUS_PASSWORD", "pw")
    async with client.connect(url) as conn:
        assert (await conn.queue_info("jobs")).messages_ready == 1
    monkeypatch.delenv("ACKBUS_USERNAME")
    with pytest.raises(client.BrokerRequestError) as info:
        async with client.connect(url) as conn:
            await conn.queue_info("jobs")
    assert info.value.status == 401


async def test_a_refused_channel_fails_at_once_without_retrying(secured: BrokerApp) -> None:
    url = f"http://app:wrong@127.0.0.1:{secured.port}"
    async with client.connect(url, reconnect=ReconnectPolicy(give_up_after_s=60)) as conn:
        with trio.fail_after(10):  # well before the policy would give up
            with pytest.raises(client.ClientError) as info:
                async with conn.channel() as ch:
                    await ch.publish("", "jobs", b"x")
    assert "401" in str(info.value) or "unauthorized" in str(info.value)
    assert secured.auth.failed == 1  # one attempt, not one per backoff step


@pytest.fixture
async def tls_broker(secured: BrokerApp, tmp_path: Path) -> AsyncIterator[tuple[BrokerApp, Path]]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_path, key_path, ca_path = tmp_path / "c.pem", tmp_path / "c.key", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    ca.cert_pem.write_to_path(str(ca_path))
    secured.server.set_ssl_context(server_ssl_context(cert_path, key_path))
    yield secured, ca_path


async def test_https_is_verified_by_default(tls_broker: tuple[BrokerApp, Path]) -> None:
    app, ca_path = tls_broker
    url = f"https://app:pw@localhost:{app.port}"
    async with client.connect(url, ca_file=ca_path) as conn:
        await conn.declare_queue("tls")
        async with conn.channel() as ch:
            await ch.publish("", "tls", b"over tls")
        assert (await conn.queue_info("tls")).messages_ready == 1
    # without the CA bundle the private certificate is not trusted: no silent fallback
    with pytest.raises(client.ClientError) as info:
        async with client.connect(url, reconnect=ReconnectPolicy(give_up_after_s=1), connect_timeout_s=1) as conn:
            await conn.queue_info("tls")
    chain: list[str] = []
    exc: Any = info.value
    while exc is not None:
        chain.append(repr(exc))
        exc = exc.__cause__ or exc.__context__
    assert "CERTIFICATE_VERIFY_FAILED" in " ".join(chain)
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    with pytest.raises(ValueError):
        async with client.connect(url, ssl_context=unverified):
            pass


async def test_cli_user_and_cacert(tls_broker: tuple[BrokerApp, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    app, ca_path = tls_broker
    monkeypatch.setenv("ACKBUS_PASSWORD", "pw")
    out, err = io.StringIO(), io.StringIO()
    argv = ["--url", f"https://localhost:{app.port}", "--timeout", "3", "--user", "app", "--cacert", str(ca_path)]
    status = await run([*argv, "declare", "queue", "cli"], stdout=out, stderr=err, handle_signals=False)
    assert status == 0, err.getvalue()
    assert "pw" not in out.getvalue() + err.getvalue()
    monkeypatch.setenv("ACKBUS_PASSWORD", "wrong")
    status = await run([*argv, "declare", "queue", "cli2"], stdout=out, stderr=err, handle_signals=False)
    assert status == 1 and "wrong" not in err.getvalue()

"""The etcd client over TLS and with etcd's users: the token rules without a server,
then a real etcd served over https (client certificates required) and one with its
authentication on (skipped, with the reason, when etcd is not installed)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.cluster.etcd import EtcdClient, parse_endpoints
from broker.cluster.etcdaccess import (
    EtcdAuthFailed,
    EtcdCredentials,
    EtcdTokens,
    etcd_ssl_context,
    read_password_file,
    token_refused,
)
from broker.cluster.etcdproto import EtcdError, EtcdUnavailable
from tests.support.etcd import EtcdProcess, EtcdTLS, make_etcd_tls, require_etcd

trustme = pytest.importorskip("trustme")

# ------------------------------------------------------------------------ sans IO


def test_the_refusals_that_mean_a_token_etcd_does_not_accept() -> None:
    assert token_refused("etcd: etcdserver: invalid auth token")
    assert token_refused(EtcdError("etcd: etcdserver: revision of auth store is old"))
    assert token_refused("rpc error: code = InvalidArgument desc = etcdserver: user name is empty")
    assert not token_refused("etcd: etcdserver: permission denied")
    assert not token_refused("etcd: etcdserver: authentication failed, invalid user ID or password")


def test_the_password_is_never_in_a_repr() -> None:
    assert "s3cret" not in repr(EtcdCredentials("ack", "s3cret"))


def test_a_password_file_loses_its_final_line_break_and_must_not_be_empty(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("pa ss\n")
    assert read_password_file(tmp_path / "pw") == "pa ss"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(OSError, match="is empty"):
        read_password_file(tmp_path / "empty")
    with pytest.raises(OSError, match="cannot read etcd_password_file"):
        read_password_file(tmp_path / "missing")


def test_tls_files_that_do_not_load_are_named(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="etcd_ca_file"):
        etcd_ssl_context(tmp_path / "missing.pem", None, None)
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(OSError, match="etcd_cert"):
        etcd_ssl_context(None, tmp_path / "junk.pem", tmp_path / "junk.pem")


async def test_many_calls_refused_for_one_token_renew_it_once() -> None:
    tokens = EtcdTokens(EtcdCredentials("ack", "pw"))
    asked: list[dict[str, Any]] = []

    async def authenticate(body: dict[str, Any]) -> dict[str, Any]:
        asked.append(body)
        await trio.sleep(0.01)
        return {"token": f"t{len(asked)}"}

    first = await tokens.current(authenticate)
    assert first.value == "t1" and asked == [{"name": "ack", "password": "pw"}]
    renewed: list[str | None] = []
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(lambda: _renew(tokens, first.generation, authenticate, renewed))
    assert renewed == ["t2"] * 5 and len(asked) == 2 and tokens.authentications == 2


async def _renew(tokens: EtcdTokens, generation: int, authenticate: Any, into: list[str | None]) -> None:
    into.append((await tokens.renew(generation, authenticate)).value)


async def test_a_wrong_password_and_an_etcd_without_auth() -> None:
    tokens = EtcdTokens(EtcdCredentials("ack", "bad"))

    async def refuse(body: dict[str, Any]) -> dict[str, Any]:
        raise EtcdError("etcd: etcdserver: authentication failed, invalid user ID or password", code=3)

    with pytest.raises(EtcdAuthFailed, match="etcd refused user 'ack'") as caught:
        await tokens.current(refuse)
    assert "bad" not in caught.value.message and isinstance(caught.value, EtcdUnavailable)

    async def auth_off(body: dict[str, Any]) -> dict[str, Any]:
        raise EtcdError("etcd: etcdserver: authentication is not enabled", code=9)

    assert (await tokens.current(auth_off)).value is None


# ----------------------------------------------------------------- etcd over TLS


@pytest.fixture
def etcd_tls(tmp_path: Path) -> Iterator[tuple[EtcdProcess, EtcdTLS]]:
    require_etcd()
    tls = make_etcd_tls(tmp_path / "pki")
    with EtcdProcess(tmp_path / "etcd", tls=tls) as proc:
        yield proc, tls


def _client(url: str, context: ssl.SSLContext | None, **kwargs: Any) -> EtcdClient:
    return EtcdClient(parse_endpoints(url), timeout_s=3.0, ssl_context=context, **kwargs)


async def test_kv_and_watch_over_tls_with_a_client_certificate(etcd_tls: tuple[EtcdProcess, EtcdTLS]) -> None:
    etcd, tls = etcd_tls
    client = _client(etcd.url, etcd_ssl_context(tls.ca, tls.client_cert, tls.client_key))
    try:
        start = await client.put(b"/t/a", b"1")
        revision, kv = await client.get(b"/t/a")
        assert kv is not None and kv.value == b"1" and revision == start
        async with client.watch(b"/t/", start + 1) as stream:
            await client.put(b"/t/b", b"2")
            with trio.fail_after(10):
                async for batch in stream:
                    if batch.events:
                        break
        assert [e.kv.key for e in batch.events] == [b"/t/b"]
    finally:
        await client.aclose()


async def test_an_etcd_certificate_we_do_not_trust_is_an_unreachable_endpoint(
    etcd_tls: tuple[EtcdProcess, EtcdTLS],
) -> None:
    etcd, tls = etcd_tls
    other_ca = trustme.CA()
    context = ssl.create_default_context()
    other_ca.configure_trust(context)
    context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    client = _client(etcd.url, context)
    try:
        with pytest.raises(EtcdUnavailable, match="certificate verify failed|TLS handshake failed"):
            await client.put(b"/t/a", b"1")
        assert client.endpoints[0].healthy is False
    finally:
        await client.aclose()


async def test_no_client_certificate_where_etcd_wants_one_is_an_unreachable_endpoint(
    etcd_tls: tuple[EtcdProcess, EtcdTLS],
) -> None:
    etcd, tls = etcd_tls
    client = _client(etcd.url, etcd_ssl_context(tls.ca, None, None))
    try:
        with pytest.raises(EtcdUnavailable, match="etcd unreachable: .*refused the TLS connection"):
            await client.put(b"/t/a", b"1")
        with pytest.raises(EtcdUnavailable, match="refused the TLS connection"):
            async with client.watch(b"/t/", 1):
                pass
    finally:
        await client.aclose()


async def test_a_refused_tls_endpoint_moves_the_call_to_the_next(etcd_tls: tuple[EtcdProcess, EtcdTLS]) -> None:
    """A TLS server whose certificate we do not trust, first in the list: the call is
    made on the next endpoint, and the refused one is marked with why."""
    etcd, tls = etcd_tls
    stranger = trustme.CA().issue_cert("127.0.0.1")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    stranger.configure_cert(server_context)

    async def handshake_only(stream: trio.SSLStream[trio.SocketStream]) -> None:
        with trio.move_on_after(5):
            try:
                await stream.do_handshake()
                await stream.receive_some(1)
            except trio.BrokenResourceError:
                pass

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_ssl_over_tcp, handshake_only, 0, server_context, host="127.0.0.1"))
        port = listeners[0].transport_listener.socket.getsockname()[1]
        client = _client(f"https://127.0.0.1:{port},{etcd.url}", etcd_ssl_context(tls.ca, tls.client_cert, tls.client_key))
        try:
            assert await client.put(b"/t/x", b"1") > 0
            first, second = client.endpoints
            assert first.healthy is False and "TLS" in (first.error or "") and second.healthy is True
            assert client.preferred is second
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()


# ------------------------------------------------------------------- etcd's users

PASSWORD = "ack-pw"


@pytest.fixture
def etcd_auth(tmp_path: Path) -> Iterator[EtcdProcess]:
    require_etcd()
    with EtcdProcess(tmp_path / "etcd") as proc:
        proc.enable_auth("root-pw", {"ack": (PASSWORD, "/t/")})
        yield proc


async def test_calls_and_watches_carry_the_users_token(etcd_auth: EtcdProcess) -> None:
    client = _client(etcd_auth.url, None, credentials=EtcdCredentials("ack", PASSWORD))
    try:
        start = await client.put(b"/t/a", b"1")
        with pytest.raises(EtcdError, match="permission denied"):
            await client.put(b"/elsewhere", b"1")  # the user's role covers /t/ only
        async with client.watch(b"/t/", start + 1) as stream:
            await client.put(b"/t/b", b"2")
            with trio.fail_after(10):
                async for batch in stream:
                    assert not batch.canceled, batch.reason
                    if batch.events:
                        break
        assert [e.kv.key for e in batch.events] == [b"/t/b"]
        assert client.tokens is not None and client.tokens.authentications == 1
    finally:
        await client.aclose()


async def test_a_wrong_password_is_refused_and_never_shown(etcd_auth: EtcdProcess) -> None:
    client = _client(etcd_auth.url, None, credentials=EtcdCredentials("ack", "wrong-pw"))
    try:
        with pytest.raises(EtcdAuthFailed, match="authentication failed") as caught:
            await client.put(b"/t/a", b"1")
        assert "wrong-pw" not in str(caught.value)
    finally:
        await client.aclose()


async def test_without_a_user_etcd_with_auth_refuses(etcd_auth: EtcdProcess) -> None:
    client = _client(etcd_auth.url, None)
    try:
        with pytest.raises(EtcdError, match="user name is empty"):
            await client.put(b"/t/a", b"1")
    finally:
        await client.aclose()


async def test_a_token_lost_with_an_etcd_restart_is_renewed_once_and_the_call_made(etcd_auth: EtcdProcess) -> None:
    """etcd keeps its simple tokens in memory: after a restart it refuses the old one.
    The put refused for it was not applied; the client authenticates again and makes
    it, once (the key's version says it was written once)."""
    client = _client(etcd_auth.url, None, credentials=EtcdCredentials("ack", PASSWORD))
    try:
        await client.put(b"/t/a", b"1")
        assert client.tokens is not None
        old = await client.current_token()
        assert old is not None
        await trio.to_thread.run_sync(etcd_auth.stop)
        await trio.to_thread.run_sync(etcd_auth.start)
        await client.put(b"/t/b", b"2")
        assert client.tokens.authentications == 2
        new = await client.current_token()
        assert new is not None and new.value != old.value
        _, kv = await client.get(b"/t/b")
        assert kv is not None and kv.value == b"2" and kv.version == 1
    finally:
        await client.aclose()


async def test_a_watch_cancelled_for_its_token_gets_a_new_one_next_time(etcd_auth: EtcdProcess) -> None:
    client = _client(etcd_auth.url, None, credentials=EtcdCredentials("ack", PASSWORD))
    try:
        start = await client.put(b"/t/a", b"1")
        await trio.to_thread.run_sync(etcd_auth.stop)
        await trio.to_thread.run_sync(etcd_auth.start)
        # the old token, on a watch: etcd cancels it, saying why
        async with client.watch(b"/t/", start) as stream:
            with trio.fail_after(10):
                batch = await stream.__anext__()
        assert batch.canceled and token_refused(batch.reason)
        assert client.tokens is not None and client.tokens.authentications == 1
        async with client.watch(b"/t/", start) as stream:
            with trio.fail_after(10):
                batch = await stream.__anext__()
        assert not batch.canceled and client.tokens.authentications == 2
    finally:
        await client.aclose()


async def test_an_expired_simple_token_is_renewed(tmp_path: Path) -> None:
    """etcd drops a simple token unused for --auth-token-ttl seconds; the next call is
    refused for it, and the client renews it and makes the call."""
    require_etcd()
    with EtcdProcess(tmp_path / "etcd", extra=("--auth-token", "simple", "--auth-token-ttl", "1")) as etcd:
        etcd.enable_auth("root-pw", {"ack": (PASSWORD, "/t/")})
        client = _client(etcd.url, None, credentials=EtcdCredentials("ack", PASSWORD))
        try:
            await client.put(b"/t/a", b"1")
            token = await client.current_token()
            assert token is not None and token.value is not None

            def refused() -> bool:
                status, answer = etcd.call("/v3/kv/range", {"key": "L3Qv"}, token=token.value)
                return status == 401 and token_refused(str(answer.get("message")))

            # each look uses the token, which keeps it alive: look less often than the TTL
            with trio.fail_after(20):
                await trio.sleep(2)
                while not await trio.to_thread.run_sync(refused):
                    await trio.sleep(2)
            await client.put(b"/t/a", b"2")
            assert client.tokens is not None and client.tokens.authentications == 2
        finally:
            await client.aclose()

"""Authentication: every route but the public ones needs credentials once a user
exists; Basic and Bearer; 401 with challenges; failed logins limited per address and
user name, and per address; per-user caps; users and tokens over REST."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio

from broker.api import PUBLIC_ROUTES
from broker.app import BrokerApp
from broker.http import Limits
from broker.runtime import RuntimeOptions
from tests.support.app import open_broker_app
from tests.support.channel import Clients, wait_until
from tests.support.http import HTTPClient, assert_error, open_tcp_client
from tests.support.security import ALL, add_user, basic, bearer


@pytest.fixture
async def secured(broker_app: BrokerApp) -> BrokerApp:
    """The broker with an administrator ``admin`` (password ``secret``)."""
    add_user(broker_app.runtime.core, "admin", tags=("administrator",))
    await broker_app.runtime.wait_durable()
    return broker_app


def concrete(pattern: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", pattern)


async def test_the_route_walk_every_route_but_the_public_ones_needs_credentials(secured: BrokerApp) -> None:
    router = secured.router
    routes = list(router.routes())
    assert len(routes) > 30
    public = {(r.method, r.pattern) for r in routes if r.public}
    assert public == PUBLIC_ROUTES
    async with open_tcp_client(secured.port) as client:
        for route in routes:
            # (the UI's files are real names; "/" and "/ui" redirect to "/ui/")
            path = "/ui/app.js" if route.pattern == "/ui/{file}" else concrete(route.pattern)
            reply = await client.request(route.method, path)
            if (route.method, route.pattern) in PUBLIC_ROUTES:
                assert reply.status == (302 if route.pattern in ("/", "/ui") else 200), route
                continue
            assert reply.status == 401, (route, reply.status, reply.body)
            challenges = reply.headers["www-authenticate"]
            assert 'Basic realm="ackbus"' in challenges and "Bearer" in challenges
            if route.method != "HEAD":
                # RabbitMQ's body under /api/ (docs/management-api.md), ackbus's elsewhere
                if route.pattern.startswith("/api/"):
                    assert reply.json()["error"] == "not_authorized" and reply.json()["reason"], route
                else:
                    assert reply.json()["error"] == "unauthorized", route


async def test_without_users_nothing_needs_credentials(client: HTTPClient) -> None:
    assert (await client.put("/queues/q", json={})).status == 201
    assert (await client.get("/whoami")).json() == {"name": None, "tags": [], "authenticated": False}


async def test_basic_and_bearer_credentials_are_accepted(secured: BrokerApp, client: HTTPClient) -> None:
    admin = basic("admin", "secret")
    reply = await client.get("/whoami", headers=admin)
    assert reply.status == 200 and reply.json()["name"] == "admin" and reply.json()["authenticated"]
    made = await client.post("/users/admin/tokens", json={"description": "ci"}, headers=admin)
    assert made.status == 201
    token = made.json()["token"]
    assert token.startswith("ackbus_") and made.json()["id"] in token
    assert (await client.get("/whoami", headers=bearer(token))).json()["name"] == "admin"
    listed = (await client.get("/users/admin/tokens", headers=admin)).json()["tokens"]
    assert [t["description"] for t in listed] == ["ci"] and "token" not in listed[0] and "digest" not in listed[0]
    # revoked: refused at once
    assert (await client.delete(f"/tokens/{made.json()['id']}", headers=admin)).status == 200
    assert_error(await client.get("/whoami", headers=bearer(token)), 401, "unauthorized")


@pytest.mark.parametrize(
    "headers",
    [
        [],
        basic("admin", "wrong"),
        basic("nobody", "secret"),
        [("Authorization", "Basic !!!")],
        [("Authorization", "Digest x")],
        bearer("ackbus_0123456789abcdef_nope"),
        bearer("garbage"),
    ],
)
async def test_missing_or_wrong_credentials_get_401(secured: BrokerApp, client: HTTPClient, headers: Any) -> None:
    reply = await client.get("/queues", headers=headers)
    assert_error(reply, 401, "unauthorized")
    assert "Basic" in reply.headers["www-authenticate"]


async def test_an_expired_token_is_refused(secured: BrokerApp, client: HTTPClient) -> None:
    made = (await client.post("/users/admin/tokens", json={"expires_in_s": 60}, headers=basic("admin", "secret"))).json()
    assert made["expires_s"] is not None
    assert (await client.get("/whoami", headers=bearer(made["token"]))).status == 200
    secured.runtime.core.users.tokens[made["id"]].expires_s = secured.runtime.core.wall_clock() - 1
    assert_error(await client.get("/whoami", headers=bearer(made["token"])), 401, "unauthorized")


async def test_a_password_change_takes_effect_at_once(secured: BrokerApp, client: HTTPClient) -> None:
    admin = basic("admin", "secret")
    assert (await client.get("/whoami", headers=admin)).status == 200  # cached now
    reply = await client.put("/users/admin", json={"password": "other", "tags": ["administrator"]}, headers=admin)
    assert reply.status == 200 and reply.json()["permissions"] == ALL  # kept
    assert_error(await client.get("/whoami", headers=admin), 401, "unauthorized")
    assert (await client.get("/whoami", headers=basic("admin", "other"))).status == 200


async def test_user_management_needs_the_administrator_tag(secured: BrokerApp, client: HTTPClient) -> None:
    admin = basic("admin", "secret")
    reply = await client.put(
        "/users/bob", json={"password": "pw", "permissions": {"read": "^jobs$"}}, headers=admin
    )
    assert reply.status == 201, reply.body
    assert reply.json() == {
        "name": "bob", "tags": [], "permissions": {"configure": "", "write": "", "read": "^jobs$"}, "has_password": True,
    }
    bob = basic("bob", "pw")
    for method, target, body in [
        ("GET", "/users", None),
        ("PUT", "/users/eve", {"password": "x"}),
        ("DELETE", "/users/admin", None),
        ("PUT", "/users/bob/permissions", ALL),
        ("GET", "/users/admin", None),
        ("POST", "/users/admin/tokens", {}),
    ]:
        kw = {"json": body} if body is not None else {}
        assert_error(await client.request(method, target, headers=bob, **kw), 403, "access_refused")
    # but bob sees himself and makes his own tokens
    assert (await client.get("/users/bob", headers=bob)).status == 200
    assert (await client.post("/users/bob/tokens", json={}, headers=bob)).status == 201
    # invalid input is refused cleanly
    assert_error(await client.put("/users/a:b", json={"password": "x"}, headers=admin), 400, "invalid_argument")
    assert_error(await client.put("/users/carol", json={"tags": []}, headers=admin), 400, "invalid_argument")
    assert_error(
        await client.put("/users/carol", json={"password": "x", "permissions": {"read": "("}}, headers=admin),
        400, "invalid_argument",
    )
    assert secured.runtime.core.users.get("carol") is None
    assert (await client.delete("/users/bob", headers=admin)).status == 200
    assert_error(await client.get("/whoami", headers=bob), 401, "unauthorized")


async def test_deleting_the_last_user_of_a_loopback_broker_reopens_it(secured: BrokerApp, client: HTTPClient) -> None:
    assert (await client.delete("/users/admin", headers=basic("admin", "secret"))).status == 200
    assert (await client.get("/queues")).status == 200


async def test_a_broker_beyond_loopback_without_users_refuses_everything(secured: BrokerApp, client: HTTPClient) -> None:
    secured.loopback_only = False  # as if it listened on 0.0.0.0 (and its last user went)
    assert (await client.delete("/users/admin", headers=basic("admin", "secret"))).status == 200
    reply = await client.get("/queues")
    assert_error(reply, 401, "unauthorized")
    assert "users add" in reply.json()["message"]
    assert (await client.get("/healthz")).status == 200


# -- abuse limits ---------------------------------------------------------------------


@pytest.fixture
def broker_options() -> RuntimeOptions:
    return RuntimeOptions(
        data_dir=None, auth_failure_limit=3, max_channels_per_user=2, max_consumers_per_user=2, max_connections_per_user=3
    )


async def test_failed_logins_are_limited_per_address_while_a_verified_client_is_served(
    secured: BrokerApp, client: HTTPClient, caplog: pytest.LogCaptureFixture
) -> None:
    good = basic("admin", "secret")
    assert (await client.get("/whoami", headers=good)).status == 200
    for _ in range(3):
        assert_error(await client.get("/queues", headers=basic("admin", "guess")), 401, "unauthorized")
    refused = await client.get("/queues", headers=basic("admin", "guess"))
    assert_error(refused, 429, "too_many_failures")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    # not checked at all meanwhile, even when right: the attacker learns nothing...
    assert_error(await client.get("/queues", headers=basic("admin", "other-guess")), 429, "too_many_failures")
    # ...while the client that had authenticated goes on being served
    assert (await client.get("/queues", headers=good)).status == 200
    assert secured.auth.failed == 3 and secured.auth.refused == 2
    failures = [r for r in caplog.records if r.getMessage() == "authentication failed"]
    assert len(failures) == 3
    for record in failures:
        assert "guess" not in str(record.__dict__)  # the secret is never logged
        assert record.__dict__["fields"]["user"] == "admin"


async def test_one_name_locked_out_from_an_address_leaves_other_users_from_it_served(
    secured: BrokerApp, client: HTTPClient
) -> None:
    """Behind a proxy or NAT every user shares one address: an attacker guessing
    admin's password locks out admin from there, not everyone."""
    add_user(secured.runtime.core, "svc", "svc-password")
    await secured.runtime.wait_durable()
    for _ in range(3):
        assert_error(await client.get("/queues", headers=basic("admin", "guess")), 401, "unauthorized")
    assert_error(await client.get("/queues", headers=basic("admin", "secret")), 429, "too_many_failures")
    # another user's first (never verified) login from the same address still succeeds
    assert (await client.get("/whoami", headers=basic("svc", "svc-password"))).json()["name"] == "svc"
    # and so does a wrong one for it, counted for svc alone
    assert_error(await client.get("/queues", headers=basic("svc", "guess")), 401, "unauthorized")
    assert secured.auth.failed == 4 and secured.auth.refused == 1


async def test_many_names_from_one_address_hit_the_higher_address_cap(secured: BrokerApp, client: HTTPClient) -> None:
    """One address trying many names is stopped by the per-address cap, 10 times the
    per-name one (tokens of made-up ids: failures that cost no password hash)."""
    add_user(secured.runtime.core, "svc", "svc-password")
    await secured.runtime.wait_durable()
    cap = 3 * 10
    for i in range(cap):
        reply = await client.get("/queues", headers=bearer(f"ackbus_{i:016x}_not-a-secret"))
        assert_error(reply, 401, "unauthorized")
    refused = await client.get("/whoami", headers=basic("svc", "svc-password"))
    assert_error(refused, 429, "too_many_failures")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert secured.auth.failed == cap and secured.auth.refused == 1


async def test_the_failure_window_slides() -> None:
    from broker.api.auth import FailureLimiter

    limiter = FailureLimiter(2, 60.0)
    assert limiter.retry_after_s("a", 0.0) is None
    limiter.record("a", 0.0)
    limiter.record("a", 10.0)
    assert limiter.retry_after_s("a", 11.0) == pytest.approx(49.0)
    assert limiter.retry_after_s("b", 11.0) is None  # per address
    assert limiter.retry_after_s("a", 60.5) is None  # the first failure left the window


async def test_per_user_channel_and_consumer_caps(secured: BrokerApp) -> None:
    core = secured.runtime.core
    creds = add_user(core, "svc")
    await secured.runtime.wait_durable()
    async with Clients(secured.port) as clients:
        ch1 = await clients.channel(headers=creds)
        ch2 = await clients.channel(headers=creds)
        # a third channel of the same user: refused before it opens
        status, body = await clients.rest("POST", "/channel", b"", headers=creds)
        assert status == 429 and body["error"] == "resource_limit"
        # another user is still served
        other = await clients.channel(headers=basic("admin", "secret"))
        await ch1.ok({"op": "declare_queue", "queue": "q", "id": 1})
        assert (await ch1.call({"op": "consume", "queue": "q", "id": 2}))["ev"] == "consume_ok"
        assert (await ch2.call({"op": "consume", "queue": "q", "id": 3}))["ev"] == "consume_ok"
        # a stream is a consumer too
        stream = await clients.stream("q", headers=creds)
        assert stream.status == 429
        assert (await other.call({"op": "consume", "queue": "q", "id": 5}))["ev"] == "consume_ok"
        refused = await ch2.call({"op": "consume", "queue": "q", "id": 4})
        assert refused["ev"] == "error" and refused["error"] == "resource_limit"
        # the channel error ended ch2 and its consumer: room for a stream again
        await wait_until(lambda: secured.auth.principal("svc").usage.channels == {ch1.channel_id})
        stream = await clients.stream("q", headers=creds)
        assert stream.status == 200
        await ch1.ok({"op": "close"})


async def test_per_user_connections_cap(secured: BrokerApp) -> None:
    core = secured.runtime.core
    creds = add_user(core, "svc")
    await secured.runtime.wait_durable()
    core.declare_queue("q")

    async def long_poll(client: HTTPClient) -> None:
        await client.post("/queues/q/get?wait=30", headers=creds)

    clients = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            c = HTTPClient(lambda: trio.open_tcp_stream("127.0.0.1", secured.port))
            clients.append(c)
            nursery.start_soon(long_poll, c)
        await wait_until(lambda: secured.auth.principal("svc").usage.requests >= 3)
        async with open_tcp_client(secured.port) as client:
            refused = await client.post("/queues/q/get", headers=creds)
            assert_error(refused, 429, "resource_limit")
            assert (await client.get("/queues", headers=basic("admin", "secret"))).status == 200
        nursery.cancel_scope.cancel()
    for c in clients:
        await c.aclose()


async def test_connection_flood_from_one_address_leaves_room_for_others() -> None:
    limits = Limits(max_connections_per_address=3, linger_s=0.2)
    async with open_broker_app(limits) as app:
        streams = [await trio.open_tcp_stream("127.0.0.1", app.port) for _ in range(3)]
        try:
            flood = await trio.open_tcp_stream("127.0.0.1", app.port)
            await flood.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer:
                data = await flood.receive_some(4096)
                if not data:
                    break
                answer += data
            assert answer.startswith(b"HTTP/1.1 503"), answer
            await flood.aclose()
            # another address (127.0.0.2 is loopback too) is served
            async with await _connect_from("127.0.0.2", app.port) as other:
                await other.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                reply = await other.receive_some(4096)
                assert reply.startswith(b"HTTP/1.1 200"), reply
        finally:
            for s in streams:
                await s.aclose()


async def _connect_from(source: str, port: int) -> trio.SocketStream:
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


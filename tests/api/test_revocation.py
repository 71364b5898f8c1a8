"""Revoked credentials stop consuming (docs/security.md, "Revocation"): deleting a
user or revoking a token ends the open channels, streams and long-poll gets that
authenticated with them (``credentials_revoked``); revoking ``read`` on a queue
cancels the consumers, streams and long polls of that queue (``access_refused``). In
each case none of the messages published after the change reaches the user."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from broker.app import BrokerApp
from tests.support.channel import ChannelEnded, Clients, wait_until
from tests.support.http import HTTPClient, open_tcp_client
from tests.support.security import add_user, basic, bearer

ADMIN = basic("admin", "secret")
#: What svc may do: consume q, publish through the default exchange.
SVC_PERMISSIONS = {"configure": "", "write": r"^amq\.default$", "read": "^q$"}
AFTER = 5  # messages published after the change


class Setup:
    """A broker with ``admin``, ``svc`` and a queue ``q``; ``svc`` logs in with a
    password, or (``how == "token"``) with a token made over REST."""

    def __init__(self, app: BrokerApp, client: HTTPClient, how: str) -> None:
        self.app = app
        self.client = client
        self.how = how
        self.creds: list[tuple[str, str]] = []
        self.token_id = ""

    async def start(self) -> None:
        core = self.app.runtime.core
        add_user(core, "admin", tags=("administrator",))
        password = add_user(core, "svc", permissions=SVC_PERMISSIONS)
        core.declare_queue("q")
        await self.app.runtime.wait_durable()
        self.creds = password
        if self.how == "token":
            reply = await self.client.post("/users/svc/tokens", json={}, headers=ADMIN)
            assert reply.status == 201, reply.body
            self.token_id, self.creds = reply.json()["id"], bearer(reply.json()["token"])

    async def change(self) -> None:
        """Revoke, as an administrator does, over REST."""
        if self.how == "delete":
            reply = await self.client.delete("/users/svc", headers=ADMIN)
        elif self.how == "token":
            reply = await self.client.delete(f"/tokens/{self.token_id}", headers=ADMIN)
        else:
            reply = await self.client.put("/users/svc/permissions", json={**SVC_PERMISSIONS, "read": ""}, headers=ADMIN)
        assert reply.status == 200, reply.body

    async def publish(self, count: int) -> None:
        for i in range(count):
            reply = await self.client.post("/exchanges/amq.default/publish?routing_key=q", body=f"m{i}".encode(), headers=ADMIN)
            assert reply.json() == {"confirm": "ack", "routed": 1}

    @property
    def code(self) -> str:
        return "access_refused" if self.how == "read" else "credentials_revoked"


HOW = ["delete", "token", "read"]


@pytest.fixture
async def admin_client(broker_app: BrokerApp) -> Any:
    async with open_tcp_client(broker_app.port) as client:
        yield client


@pytest.mark.parametrize("how", HOW)
async def test_a_channel_consumer(broker_app: BrokerApp, admin_client: HTTPClient, how: str) -> None:
    s = Setup(broker_app, admin_client, how)
    await s.start()
    core = broker_app.runtime.core
    async with Clients(broker_app.port) as clients:
        ch = await clients.channel(headers=s.creds)
        await ch.ok({"op": "consume", "queue": "q", "consumer_tag": "c"})
        await s.publish(1)
        assert (await ch.expect("deliver"))["message"]["body"] == "m0"
        await s.change()
        await s.publish(AFTER)
        if how == "read":
            # the consumer is cancelled, saying why; the channel goes on
            cancel = await ch.expect("cancel", consumer_tag="c")
            assert "read permission on queue 'q' was revoked" in cancel["reason"]
            events = await ch.sync()
            assert not [e for e in events if e["ev"] == "deliver"], events
            await ch.send({"op": "publish", "exchange": "", "routing_key": "q", "body": "still allowed"})
            await ch.expect("ack")
            await ch.ok({"op": "close"})
            expected_ready = AFTER + 2  # and m0, never acked, back in the queue
        else:
            events = await ch.remaining_events()  # the channel ends
            assert not [e for e in events if e["ev"] == "deliver"], events
            assert events[-1]["ev"] == "error" and events[-1]["error"] == "credentials_revoked", events
            assert ("deleted" if how == "delete" else "revoked") in events[-1]["message"]
            expected_ready = AFTER + 1  # m0, never acked, is back in the queue too
        await wait_until(lambda: len(core.channels) == 1)  # (the REST channel)
    assert core.queues["q"].ready_count() == expected_ready


@pytest.mark.parametrize("how", HOW)
async def test_a_stream(broker_app: BrokerApp, admin_client: HTTPClient, how: str) -> None:
    s = Setup(broker_app, admin_client, how)
    await s.start()
    core = broker_app.runtime.core
    async with Clients(broker_app.port) as clients:
        stream = await clients.stream("q", headers=s.creds)
        assert stream.status == 200
        await s.publish(1)
        assert (await stream.next_item())["body"] == "m0"
        await s.change()
        await s.publish(AFTER)
        last = await stream.next_item()
        assert last["ev"] == "closing" and last["error"] == s.code, last
        assert "revoked" in last["reason"] or "deleted" in last["reason"]
        with pytest.raises(ChannelEnded):
            await stream.next_item()
        await wait_until(lambda: len(core.channels) == 1)
    assert core.queues["q"].ready_count() == AFTER  # m0 was acked once written (ack=auto)


@pytest.mark.parametrize("how", HOW)
async def test_a_long_poll_get(broker_app: BrokerApp, admin_client: HTTPClient, how: str) -> None:
    s = Setup(broker_app, admin_client, how)
    await s.start()
    core = broker_app.runtime.core
    answer: list[Any] = []

    async def long_poll() -> None:
        async with open_tcp_client(broker_app.port) as poller:
            answer.append(await poller.post("/queues/q/get?wait=60", headers=s.creds))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_poll)
            await wait_until(lambda: core.queues["q"].getters == 1)
            await s.change()
            await wait_until(lambda: bool(answer))
    reply = answer[0]
    assert reply.status == (403 if how == "read" else 401), reply.body
    assert reply.json()["error"] == s.code
    await s.publish(AFTER)
    assert core.queues["q"].ready_count() == AFTER  # nothing leased to the poller


async def test_revoking_a_token_leaves_the_users_other_logins_open(
    broker_app: BrokerApp, admin_client: HTTPClient
) -> None:
    s = Setup(broker_app, admin_client, "token")
    await s.start()
    async with Clients(broker_app.port) as clients:
        by_token = await clients.channel(headers=s.creds)
        by_password = await clients.channel(headers=basic("svc", "secret"))
        await by_password.ok({"op": "consume", "queue": "q", "consumer_tag": "p"})
        await s.change()
        assert (await by_token.remaining_events())[-1]["error"] == "credentials_revoked"
        await s.publish(1)
        assert (await by_password.expect("deliver"))["message"]["body"] == "m0"
        await by_password.ok({"op": "close"})

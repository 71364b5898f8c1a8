"""The validated user id over REST and the HTTP channel (broker/api/userid.py): a
publish's ``user_id``, when set, must be the caller's user name (a token's user for
a token; ``guest`` where no users exist), as AMQP and the management API check it.
A refused publish enqueues nothing; a peer's forwarding channel is not re-checked."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.app import MemoryBroker
from tests.support.channel import ChannelClient, open_channel
from tests.support.http import HTTPClient, assert_error
from tests.support.memory_fixtures import api, broker  # noqa: F401 (fixtures)
from tests.support.security import add_user, bearer

FORGED = "user_id property set to 'admin' but authenticated user was '{}'"


async def rest_publish(api: HTTPClient, user_id: str, headers: Any = ()) -> Any:
    return await api.post(
        "/exchanges/amq.default/publish?routing_key=q", body=b"x", headers=[("X-User-Id", user_id), *headers]
    )


async def ready(api: HTTPClient, headers: Any = ()) -> int:
    return int((await api.get("/queues/q", headers=list(headers))).json()["messages_ready"])


async def channel(broker: MemoryBroker, headers: Any = ()) -> ChannelClient:  # noqa: F811
    return await open_channel(broker.connect(), headers=list(headers))


async def test_rest_without_users_takes_guest_and_refuses_another(api: HTTPClient) -> None:
    await api.put("/queues/q")
    assert (await rest_publish(api, "guest")).json()["routed"] == 1
    body = assert_error(await rest_publish(api, "admin"), 400, "invalid_argument")
    assert body["message"] == FORGED.format("guest")
    assert await ready(api) == 1
    got = (await api.post("/queues/q/get")).json()["messages"]
    assert got[0]["properties"]["user_id"] == "guest"


async def test_rest_with_a_user_and_with_the_users_token(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    app = add_user(broker.runtime.core, "app")
    await broker.runtime.wait_durable()
    assert (await api.put("/queues/q", headers=app)).status == 201
    assert (await rest_publish(api, "app", app)).json()["routed"] == 1
    assert assert_error(await rest_publish(api, "admin", app), 400, "invalid_argument")["message"] == FORGED.format("app")
    assert assert_error(await rest_publish(api, "guest", app), 400, "invalid_argument")
    token = (await api.post("/users/app/tokens", json={}, headers=app)).json()["token"]
    assert (await rest_publish(api, "app", bearer(token))).json()["routed"] == 1
    reply = await rest_publish(api, "admin", bearer(token))
    assert assert_error(reply, 400, "invalid_argument")["message"] == FORGED.format("app")
    assert await ready(api, app) == 2


@pytest.mark.parametrize("headers", [False, True], ids=["typed", "general"])
async def test_channel_publish(broker: MemoryBroker, api: HTTPClient, headers: bool) -> None:  # noqa: F811
    """Both publish paths (a publish with headers takes the general one): the
    caller's name passes, another is the channel's error, nothing of it enqueued."""
    await api.put("/queues/q")
    extra: dict[str, Any] = {"headers": {"h": 1}} if headers else {}
    ch = await channel(broker)
    await ch.send({"op": "publish", "routing_key": "q", "body": "a", "properties": {"user_id": "guest", **extra}})
    await ch.expect("ack")
    await ch.send({"op": "publish", "routing_key": "q", "body": "b", "id": 9,
                   "properties": {"user_id": "admin", **extra}})
    error = await ch.expect("error")
    assert (error["error"], error["message"], error["id"]) == ("invalid_argument", FORGED.format("guest"), 9)
    await ch.aclose()
    assert await ready(api) == 1


async def test_channel_publish_in_a_transaction_refused_at_publish(broker: MemoryBroker, api: HTTPClient) -> None:  # noqa: F811
    app = add_user(broker.runtime.core, "app")
    await broker.runtime.wait_durable()
    await api.put("/queues/q", headers=app)
    ch = await channel(broker, app)
    await ch.ok({"op": "tx_select"})
    await ch.send({"op": "publish", "routing_key": "q", "body": "a", "properties": {"user_id": "app"}})
    await ch.send({"op": "publish", "routing_key": "q", "body": "b", "properties": {"user_id": "admin"}})
    error = await ch.expect("error")
    assert (error["error"], error["message"]) == ("invalid_argument", FORGED.format("app"))
    await ch.aclose()
    assert await ready(api, app) == 0  # the channel ended: its transaction with it


async def test_a_users_channel_calling_itself_forwarded_is_still_checked(broker: MemoryBroker) -> None:  # noqa: F811
    """Only a node's forwarding channel (cluster secret: no principal) is exempt; a
    user's channel with the forwarding header is checked like any other."""
    app = add_user(broker.runtime.core, "app")
    await broker.runtime.wait_durable()
    ch = await channel(broker, [*app, ("X-Ackbus-Forwarded", "a")])
    await ch.send({"op": "publish", "routing_key": "q", "body": "b", "properties": {"user_id": "admin"}})
    assert (await ch.expect("error"))["message"] == FORGED.format("app")
    await ch.aclose()


async def test_a_forwarding_channel_carries_the_entry_nodes_user_id(broker: MemoryBroker, api: HTTPClient) -> None:  # noqa: F811
    """A peer's forwarding channel (no users here: no principal) publishes what its
    node checked, the stored user_id of dead letters too: not checked again."""
    await api.put("/queues/q")
    ch = await channel(broker, [("X-Ackbus-Forwarded", "a")])
    await ch.send({"op": "publish", "routing_key": "q", "body": "b", "properties": {"user_id": "alice"}})
    await ch.expect("ack")
    await ch.aclose()
    assert await ready(api) == 1


async def test_a_schedules_user_id_is_its_makers(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    """A schedule publishes later as the broker: its messages' user_id is checked when
    it is made, against who makes it."""
    app = add_user(broker.runtime.core, "app")
    await broker.runtime.wait_durable()
    definition: dict[str, Any] = {"exchange": "amq.default", "routing_key": "q", "body": "b", "interval_s": 60}
    reply = await api.put("/schedules/s", json={**definition, "properties": {"user_id": "admin"}}, headers=app)
    assert assert_error(reply, 400, "invalid_argument")["message"] == FORGED.format("app")
    assert (await api.get("/schedules", headers=app)).json()["schedules"] == []
    reply = await api.put("/schedules/s", json={**definition, "properties": {"user_id": "app"}}, headers=app)
    assert reply.status == 200, reply.body

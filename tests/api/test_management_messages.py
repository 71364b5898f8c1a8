"""The management API's publish and get (broker/api/management/messages.py):
RabbitMQ's bodies, each ackmode's effect on the queue, payload encodings,
truncation, and refusals that publish or take nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.app import MemoryBroker
from tests.support.http import HTTPClient
from tests.support.memory_fixtures import api, broker  # noqa: F401 (fixtures)
from tests.support.security import add_user


async def publish(api: HTTPClient, routing_key: str, payload: str, *, exchange: str = "amq.default",
                  encoding: str = "string", properties: Any = None) -> Any:
    reply = await api.post(f"/api/exchanges/%2F/{exchange}/publish", json={
        "properties": properties if properties is not None else {}, "routing_key": routing_key,
        "payload": payload, "payload_encoding": encoding,
    })
    return reply


async def get(api: HTTPClient, queue: str, count: int, ackmode: str, encoding: str = "auto", **more: Any) -> Any:
    reply = await api.post(f"/api/queues/%2F/{queue}/get",
                           json={"count": count, "ackmode": ackmode, "encoding": encoding, **more})
    assert reply.status == 200, reply.body
    return reply.json()


async def ready(api: HTTPClient, queue: str) -> int:
    return int((await api.get(f"/api/queues/%2F/{queue}")).json()["messages_ready"])


async def test_publish_answers_routed(api: HTTPClient) -> None:
    await api.put("/api/queues/%2F/q", json={})
    assert (await publish(api, "q", "hello")).json() == {"routed": True}
    assert (await publish(api, "nowhere", "hello")).json() == {"routed": False}
    assert (await publish(api, "q", "aGk=", encoding="base64")).json() == {"routed": True}
    assert await ready(api, "q") == 2


async def test_get_shows_messages_as_rabbitmq_does(api: HTTPClient) -> None:
    await api.put("/api/queues/%2F/q", json={})
    props = {"delivery_mode": 2, "headers": {"h": 1}, "expiration": "60000", "priority": 3, "content_type": "text/plain"}
    await publish(api, "q", "hello")
    await publish(api, "q", "/w==", encoding="base64", properties=props)  # not UTF-8
    got = await get(api, "q", 5, "ack_requeue_true")
    assert got == [
        {"payload_bytes": 5, "redelivered": False, "exchange": "", "routing_key": "q", "message_count": 1,
         "properties": [], "payload": "hello", "payload_encoding": "string"},
        {"payload_bytes": 1, "redelivered": False, "exchange": "", "routing_key": "q", "message_count": 0,
         "properties": props, "payload": "/w==", "payload_encoding": "base64"},
    ]
    # requeued: both back, in order, redelivered
    again = await get(api, "q", 1, "ack_requeue_true", encoding="base64", truncate=2)
    assert [(m["payload"], m["payload_bytes"], m["redelivered"], m["message_count"]) for m in again] == [
        ("aGU=", 5, True, 1),
    ]
    assert await ready(api, "q") == 2


async def test_each_ackmode(api: HTTPClient) -> None:
    await api.put("/api/queues/%2F/dead", json={})
    await api.put("/api/queues/%2F/q", json={"arguments": {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}})
    for n in range(4):
        await publish(api, "q", f"m{n}")
    assert [m["payload"] for m in await get(api, "q", 1, "reject_requeue_true")] == ["m0"]
    assert await ready(api, "q") == 4
    assert [m["payload"] for m in await get(api, "q", 2, "ack_requeue_false")] == ["m0", "m1"]
    assert await ready(api, "q") == 2
    assert [m["payload"] for m in await get(api, "q", 1, "reject_requeue_false")] == ["m2"]
    assert await ready(api, "q") == 1 and await ready(api, "dead") == 1
    q = (await api.get("/api/queues/%2F/q")).json()
    assert q["messages_unacknowledged"] == 0 and q["message_stats"]["ack"] == 2
    assert [m["payload"] for m in await get(api, "q", 5, "ack_requeue_false")] == ["m3"]
    assert await get(api, "q", 5, "ack_requeue_false") == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"count": 1, "encoding": "auto"}, "[{key_missing,ackmode}]"),
        ({"count": 1, "ackmode": "bogus", "encoding": "auto"}, "ackmode"),
        ({"count": 1, "ackmode": "ack_requeue_true", "encoding": "xx"}, "Unsupported encoding. Please use auto or base64."),
        ({"count": 0, "ackmode": "ack_requeue_true", "encoding": "auto"}, "count"),
        ({"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": -1}, "truncate"),
    ],
)
async def test_bad_gets_take_nothing(api: HTTPClient, body: dict[str, Any], reason: str) -> None:
    await api.put("/api/queues/%2F/q", json={})
    await publish(api, "q", "x")
    reply = await api.post("/api/queues/%2F/q/get", json=body)
    assert reply.status == 400 and reply.json()["error"] == "bad_request" and reason in reply.json()["reason"]
    q = (await api.get("/api/queues/%2F/q")).json()
    assert (q["messages_ready"], q["message_stats"]["deliver_get"]) == (1, 0)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"payload_encoding": None}, "[{key_missing,payload_encoding}]"),
        ({"properties": None}, "[{key_missing,properties}]"),
        ({"payload_encoding": "bogus"}, "payload_encoding"),
        ({"payload_encoding": "base64", "payload": "%%%"}, "base64"),
        ({"properties": {"expiration": "soon"}}, "expiration"),
        ({"properties": {"priority": 900}}, "priority"),
        ({"properties": {"no_such": 1}}, "no_such"),
    ],
)
async def test_bad_publishes_publish_nothing(api: HTTPClient, change: dict[str, Any], reason: str) -> None:
    await api.put("/api/queues/%2F/q", json={})
    body: dict[str, Any] = {"properties": {}, "routing_key": "q", "payload": "x", "payload_encoding": "string"}
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    reply = await api.post("/api/exchanges/%2F/amq.default/publish", json=body)
    assert reply.status == 400 and reply.json()["error"] == "bad_request" and reason in reply.json()["reason"]
    assert await ready(api, "q") == 0


async def test_publish_user_id_must_be_the_callers(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    """As RabbitMQ checks a publish's ``user_id`` (and ackbus's AMQP does): a message
    cannot claim another user; the caller's own name, or guest on a broker without
    users, passes."""
    await api.put("/api/queues/%2F/q", json={})
    assert (await publish(api, "q", "x", properties={"user_id": "guest"})).json() == {"routed": True}
    reply = await publish(api, "q", "x", properties={"user_id": "admin"})
    assert reply.status == 400 and reply.json()["error"] == "bad_request"
    assert "user_id property set to 'admin' but authenticated user was 'guest'" in reply.json()["reason"]
    app = add_user(broker.runtime.core, "app")
    await broker.runtime.wait_durable()
    body = {"properties": {"user_id": "admin"}, "routing_key": "q", "payload": "x", "payload_encoding": "string"}
    reply = await api.post("/api/exchanges/%2F/amq.default/publish", json=body, headers=app)
    assert reply.status == 400 and "authenticated user was 'app'" in reply.json()["reason"]
    body["properties"] = {"user_id": "app"}
    assert (await api.post("/api/exchanges/%2F/amq.default/publish", json=body, headers=app)).json() == {"routed": True}
    got = (await api.post("/api/queues/%2F/q/get", headers=app,
                          json={"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"})).json()
    assert [m["properties"] for m in got] == [{"user_id": "guest"}, {"user_id": "app"}]


async def test_publish_with_direct_reply_to_itself_is_refused(api: HTTPClient) -> None:
    """RabbitMQ refuses ``reply_to: amq.rabbitmq.reply-to`` here: the call has no
    consumer of its replies; a reply to a decoded name, or any other, is stored."""
    await api.put("/api/queues/%2F/q", json={})
    reply = await publish(api, "q", "x", properties={"reply_to": "amq.rabbitmq.reply-to"})
    assert (reply.status, reply.json()) == (
        400, {"error": "bad_request", "reason": "406 PRECONDITION_FAILED - fast reply consumer does not exist"},
    )
    assert await ready(api, "q") == 0
    for reply_to in ("amq.rabbitmq.reply-to.abc", "replies"):
        assert (await publish(api, "q", "x", properties={"reply_to": reply_to})).json() == {"routed": True}
    assert await ready(api, "q") == 2


async def test_publish_to_a_missing_exchange_and_get_from_a_missing_queue(api: HTTPClient) -> None:
    reply = await publish(api, "k", "x", exchange="nope")
    # RabbitMQ: 400, with the channel's 404 in the reason
    assert reply.status == 400 and reply.json()["reason"].startswith("404 NOT_FOUND")
    reply = await api.post("/api/queues/%2F/nope/get", json={"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert (reply.status, reply.json()) == (404, {"error": "Object Not Found", "reason": "Not Found"})


async def test_a_get_whose_settle_is_refused_returns_its_messages_at_once(
    api: HTTPClient, broker: MemoryBroker,  # noqa: F811
) -> None:
    await api.put("/api/queues/%2F/q", json={"durable": True})
    await publish(api, "q", "kept")
    core = broker.runtime.core
    core.storage_failed(core.last_lsn + 1, core.last_lsn + 1, "disk full")  # as the WAL reports it
    try:
        reply = await api.post("/api/queues/%2F/q/get", json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
        assert reply.status == 503 and "disk full" in reply.json()["reason"]
        # not held by a lease until it lapses: ready again now
        q = (await api.get("/api/queues/%2F/q")).json()
        assert (q["messages_ready"], q["messages_unacknowledged"]) == (1, 0)
    finally:
        core.storage_recovered()
    assert [m["payload"] for m in await get(api, "q", 1, "ack_requeue_false")] == ["kept"]


async def test_non_ascii_digits_are_not_numbers(api: HTTPClient) -> None:
    await api.put("/api/queues/%2F/q", json={})
    for body in ({"count": "²", "ackmode": "ack_requeue_true", "encoding": "auto"},
                 {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": "٣"}):
        reply = await api.post("/api/queues/%2F/q/get", json=body)
        assert reply.status == 400 and reply.json()["error"] == "bad_request", body

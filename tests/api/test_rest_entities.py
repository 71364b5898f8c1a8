"""REST calls on entities over real HTTP: health, overview, exchanges, queues, bindings.

Every call is checked for its status and JSON body, and every refusal for its error
code and for leaving the broker as it was.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.app import BrokerApp
from tests.support.http import HTTPClient, assert_error


async def names(client: HTTPClient, kind: str) -> set[str]:
    reply = await client.get(f"/{kind}")
    assert reply.status == 200
    return {item["name"] for item in reply.json()[kind]}


# -- health and overview -------------------------------------------------------


async def test_healthz_ready(client: HTTPClient) -> None:
    reply = await client.get("/healthz")
    assert reply.status == 200
    assert reply.json() == {
        "status": "ok", "ready": True, "storage_ok": True, "publishing_blocked": False, "memory_alarm": False
    }


async def test_healthz_while_recovering_and_writes_refused(
    client: HTTPClient, broker_app: BrokerApp
) -> None:
    broker_app.runtime.ready = False  # as during recovery
    reply = await client.get("/healthz")
    assert reply.status == 503
    assert reply.json() == {"status": "recovering", "ready": False}
    assert_error(await client.put("/queues/q"), 503, "not_ready")
    assert "q" not in broker_app.runtime.core.queues
    broker_app.runtime.ready = True
    assert (await client.put("/queues/q")).status == 201


async def test_healthz_head(client: HTTPClient) -> None:
    reply = await client.request("HEAD", "/healthz")
    assert reply.status == 200
    assert reply.body == b""


async def test_overview(client: HTTPClient) -> None:
    await client.put("/queues/q")
    await client.post("/exchanges/amq.default/publish?routing_key=q", body=b"x")
    body = (await client.get("/overview")).json()
    assert body["version"]
    assert body["build"] in ("interpreted", "compiled")  # which: tests/compiled
    assert body["ready"] is True
    assert body["uptime_s"] >= 0
    assert body["totals"]["queues"] == 1
    assert body["totals"]["messages_ready"] == 1
    assert body["stats"]["published"] == 1
    assert body["storage"]["enabled"] is False


# -- exchanges -------------------------------------------------------------------


async def test_declare_exchange_then_redeclare_equal_and_different(client: HTTPClient) -> None:
    spec = {"type": "topic", "durable": True, "auto_delete": False, "arguments": {}}
    reply = await client.put("/exchanges/events", json=spec)
    assert reply.status == 201
    assert reply.json() == {
        "name": "events",
        "type": "topic",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {},
    }
    again = await client.put("/exchanges/events", json=spec)
    assert again.status == 200
    assert again.json() == reply.json()

    body = assert_error(
        await client.put("/exchanges/events", json={**spec, "type": "fanout"}),
        409,
        "precondition_failed",
    )
    assert "other settings" in body["message"]
    assert (await client.get("/exchanges/events")).json()["type"] == "topic"


async def test_declare_exchange_defaults_to_durable_direct(client: HTTPClient) -> None:
    reply = await client.put("/exchanges/plain")
    assert reply.status == 201
    assert reply.json()["type"] == "direct"
    assert reply.json()["durable"] is True


async def test_passive_declare(client: HTTPClient) -> None:
    assert_error(await client.put("/exchanges/nope", json={"passive": True}), 404, "not_found")
    assert "nope" not in await names(client, "exchanges")
    await client.put("/exchanges/there", json={"type": "fanout"})
    reply = await client.put("/exchanges/there", json={"passive": True})
    assert reply.status == 200
    assert reply.json()["type"] == "fanout"


@pytest.mark.parametrize(
    "body, code",
    [
        ({"type": "round-robin"}, "invalid_argument"),
        ({"type": 5}, "invalid_argument"),
        ({"durable": "yes"}, "invalid_argument"),
        ({"auto_delete": 1}, "invalid_argument"),
        ({"arguments": []}, "invalid_argument"),
        ({"tpye": "direct"}, "invalid_argument"),
        ([], "invalid_argument"),
    ],
)
async def test_declare_exchange_bad_fields(client: HTTPClient, body: Any, code: str) -> None:
    assert_error(await client.put("/exchanges/x", json=body), 400, code)
    assert "x" not in await names(client, "exchanges")


async def test_declare_exchange_invalid_json(client: HTTPClient) -> None:
    body = assert_error(
        await client.put("/exchanges/x", body=b'{"type": "direct"', headers={"Content-Type": "application/json"}),
        400,
        "invalid_json",
    )
    assert "JSON" in body["message"]
    assert "x" not in await names(client, "exchanges")


async def test_reserved_exchange_names(client: HTTPClient) -> None:
    assert_error(await client.put("/exchanges/amq.mine"), 403, "access_refused")
    assert "amq.mine" not in await names(client, "exchanges")
    # The built-in ones exist: declaring them equal is fine, deleting them is not.
    assert (await client.put("/exchanges/amq.topic", json={"type": "topic"})).status == 200
    assert_error(await client.delete("/exchanges/amq.topic"), 403, "access_refused")
    assert "amq.topic" in await names(client, "exchanges")


async def test_default_exchange_alias(client: HTTPClient) -> None:
    assert "amq.default" in await names(client, "exchanges")
    reply = await client.get("/exchanges/amq.default")
    assert reply.status == 200
    assert reply.json()["name"] == "amq.default"
    assert reply.json()["type"] == "direct"
    assert (await client.put("/exchanges/amq.default")).status == 200
    assert_error(await client.put("/exchanges/amq.default", json={"type": "fanout"}), 403, "access_refused")
    assert_error(await client.delete("/exchanges/amq.default"), 403, "access_refused")


async def test_exchange_name_too_long(client: HTTPClient) -> None:
    assert_error(await client.put("/exchanges/" + "x" * 256), 400, "invalid_argument")
    assert (await client.put("/exchanges/" + "x" * 255)).status == 201


async def test_percent_encoded_name(client: HTTPClient) -> None:
    assert (await client.put("/exchanges/a%2Fb%20c")).status == 201
    assert "a/b c" in await names(client, "exchanges")
    assert (await client.get("/exchanges/a%2Fb%20c")).json()["name"] == "a/b c"


async def test_get_and_list_exchanges(client: HTTPClient) -> None:
    assert_error(await client.get("/exchanges/nope"), 404, "not_found")
    await client.put("/exchanges/logs", json={"type": "fanout", "durable": False})
    await client.put("/queues/q")
    await client.post("/bindings", json={"exchange": "logs", "queue": "q"})
    info = (await client.get("/exchanges/logs")).json()
    assert info["durable"] is False
    assert info["bindings"] == [{"exchange": "logs", "routing_key": "", "arguments": {}, "queue": "q"}]
    listed = (await client.get("/exchanges")).json()["exchanges"]
    assert {"amq.default", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "logs"} <= {
        x["name"] for x in listed
    }


async def test_delete_exchange(client: HTTPClient) -> None:
    await client.put("/exchanges/x")
    reply = await client.delete("/exchanges/x")
    assert reply.status == 200
    assert reply.json() == {"deleted": "x"}
    assert "x" not in await names(client, "exchanges")
    assert_error(await client.delete("/exchanges/x"), 404, "not_found")


async def test_delete_exchange_if_unused(client: HTTPClient) -> None:
    await client.put("/exchanges/x")
    await client.put("/queues/q")
    await client.post("/bindings", json={"exchange": "x", "queue": "q", "routing_key": "k"})
    assert_error(await client.delete("/exchanges/x?if_unused=true"), 409, "precondition_failed")
    assert len((await client.get("/bindings")).json()["bindings"]) == 1
    assert_error(await client.delete("/exchanges/x?if_unused=maybe"), 400, "invalid_argument")
    assert (await client.delete("/exchanges/x")).status == 200
    # ... and its bindings went with it.
    assert (await client.get("/bindings")).json()["bindings"] == []


# -- queues ----------------------------------------------------------------------


async def test_declare_queue_then_redeclare(client: HTTPClient) -> None:
    reply = await client.put("/queues/jobs", json={"durable": True, "arguments": {"x-max-length": 10}})
    assert reply.status == 201
    assert reply.json() == {
        "name": "jobs",
        "durable": True,
        "exclusive": False,
        "auto_delete": False,
        "arguments": {"x-max-length": 10},
        "messages": 0,
        "messages_ready": 0,
        "messages_unacked": 0,
        "messages_delayed": 0,
        "consumers": 0,
        "message_stats": {"published": 0, "delivered": 0, "acked": 0, "redelivered": 0, "dead_lettered": {}},
    }
    same = await client.put("/queues/jobs", json={"arguments": {"x-max-length": 10}})
    assert same.status == 200
    assert_error(await client.put("/queues/jobs", json={"durable": False, "arguments": {"x-max-length": 10}}), 409, "precondition_failed")
    assert_error(await client.put("/queues/jobs"), 409, "precondition_failed")
    assert (await client.get("/queues/jobs")).json()["arguments"] == {"x-max-length": 10}


@pytest.mark.parametrize(
    "body",
    [
        {"exclusive": True, "arguments": {"x-max-length": 10}},
        {"arguments": {"x-max-length": 10, "x-overflow": "bogus"}},
        {"arguments": {"x-max-length": 10, "x-unknown": 1}},
    ],
)
async def test_an_invalid_redeclaration_is_400_like_a_new_one(client: HTTPClient, body: dict[str, Any]) -> None:
    """Validated before compared: the same 400 whether the queue exists or not."""
    fresh = await client.put("/queues/fresh", json=body)
    assert fresh.status == 400, fresh.json()
    await client.put("/queues/jobs", json={"arguments": {"x-max-length": 10}})
    again = await client.put("/queues/jobs", json=body)
    assert again.status == 400 and again.json()["error"] == fresh.json()["error"], again.json()


@pytest.mark.parametrize(
    "body",
    [
        {"durable": "true"},
        {"exclusive": True},  # exclusive queues belong to a channel
        {"arguments": {"x-max-length": -1}},
        {"arguments": {"x-overflow": "explode"}},
        {"arguments": "x"},
        {"name": "q"},
        "q",
    ],
)
async def test_declare_queue_bad_fields(client: HTTPClient, body: Any) -> None:
    assert_error(await client.put("/queues/q", json=body), 400, "invalid_argument")
    assert await names(client, "queues") == set()


async def test_reserved_queue_names(client: HTTPClient) -> None:
    assert_error(await client.put("/queues/amq.q"), 403, "access_refused")
    assert_error(await client.put("/queues/amq.gen-1"), 403, "access_refused")
    assert await names(client, "queues") == set()


async def test_passive_queue_declare(client: HTTPClient) -> None:
    assert_error(await client.put("/queues/q", json={"passive": True}), 404, "not_found")
    await client.put("/queues/q")
    assert (await client.put("/queues/q", json={"passive": True})).status == 200


async def test_queue_stats(client: HTTPClient) -> None:
    await client.put("/queues/q")
    for body in (b"1", b"2", b"3"):
        await client.post("/exchanges/amq.default/publish?routing_key=q", body=body)
    leases = (await client.post("/queues/q/get")).json()["messages"]
    assert len(leases) == 1
    info = (await client.get("/queues/q")).json()
    assert info["messages"] == 3
    assert info["messages_ready"] == 2
    assert info["messages_unacked"] == 1
    assert info["consumers"] == 0
    assert info["message_stats"]["published"] == 3
    assert info["message_stats"]["delivered"] == 1
    listed = (await client.get("/queues")).json()["queues"]
    assert [q["name"] for q in listed] == ["q"]
    assert listed[0]["messages_ready"] == 2


async def test_consumers_count_and_delete_if_unused(client: HTTPClient) -> None:
    await client.put("/queues/q")
    stream = await client.connection()
    await stream.send_head("GET", "/queues/q/stream", content_length=0)
    await stream.send_end()
    assert (await stream.receive_head()).status == 200
    assert (await client.get("/queues/q")).json()["consumers"] == 1
    assert_error(await client.delete("/queues/q?if_unused=true"), 409, "precondition_failed")
    assert "q" in await names(client, "queues")
    await stream.aclose()


async def test_get_unknown_queue(client: HTTPClient) -> None:
    assert_error(await client.get("/queues/nope"), 404, "not_found")


async def test_delete_queue(client: HTTPClient) -> None:
    await client.put("/queues/q")
    await client.post("/exchanges/amq.default/publish?routing_key=q", body=b"x")
    assert_error(await client.delete("/queues/q?if_empty=true"), 409, "precondition_failed")
    assert (await client.get("/queues/q")).json()["messages_ready"] == 1
    reply = await client.delete("/queues/q?if_unused=true")
    assert reply.status == 200
    assert reply.json() == {"deleted": "q", "messages": 1}
    assert_error(await client.delete("/queues/q"), 404, "not_found")
    await client.put("/queues/empty")
    assert (await client.delete("/queues/empty?if_empty=true")).json() == {"deleted": "empty", "messages": 0}


async def test_purge(client: HTTPClient) -> None:
    await client.put("/queues/q")
    for _ in range(3):
        await client.post("/exchanges/amq.default/publish?routing_key=q", body=b"x")
    leased = (await client.post("/queues/q/get")).json()["messages"]
    reply = await client.post("/queues/q/purge")
    assert reply.status == 200
    assert reply.json() == {"purged": 2}
    info = (await client.get("/queues/q")).json()
    assert (info["messages_ready"], info["messages_unacked"]) == (0, 1)  # leases survive a purge
    assert (await client.post("/queues/q/ack", json={"lease_ids": [leased[0]["lease_id"]]})).json() == {"acked": 1}
    assert (await client.post("/queues/q/purge")).json() == {"purged": 0}
    assert_error(await client.post("/queues/nope/purge"), 404, "not_found")


# -- bindings --------------------------------------------------------------------


async def test_bind_list_unbind(client: HTTPClient) -> None:
    await client.put("/exchanges/events", json={"type": "topic"})
    await client.put("/queues/q")
    binding = {"exchange": "events", "queue": "q", "routing_key": "order.*"}
    reply = await client.post("/bindings", json=binding)
    assert reply.status == 201
    assert reply.json() == {"bound": True, "created": True}
    again = await client.post("/bindings", json=binding)
    assert again.status == 200
    assert again.json() == {"bound": True, "created": False}
    assert (await client.get("/bindings")).json() == {
        "bindings": [{"exchange": "events", "routing_key": "order.*", "arguments": {}, "queue": "q"}]
    }
    routed = await client.post("/exchanges/events/publish?routing_key=order.created", body=b"x")
    assert routed.json() == {"confirm": "ack", "routed": 1}

    reply = await client.delete("/bindings", json=binding)
    assert reply.status == 200
    assert reply.json() == {"unbound": True}
    assert (await client.get("/bindings")).json() == {"bindings": []}
    assert_error(await client.delete("/bindings", json=binding), 404, "not_found")


async def test_exchange_to_exchange_binding(client: HTTPClient) -> None:
    await client.put("/exchanges/front", json={"type": "fanout"})
    await client.put("/exchanges/back", json={"type": "direct"})
    await client.put("/queues/q")
    assert (await client.post("/bindings", json={"exchange": "front", "to_exchange": "back"})).status == 201
    assert (await client.post("/bindings", json={"exchange": "back", "queue": "q", "routing_key": "k"})).status == 201
    reply = await client.post("/exchanges/front/publish?routing_key=k", body=b"hop")
    assert reply.json() == {"confirm": "ack", "routed": 1}
    assert {"exchange": "front", "routing_key": "", "arguments": {}, "to_exchange": "back"} in (
        await client.get("/bindings")
    ).json()["bindings"]


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"queue": "q"}, 400, "invalid_argument"),
        ({"exchange": "x"}, 400, "invalid_argument"),
        ({"exchange": "x", "queue": "q", "to_exchange": "y"}, 400, "invalid_argument"),
        ({"exchange": "x", "queue": "q", "routing_key": 7}, 400, "invalid_argument"),
        ({"exchange": "x", "queue": "q", "arguments": [1]}, 400, "invalid_argument"),
        ({"exchange": "x", "queue": "q", "routingkey": "k"}, 400, "invalid_argument"),
        ({"exchange": 1, "queue": "q"}, 400, "invalid_argument"),
        ({"exchange": "nope", "queue": "q"}, 404, "not_found"),
        ({"exchange": "x", "queue": "nope"}, 404, "not_found"),
        ({"exchange": "x", "to_exchange": "nope"}, 404, "not_found"),
        ({"exchange": "amq.default", "queue": "q"}, 403, "access_refused"),
        ({"exchange": "x", "to_exchange": "amq.default"}, 403, "access_refused"),
    ],
)
async def test_bind_errors(client: HTTPClient, body: Any, status: int, code: str) -> None:
    await client.put("/exchanges/x")
    await client.put("/queues/q")
    assert_error(await client.post("/bindings", json=body), status, code)
    assert (await client.get("/bindings")).json() == {"bindings": []}


async def test_bind_invalid_json(client: HTTPClient) -> None:
    assert_error(await client.post("/bindings", body=b"exchange=x&queue=q"), 400, "invalid_json")


async def test_failure_handling_inputs_are_refused_and_change_nothing(client: HTTPClient) -> None:
    assert (await client.put("/queues/jobs")).status == 201
    for arguments, named in [
        ({"x-max-lenght": 10}, "x-max-lenght"),
        ({"x-delivery-limit": "3"}, "x-delivery-limit"),
        ({"x-dead-letter-routing-key": "k"}, "x-dead-letter-exchange"),
        ({"x-expires": 0}, "x-expires"),
    ]:
        reply = await client.put("/queues/other", json={"arguments": arguments})
        assert_error(reply, 400, "invalid_argument")
        assert named in reply.json()["message"]
    assert (await client.get("/queues/other")).status == 404
    assert_error(await client.put("/exchanges/e", json={"arguments": {"x-alternate": "ae"}}), 400, "invalid_argument")
    for query in ("delay=-1", "delay=1e12", "delay=soon"):
        reply = await client.post(f"/exchanges/amq.default/publish?routing_key=jobs&{query}", body=b"m")
        assert_error(reply, 400, "invalid_argument")
    assert_error(await client.post("/queues/jobs/nack", json={"lease_ids": ["x"], "delay_s": -5}), 400, "invalid_argument")
    assert_error(await client.post("/queues/jobs/redrive", json={"count": 0}), 400, "invalid_argument")
    assert_error(await client.post("/queues/jobs/redrive", json={"routing_key": "k"}), 400, "invalid_argument")
    assert_error(await client.get("/queues/jobs/messages?limit=0"), 400, "invalid_argument")
    assert (await client.get("/queues/jobs")).json()["message_stats"]["published"] == 0

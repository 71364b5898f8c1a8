"""One validation: a channel op and its REST twin accept and refuse the same inputs
with the same error codes.

* Every channel op and every REST route that takes a JSON body refuses a field it
  does not know (``invalid_argument``), naming it: a typo must not silently mean
  something else (``{"op":"publish","routng_key":"jobs"}`` once published with an
  empty key).
* A publish to a missing or internal exchange is refused with the same code and
  message over REST (an error) and on a channel (a nack's reason).
* The twins decode their fields alike (types, a binding's required ``exchange``),
  and wait on the same durability condition after a declare.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.api.channel.opfields import OP_FIELDS
from broker.api.channel.ops import OPS
from broker.app import BrokerApp
from tests.support.channel import Clients
from tests.support.http import HTTPClient, assert_error

#: Every route whose request body is a JSON object of named fields.
JSON_BODY_ROUTES = [
    ("PUT", "/exchanges/{name}", "/exchanges/x"),
    ("PUT", "/queues/{name}", "/queues/q"),
    ("POST", "/get", "/get"),
    ("POST", "/queues/{name}/ack", "/queues/q/ack"),
    ("POST", "/queues/{name}/nack", "/queues/q/nack"),
    ("POST", "/queues/{name}/extend", "/queues/q/extend"),
    ("POST", "/queues/{name}/redrive", "/queues/q/redrive"),
    ("POST", "/bindings", "/bindings"),
    ("DELETE", "/bindings", "/bindings"),
    ("DELETE", "/channels/{id}", "/channels/1"),
    ("PUT", "/users/{name}", "/users/alice"),
    ("PUT", "/users/{name}/permissions", "/users/alice/permissions"),
    ("POST", "/users/{name}/tokens", "/users/alice/tokens"),
    ("POST", "/locks/{name}/acquire", "/locks/l/acquire"),
    ("POST", "/locks/{name}/refresh", "/locks/l/refresh"),
    ("POST", "/locks/{name}/release", "/locks/l/release"),
    ("PUT", "/schedules/{name}", "/schedules/s"),
]
#: Every other route that changes something, and what its body is instead.
OTHER_BODY_ROUTES = {
    ("POST", "/channel"): "NDJSON channel ops (walked below)",
    ("POST", "/exchanges/{name}/publish"): "the message itself",
    ("DELETE", "/exchanges/{name}"): "none",
    ("DELETE", "/queues/{name}"): "none",
    ("POST", "/queues/{name}/purge"): "none",
    ("POST", "/queues/{name}/get"): "none (query parameters)",
    ("DELETE", "/users/{name}"): "none",
    ("DELETE", "/tokens/{id}"): "none",
    ("DELETE", "/schedules/{name}"): "none",
    ("DELETE", "/cluster/nodes/{name}"): "none",
    # JSON {"add"|"remove"} in cluster mode (tests/cluster/test_replica_set.py); a single
    # node refuses it before reading a body (test below)
    ("POST", "/queues/{name}/replicas"): "refused on a single node",
    ("POST", "/schedules/{name}/pause"): "none",
    ("POST", "/schedules/{name}/resume"): "none",
    # RabbitMQ's management API: its JSON bodies ignore unknown keys, as RabbitMQ does
    # (tests/api/test_management_write.py)
    **{
        (method, "/api" + pattern): "RabbitMQ's management JSON"
        for method, pattern in (
            ("PUT", "/queues/{vhost}/{name}"),
            ("DELETE", "/queues/{vhost}/{name}"),
            ("DELETE", "/queues/{vhost}/{name}/contents"),
            ("POST", "/queues/{vhost}/{name}/get"),
            ("PUT", "/exchanges/{vhost}/{name}"),
            ("DELETE", "/exchanges/{vhost}/{name}"),
            ("POST", "/exchanges/{vhost}/{name}/publish"),
            ("POST", "/bindings/{vhost}/e/{source}/q/{destination}"),
            ("POST", "/bindings/{vhost}/e/{source}/e/{destination}"),
            ("DELETE", "/bindings/{vhost}/e/{source}/q/{destination}/{props}"),
            ("DELETE", "/bindings/{vhost}/e/{source}/e/{destination}/{props}"),
        )
    },
}


async def test_every_route_that_changes_something_is_classified(broker_app: BrokerApp) -> None:
    """A new route must say whether it takes JSON fields (and then is walked below)."""
    changing = {
        (r.method, r.pattern) for r in broker_app.router.routes() if r.method not in ("GET", "HEAD")
    }
    classified = {(m, p) for m, p, _ in JSON_BODY_ROUTES} | set(OTHER_BODY_ROUTES)
    assert changing == classified


async def test_a_single_node_has_no_replicas_to_change(client: HTTPClient) -> None:
    await client.put("/queues/q", json={"arguments": {"x-queue-type": "quorum"}})
    reply = await client.post("/queues/q/replicas", json={"add": "b"})
    assert_error(reply, 409, "not_clustered")


@pytest.mark.parametrize(("method", "pattern", "target"), JSON_BODY_ROUTES, ids=[f"{m} {p}" for m, p, _ in JSON_BODY_ROUTES])
async def test_every_rest_route_refuses_an_unknown_field(
    client: HTTPClient, method: str, pattern: str, target: str
) -> None:
    reply = await client.request(method, target, json={"no_such_field": 1})
    body = assert_error(reply, 400, "invalid_argument")
    assert "no_such_field" in body["message"]


def test_every_channel_op_has_a_field_list() -> None:
    assert set(OP_FIELDS) == set(OPS) | {"publish"}


@pytest.mark.parametrize("op", sorted(OP_FIELDS))
async def test_every_channel_op_refuses_an_unknown_field(clients: Clients, op: str) -> None:
    ch = await clients.channel()
    await ch.send({"op": op, "id": 7, "no_such_field": 1})
    event = await ch.expect("error")
    assert event["error"] == "invalid_argument"
    assert "no_such_field" in event["message"]
    assert event.get("id") == 7


async def test_a_misspelt_routing_key_is_refused_not_published(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "jobs"})
    await ch.send({"op": "publish", "routng_key": "jobs", "body": "x"})
    event = await ch.expect("error")
    assert event["error"] == "invalid_argument" and "routng_key" in event["message"]
    assert app.runtime.core.views.queue_counter("messages_ready", "jobs") == 0
    assert app.runtime.core.views.stat("published") == 0


async def _channel_nack_reason(clients: Clients, exchange: str) -> str:
    ch = await clients.channel()
    await ch.send({"op": "publish", "exchange": exchange, "routing_key": "k", "body": "x"})
    event = await ch.expect("nack", delivery_tag=1)
    reason = event["reason"]
    assert isinstance(reason, str)
    return reason


@pytest.mark.parametrize(("exchange", "status", "code"), [("ghost", 404, "not_found"), ("inner", 403, "access_refused")])
async def test_a_publish_to_a_missing_or_internal_exchange_is_refused_alike(
    client: HTTPClient, clients: Clients, exchange: str, status: int, code: str
) -> None:
    await client.put("/exchanges/inner", json={"type": "fanout", "internal": True})
    reply = await client.post(f"/exchanges/{exchange}/publish?routing_key=k", body=b"x")
    body = assert_error(reply, status, code)
    reason = await _channel_nack_reason(clients, exchange)
    assert reason == f"{code}: {body['message']}"


async def test_the_exchange_type_is_checked_once_with_one_answer(client: HTTPClient, clients: Clients) -> None:
    reply = await client.put("/exchanges/x", json={"type": "fan-out"})
    body = assert_error(reply, 400, "invalid_argument")
    ch = await clients.channel()
    await ch.send({"op": "declare_exchange", "exchange": "x", "type": "fan-out"})
    event = await ch.expect("error")
    assert (event["error"], event["message"]) == ("invalid_argument", body["message"])


@pytest.mark.parametrize(
    ("route", "op", "fields"),
    [
        (("PUT", "/queues/q"), {"op": "declare_queue", "queue": "q"}, {"durable": "yes"}),
        (("PUT", "/queues/q"), {"op": "declare_queue", "queue": "q"}, {"arguments": []}),
        (("PUT", "/exchanges/x"), {"op": "declare_exchange", "exchange": "x"}, {"internal": 1}),
        (("POST", "/bindings"), {"op": "bind"}, {"queue": "q"}),  # no exchange
        (("POST", "/bindings"), {"op": "bind"}, {"exchange": "amq.direct", "queue": "q", "to_exchange": "y"}),
        (("DELETE", "/bindings"), {"op": "unbind"}, {"exchange": "amq.direct", "queue": "q", "routing_key": 5}),
    ],
)
async def test_twins_refuse_bad_fields_alike(
    client: HTTPClient, clients: Clients, route: tuple[str, str], op: dict[str, Any], fields: dict[str, Any]
) -> None:
    method, target = route
    body = assert_error(await client.request(method, target, json=fields), 400, "invalid_argument")
    ch = await clients.channel()
    await ch.send({**op, **fields})
    event = await ch.expect("error")
    assert (event["error"], event["message"]) == ("invalid_argument", body["message"])


async def test_a_prefetch_out_of_range_is_refused_alike_by_consume_and_qos(clients: Clients) -> None:
    messages = []
    for op in ({"op": "qos", "prefetch": -1}, {"op": "consume", "queue": "q", "prefetch": -1}):
        ch = await clients.channel()
        await ch.ok({"op": "declare_queue", "queue": "q"})
        await ch.send(op)
        event = await ch.expect("error")
        assert event["error"] == "invalid_argument"
        messages.append(event["message"])
    assert messages[0] == messages[1]

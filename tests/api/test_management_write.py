"""The management API's declares, deletes, bindings and purge
(broker/api/management/writing.py): RabbitMQ's statuses and defaults, its error
shapes, the same permissions as ackbus's REST routes, and refusals that change
nothing."""

from __future__ import annotations

import json

from tests.support.app import MemoryBroker
from tests.support.http import HTTPClient
from tests.support.memory_fixtures import api, broker  # noqa: F401 (fixtures)
from tests.support.security import add_user

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


async def test_queue_declare_is_201_then_204_and_transient_by_default(api: HTTPClient) -> None:
    reply = await api.put("/api/queues/%2F/q", json={"arguments": {"x-message-ttl": 1000}})
    assert (reply.status, reply.body) == (201, b"")
    assert (await api.put("/api/queues/%2F/q", json={"arguments": {"x-message-ttl": 1000}})).status == 204
    q = (await api.get("/api/queues/%2F/q")).json()
    assert (q["durable"], q["auto_delete"], q["exclusive"]) == (False, False, False)
    # RabbitMQ ignores keys it does not read (rabbitmqadmin sends vhost and name)
    assert (await api.put("/api/queues/%2F/r", json={"vhost": "/", "name": "r", "durable": True})).status == 201
    assert (await api.get("/api/queues/%2F/r")).json()["durable"] is True
    assert (await api.put("/api/queues/%2F/s", body=b"")).status == 201
    # booleans as text, as rabbitmqadmin sends them (durable=true on its command line)
    assert (await api.put("/api/queues/%2F/t", json={"durable": "true", "auto_delete": "false"})).status == 201
    assert (await api.get("/api/queues/%2F/t")).json()["durable"] is True
    reply = await api.put("/api/queues/%2F/u", json={"durable": "True"})  # RabbitMQ takes only these two
    assert reply.status == 400


async def test_bad_declares_are_400_bad_request_and_change_nothing(api: HTTPClient) -> None:
    await api.put("/api/queues/%2F/q", json={"durable": True})
    for path, body in [
        ("/api/queues/%2F/q", b'{"durable": false}'),  # inequivalent
        ("/api/queues/%2F/n", b"not json"),
        ("/api/queues/%2F/n", b'{"durable": "yes"}'),
        ("/api/queues/%2F/n", b'{"arguments": {"x-max-length": "ten"}}'),
        ("/api/queues/%2F/n", b'{"exclusive": true}'),
        ("/api/exchanges/%2F/x", b'{"type": "bogus"}'),
    ]:
        reply = await api.put(path, body=body)
        assert reply.status == 400 and reply.json()["error"] == "bad_request", (path, body, reply.body)
        assert isinstance(reply.json()["reason"], str) and reply.json()["reason"]
    assert [q["name"] for q in (await api.get("/api/queues")).json()] == ["q"]
    assert (await api.get("/api/exchanges/%2F/x")).status == 404


async def test_exchange_declare_and_delete(api: HTTPClient) -> None:
    assert (await api.put("/api/exchanges/%2F/x", json={"type": "fanout", "durable": True})).status == 201
    assert (await api.put("/api/exchanges/%2F/x", json={"type": "fanout", "durable": True})).status == 204
    reply = await api.put("/api/exchanges/%2F/x", json={"type": "topic", "durable": True})
    assert reply.status == 400 and reply.json()["error"] == "bad_request"
    assert (await api.put("/api/exchanges/%2F/y", json={})).status == 201
    y = (await api.get("/api/exchanges/%2F/y")).json()
    assert (y["type"], y["durable"]) == ("direct", False)  # RabbitMQ's defaults
    assert (await api.delete("/api/exchanges/%2F/x")).status == 204
    reply = await api.delete("/api/exchanges/%2F/x")
    assert (reply.status, reply.json()) == (404, NOT_FOUND)
    # a built-in exchange: refused as RabbitMQ refuses it
    reply = await api.delete("/api/exchanges/%2F/amq.direct")
    assert reply.status in (400, 401) and "reason" in reply.json()
    assert (await api.get("/api/exchanges/%2F/amq.direct")).status == 200


async def test_queue_delete_conditions_and_purge(api: HTTPClient) -> None:
    await api.put("/api/queues/%2F/q", json={})
    await api.post("/api/exchanges/%2F/amq.default/publish",
                   json={"properties": {}, "routing_key": "q", "payload": "x", "payload_encoding": "string"})
    reply = await api.delete("/api/queues/%2F/q?if-empty=true")
    assert reply.status == 400 and reply.json()["error"] == "bad_request"
    assert (await api.get("/api/queues/%2F/q")).json()["messages"] == 1
    assert (await api.delete("/api/queues/%2F/q/contents")).status == 204
    assert (await api.get("/api/queues/%2F/q")).json()["messages"] == 0
    assert (await api.delete("/api/queues/%2F/q?if-empty=true&if-unused=true")).status == 204
    for path in ("/api/queues/%2F/q", "/api/queues/%2F/q/contents"):
        reply = await api.delete(path)
        assert (reply.status, reply.json()) == (404, NOT_FOUND), path


async def test_bindings_made_and_removed_by_their_properties_key(api: HTTPClient) -> None:
    await api.put("/api/queues/%2F/q", json={})
    await api.put("/api/exchanges/%2F/x", json={"type": "headers"})
    await api.put("/api/exchanges/%2F/y", json={"type": "topic"})
    reply = await api.post("/api/bindings/%2F/e/x/q/q", json={"routing_key": "", "arguments": {"x-match": "any", "a": 1}})
    assert reply.status == 201 and reply.headers["location"].startswith("q/~")
    reply = await api.post("/api/bindings/%2F/e/y/e/x", json={"routing_key": "k~1 #"})
    assert (reply.status, reply.headers["location"]) == (201, "x/k%257E1%2B%2523")
    bindings = (await api.get("/api/bindings")).json()
    keys = {(b["source"], b["destination"]): b["properties_key"] for b in bindings}
    assert keys[("y", "x")] == "k%7E1+%23"
    assert keys[("x", "q")].startswith("~") and len(keys[("x", "q")]) > 1
    # the key read back from the listing names the binding in a DELETE (quoted again in the path)
    from urllib.parse import quote

    assert (await api.delete(f"/api/bindings/%2F/e/y/e/x/{quote(keys[('y', 'x')], safe='')}")).status == 204
    assert (await api.delete(f"/api/bindings/%2F/e/x/q/q/{quote(keys[('x', 'q')], safe='')}")).status == 204
    assert [b["source"] for b in (await api.get("/api/bindings")).json()] == [""]
    reply = await api.delete("/api/bindings/%2F/e/y/e/x/nope")
    assert (reply.status, reply.json()) == (404, NOT_FOUND)
    # the default exchange's implicit binding cannot be removed
    assert (await api.delete("/api/bindings/%2F/e/amq.default/q/q/q")).status == 404


async def test_binding_to_something_missing_is_404_not_found(api: HTTPClient) -> None:
    await api.put("/api/exchanges/%2F/x", json={})
    reply = await api.post("/api/bindings/%2F/e/x/q/nope", json={"routing_key": "k"})
    assert reply.status == 404 and reply.json()["error"] == "not_found" and "nope" in reply.json()["reason"]
    reply = await api.post("/api/bindings/%2F/e/nope/e/x", json={"routing_key": "k"})
    assert reply.status == 404 and reply.json()["error"] == "not_found"


async def test_405_for_a_method_the_path_does_not_serve(api: HTTPClient) -> None:
    reply = await api.request("PATCH", "/api/queues/%2F/q")
    assert reply.status == 405 and "PUT" in reply.headers["allow"]


async def test_credentials_and_permissions(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    core = broker.runtime.core
    admin = add_user(core, "admin", tags=("administrator",))
    reader = add_user(core, "reader", permissions={"configure": "^$", "write": "^$", "read": ".*"})
    await broker.runtime.wait_durable()
    # no credentials: 401 with a Basic challenge (every tool sends Basic)
    reply = await api.get("/api/overview")
    assert reply.status == 401 and 'Basic realm="ackbus"' in reply.headers["www-authenticate"]
    assert (await api.get("/api/overview", headers=[("Authorization", "Basic YWRtaW46d3Jvbmc=")])).status == 401
    assert (await api.put("/api/queues/%2F/q", json={}, headers=admin)).status == 201
    # configure refused: RabbitMQ's 401 not_authorised, and nothing declared or deleted
    for method, path in [("PUT", "/api/queues/%2F/r"), ("DELETE", "/api/queues/%2F/q"),
                         ("PUT", "/api/exchanges/%2F/x"), ("POST", "/api/bindings/%2F/e/amq.direct/q/q")]:
        reply = await api.request(method, path, json={}, headers=reader)
        assert (reply.status, reply.json()["error"]) == (401, "not_authorised"), (method, path)
    assert [q["name"] for q in (await api.get("/api/queues", headers=reader)).json()] == ["q"]
    # read is enough to purge (as POST /queues/{name}/purge), not to publish
    assert (await api.delete("/api/queues/%2F/q/contents", headers=reader)).status == 204
    reply = await api.post("/api/exchanges/%2F/amq.default/publish", headers=reader,
                           json={"properties": {}, "routing_key": "q", "payload": "x", "payload_encoding": "string"})
    assert reply.status == 401


#: Values of every JSON type, and of the wrong one for each key.
ODD_VALUES = [None, 0, -1, 2**70, 1.5, "", "x", "true", [], [1], {}, {"a": [None]}, True, False]
#: (method, path, the keys its body reads).
BODY_ROUTES = [
    ("PUT", "/api/queues/%2F/odd", ("durable", "auto_delete", "exclusive", "arguments")),
    ("PUT", "/api/exchanges/%2F/odd", ("type", "durable", "auto_delete", "internal", "arguments")),
    ("POST", "/api/bindings/%2F/e/amq.direct/q/target", ("routing_key", "arguments")),
    ("POST", "/api/bindings/%2F/e/amq.direct/e/amq.fanout", ("routing_key", "arguments")),
    ("POST", "/api/exchanges/%2F/amq.default/publish", ("properties", "routing_key", "payload", "payload_encoding")),
    ("POST", "/api/queues/%2F/target/get", ("count", "ackmode", "encoding", "truncate")),
]


async def test_odd_bodies_are_answered_never_with_a_server_error(api: HTTPClient) -> None:
    """Each key of each body given a value of every JSON type (the others valid or
    absent), and bodies that are not objects: every answer is below 500."""
    await api.put("/api/queues/%2F/target", json={})
    valid: dict[str, object] = {
        "routing_key": "target", "payload": "x", "payload_encoding": "string", "properties": {},
        "count": 1, "ackmode": "ack_requeue_true", "encoding": "auto",
    }
    for method, path, keys in BODY_ROUTES:
        for raw in (b"[]", b"1", b'"x"', b"null", b"{", b"\xff"):
            reply = await api.request(method, path, body=raw)
            assert reply.status < 500 and "reason" in reply.json(), (method, path, raw, reply.body)
        for key in keys:
            for value in ODD_VALUES:
                body = {k: v for k, v in valid.items() if k in keys}
                body[key] = value
                reply = await api.request(method, path, body=json.dumps(body).encode())
                assert reply.status < 500, (method, path, body, reply.body)
                if reply.status >= 400:
                    assert set(reply.json()) == {"error", "reason"}, (method, path, body, reply.body)

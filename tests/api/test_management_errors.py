"""The HTTP layer's refusals under ``/api/`` in RabbitMQ's bodies
(broker/api/management/errors.py, ``api_error_bodies``): the guard's 401, the
router's 404 for an unknown path and 405 for a method a path does not serve, as
RabbitMQ 3.10's management plugin answers them (tests/system/
test_management_differential.py compares with the real one); every other path keeps
ackbus's own ``{"error", "message"}``."""

from __future__ import annotations

from tests.support.app import MemoryBroker
from tests.support.http import HTTPClient
from tests.support.memory_fixtures import api, broker  # noqa: F401 (fixtures)
from tests.support.security import add_user, basic

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


async def test_401_is_rabbitmqs_under_api_and_keeps_the_challenge(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    add_user(broker.runtime.core, "admin", tags=("administrator",))
    await broker.runtime.wait_durable()
    for headers in ([], basic("admin", "wrong"), basic("nobody", "x")):
        for path in ("/api/overview", "/api/queues/%2F/q", "/api/connections"):
            reply = await api.get(path, headers=headers)
            assert reply.status == 401, (path, headers)
            body = reply.json()
            assert body["error"] == "not_authorized" and isinstance(body["reason"], str) and body["reason"], body
            assert set(body) == {"error", "reason"}
            challenges = reply.headers["www-authenticate"]
            assert 'Basic realm="ackbus"' in challenges and "Bearer" in challenges
        # ackbus's own routes keep ackbus's answer
        reply = await api.get("/queues", headers=headers)
        assert (reply.status, reply.json()["error"], "message" in reply.json()) == (401, "unauthorized", True)
    assert (await api.get("/api/overview", headers=basic("admin", "secret"))).status == 200
    # an unknown path is a 404 before any credentials, as RabbitMQ answers it
    assert (await api.get("/api/nosuch")).json() == NOT_FOUND


async def test_404_and_405_are_rabbitmqs_under_api(api: HTTPClient) -> None:
    for path in ("/api/nosuch", "/api/queues/%2F/q/nosuch", "/api", "/api/"):
        reply = await api.get(path)
        assert (reply.status, reply.json()) == (404, NOT_FOUND), path
    # RabbitMQ: 405 with Allow and no body
    for method, path in [("POST", "/api/overview"), ("DELETE", "/api/overview"), ("PATCH", "/api/queues/%2F/q")]:
        reply = await api.request(method, path)
        assert (reply.status, reply.body) == (405, b""), (method, path)
        assert "GET" in reply.headers["allow"], (method, path)
    assert "PUT" in (await api.request("PATCH", "/api/queues/%2F/q")).headers["allow"]
    # a path that does not decode: RabbitMQ's shape, ackbus's status and reason
    reply = await api.get("/api/queues/%2F/%FF")
    assert reply.status == 400 and reply.json()["error"] == "bad_request" and reply.json()["reason"]
    # elsewhere: ackbus's own answers, unchanged
    reply = await api.get("/nosuch")
    assert (reply.status, reply.json()["error"]) == (404, "not_found")
    reply = await api.request("PATCH", "/queues/q")
    assert (reply.status, reply.json()["error"]) == (405, "method_not_allowed") and reply.headers["allow"]
    reply = await api.get("/apix")
    assert (reply.status, reply.json()["error"]) == (404, "not_found")

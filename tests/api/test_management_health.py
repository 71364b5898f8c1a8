"""The management API's health checks (broker/api/management/health.py): RabbitMQ
3.10's answers, 200 ``{"status": "ok"}`` or 503 ``{"status": "failed", "reason"}``."""

from __future__ import annotations

import pytest
import trio

from broker.api.management import health
from tests.support.app import MemoryBroker
from tests.support.http import HTTPClient
from tests.support.memory_fixtures import api, broker  # noqa: F401 (fixtures)
from tests.support.security import add_user


async def test_aliveness_publishes_and_gets_a_message(api: HTTPClient) -> None:
    reply = await api.get("/api/aliveness-test/%2F")
    assert (reply.status, reply.json()) == (200, {"status": "ok"})
    q = (await api.get("/api/queues/%2F/aliveness-test")).json()
    assert (q["messages"], q["message_stats"]["publish"], q["message_stats"]["ack"]) == (0, 1, 1)
    assert (await api.get("/api/aliveness-test/%2F")).status == 200  # again: the queue exists already


async def test_aliveness_fails_while_the_test_message_is_not_taken(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    # the queue exists with a length limit that refuses every publish
    await api.put("/api/queues/%2F/aliveness-test", json={"arguments": {"x-max-length": 0, "x-overflow": "reject-publish"}})
    reply = await api.get("/api/aliveness-test/%2F")
    assert reply.status == 503 and reply.json()["status"] == "failed" and reply.json()["reason"]


async def test_alarms(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    for path in ("/api/health/checks/alarms", "/api/health/checks/local-alarms"):
        assert (await api.get(path)).json() == {"status": "ok"}
    broker.runtime.flow.raise_alarm("memory", "test")  # (cleared by the memory monitor's next sample, 1 s on)
    try:
        for path in ("/api/health/checks/alarms", "/api/health/checks/local-alarms"):
            reply = await api.get(path)
            assert reply.status == 503 and reply.json()["status"] == "failed"
            assert [a["resource"] for a in reply.json()["alarms"]] == ["memory"]
    finally:
        broker.runtime.flow.clear_alarm("memory")
    assert (await api.get("/api/health/checks/alarms")).status == 200


async def test_virtual_hosts(api: HTTPClient) -> None:
    assert (await api.get("/api/health/checks/virtual-hosts")).json() == {"status": "ok"}


async def test_listeners_the_app_recorded(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    book = broker.app.listeners
    [http_port] = book.ports()  # the app's own, recorded as it bound it
    book.add("amqp", "127.0.0.1", 5672)
    assert (await api.get("/api/health/checks/port-listener/5672")).json() == {"status": "ok", "port": 5672}
    reply = await api.get("/api/health/checks/port-listener/1")
    assert (reply.status, reply.json()) == (
        503, {"status": "failed", "reason": "No active listener", "missing": 1, "ports": sorted([5672, http_port])},
    )
    for odd in ("x", "%C2%B2", "0", "99999"):
        assert (await api.get(f"/api/health/checks/port-listener/{odd}")).status == 503, odd
    assert (await api.get("/api/health/checks/protocol-listener/amqp")).json() == {"status": "ok", "protocol": "amqp"}
    reply = await api.get("/api/health/checks/protocol-listener/mqtt")
    assert (reply.status, reply.json()) == (
        503, {"status": "failed", "reason": "No active listener", "missing": "mqtt", "protocols": ["amqp", "http"]},
    )


async def test_health_checks_need_credentials_once_users_exist(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    user = add_user(broker.runtime.core, "monitor", permissions={"configure": "^$", "write": "^$", "read": ".*"})
    await broker.runtime.wait_durable()
    assert (await api.get("/api/health/checks/alarms")).status == 401
    assert (await api.get("/api/health/checks/alarms", headers=user)).status == 200
    # the aliveness test declares and publishes: it needs those permissions
    reply = await api.get("/api/aliveness-test/%2F", headers=user)
    assert (reply.status, reply.json()["error"]) == (401, "not_authorised")
    assert (await api.get("/healthz")).status == 200  # ackbus's own probe stays public


async def test_aliveness_fails_rather_than_waits_while_publishing_is_blocked(
    api: HTTPClient, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    monkeypatch.setattr(health, "ALIVENESS_WAIT_S", 0.2)
    # (an alarm of a kind no monitor clears meanwhile)
    broker.runtime.flow.raise_alarm("test", "held by the test")
    try:
        with trio.fail_after(30):
            reply = await api.get("/api/aliveness-test/%2F")
        assert reply.status == 503 and reply.json()["status"] == "failed"
    finally:
        broker.runtime.flow.clear_alarm("test")
    assert (await api.get("/api/aliveness-test/%2F")).status == 200

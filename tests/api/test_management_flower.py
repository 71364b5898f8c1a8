"""A real tool against the management API: Celery's Flower reads queue lengths from
``--broker-api`` (``flower.utils.broker.RabbitMQ``, on tornado's HTTP client) as it
reads them from RabbitMQ. Skipped without Flower (the test extra installs it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import trio

from broker.app import BrokerApp
from tests.support.http import HTTPClient

flower_broker = pytest.importorskip("flower.utils.broker")


async def test_flower_reads_queue_lengths(broker_app: BrokerApp, client: HTTPClient) -> None:
    for name in ("celery", "emails"):
        assert (await client.put(f"/api/queues/%2F/{name}", json={"durable": True})).status == 201
    for _ in range(3):
        await client.post("/api/exchanges/%2F/amq.default/publish",
                          json={"properties": {}, "routing_key": "celery", "payload": "x", "payload_encoding": "string"})
    api = f"http://guest:guest@127.0.0.1:{broker_app.port}/api/"

    def read(names: list[str]) -> Any:
        broker = flower_broker.Broker("amqp://guest:guest@127.0.0.1:5672//", http_api=api)
        return asyncio.run(broker.queues(names))

    queues = await trio.to_thread.run_sync(read, ["celery", "emails", "missing"])
    assert {q["name"]: q["messages"] for q in queues} == {"celery": 3, "emails": 0}

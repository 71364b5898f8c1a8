"""An auto-delete queue read only with REST gets (as Celery's ``rpc://`` reply queues
are) goes away once its reader has been silent for ``auto_delete_grace_s``."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.http import HTTPClient

GRACE = 5.0  # the default auto_delete_grace_s


async def test_a_reply_queue_read_with_long_polls_is_gone_after_the_grace(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    assert broker_app.runtime.options.auto_delete_grace_s == GRACE
    reply = await memory_client.put("/queues/celery.reply", json={"auto_delete": True, "durable": False})
    assert reply.status in (200, 201), reply.body
    published = await memory_client.post("/exchanges/amq.default/publish?routing_key=celery.reply", body=b"result")
    assert published.json() == {"confirm": "ack", "routed": 1}, published.body
    got = await memory_client.post("/queues/celery.reply/get?wait=2&lease=60")
    (message,) = got.json()["messages"]
    start = trio.current_time()
    acked = await memory_client.post("/queues/celery.reply/ack", json={"lease_ids": [message["lease_id"]]})
    assert acked.status == 200, acked.body
    # then silence: the reader is gone
    await trio.sleep(GRACE - 0.5)
    assert (await memory_client.get("/queues/celery.reply")).status == 200
    with trio.fail_after(2):
        while (await memory_client.get("/queues/celery.reply")).status != 404:
            await trio.sleep(0.05)
    assert trio.current_time() - start == pytest.approx(GRACE, abs=0.1)
    overview = (await memory_client.get("/overview")).json()
    assert overview["totals"]["queues"] == 0

"""An auto-delete queue read only with REST gets (as Celery's ``rpc://`` reply queues
are) goes away once its reader has been silent for ``auto_delete_grace_s``."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.http import HTTPClient, open_memory_client

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


async def test_a_reply_queue_whose_long_poll_left_is_gone_after_the_grace(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    """The long-poll outlives the grace, then its client leaves (a producer that exits
    while waiting): no request follows to tell the broker, and still the queue goes
    one grace after."""
    await memory_client.put("/queues/celery.reply", json={"auto_delete": True, "durable": False})
    queue = broker_app.runtime.core.queues["celery.reply"]
    async with open_memory_client(broker_app) as leaver:
        conn = await leaver.connection()
        await conn.send_head("POST", "/queues/celery.reply/get?wait=60", content_length=0)
        await conn.send_end()
        with trio.fail_after(1):
            while queue.getters != 1:
                await trio.sleep(0.001)
        await trio.sleep(GRACE * 3)
        assert (await memory_client.get("/queues/celery.reply")).status == 200  # it is being read
        left = trio.current_time()
        await conn.aclose()
        with trio.fail_after(1):
            while queue.getters:
                await trio.sleep(0.001)
    await trio.sleep(GRACE + 0.1)
    assert "celery.reply" not in broker_app.runtime.core.queues
    assert trio.current_time() - left == pytest.approx(GRACE + 0.1, abs=0.1)

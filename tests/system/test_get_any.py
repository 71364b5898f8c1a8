"""One wait over several queues, with the client (``conn.get_any``) and the CLI
(``ackbus get Q1 Q2 Q3``), against a real broker."""

from __future__ import annotations

import io

import pytest

import client
from client.__main__ import run
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow


async def test_client_and_cli_get_any_serve_the_first_listed_queue_with_work(async_broker: BrokerProcess) -> None:
    broker = async_broker
    async with client.connect(broker.url) as conn:
        for name in ("urgent", "normal", "bulk"):
            await conn.declare_queue(name)
        async with conn.channel() as ch:
            await ch.publish("", "bulk", b"b")
            await ch.publish("", "normal", b"n")
        got = await conn.get_any(["urgent", "normal", "bulk"], max_messages=5)
        assert [(m.queue, m.body) for m in got] == [("normal", b"n")]
        await got[0].ack()
        out, err = io.StringIO(), io.StringIO()
        status = await run(["--url", broker.url, "get", "urgent", "normal", "bulk", "--wait", "1"],
                           stdout=out, stderr=err, handle_signals=False)
        assert (status, out.getvalue()) == (0, "b\n"), err.getvalue()
        assert (await conn.queue_info("bulk")).messages_ready == 0

"""AMQP publishes and ``message_id`` (docs/amqp.md, "Deduplication"): as in RabbitMQ,
every copy is enqueued, its id delivered unchanged; a connection that sends the client
property ``x-deduplicate: true`` has its publishes deduplicated as over HTTP (a copy
whose id its exchange saw within the window is confirmed, not enqueued)."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands

from tests.amqp.rawclient import RawAMQP, open_amqp

Basic = commands.Basic


async def _publish_twice_and_get(c: RawAMQP) -> list[tuple[bytes, Any]]:
    """Publish "first" and "second" with the same message id under confirms; both are
    acked; then get until the queue is empty: (body, message_id) of each message."""
    await c.open_channel(1)
    queue = (await c.declare(1, "")).queue
    await c.send(1, commands.Confirm.Select())
    await c.expect(commands.Confirm.SelectOk, 1)
    for body in (b"first", b"second"):
        await c.publish(1, "", queue, body, properties=Basic.Properties(message_id="order-7"))
    acked: set[int] = set()
    while len(acked) < 2:
        ack = await c.expect(Basic.Ack, 1)
        acked.update(range(1, ack.delivery_tag + 1) if ack.multiple else [ack.delivery_tag])
    assert acked == {1, 2}
    got = []
    for _ in range(3):  # (at most two messages are there)
        await c.send(1, Basic.Get(queue=queue, no_ack=True))
        _ch, reply = await c.recv()
        if isinstance(reply, Basic.GetEmpty):
            return got
        assert isinstance(reply, Basic.GetOk), reply
        _ch, head = await c.recv()
        _ch, body = await c.recv()
        got.append((body.value, head.properties.message_id))
    raise AssertionError(f"more than two messages: {got}")


async def test_the_same_message_id_twice_is_delivered_twice(app: Any) -> None:
    async with open_amqp(app) as c:
        got = await _publish_twice_and_get(c)
    assert got == [(b"first", "order-7"), (b"second", "order-7")]
    assert app.runtime.core.stats["deduplicated"] == 0


async def test_a_connection_that_asks_is_deduplicated(app: Any) -> None:
    async with open_amqp(app, client_properties={"x-deduplicate": True}) as c:
        got = await _publish_twice_and_get(c)
    assert got == [(b"first", "order-7")]
    assert app.runtime.core.stats["deduplicated"] == 1


@pytest.mark.parametrize("value", [False, "true", 1])
async def test_any_other_value_leaves_it_off(app: Any, value: Any) -> None:
    async with open_amqp(app, client_properties={"x-deduplicate": value}) as c:
        got = await _publish_twice_and_get(c)
    assert [body for body, _id in got] == [b"first", b"second"]


async def test_a_transaction_keeps_the_connections_choice(app: Any) -> None:
    for properties, expected in (({}, 2), ({"x-deduplicate": True}, 1)):
        async with open_amqp(app, client_properties=properties) as c:
            await c.open_channel(1)
            queue = (await c.declare(1, "")).queue
            await c.send(1, commands.Tx.Select())
            await c.expect(commands.Tx.SelectOk, 1)
            for body in (b"first", b"second"):
                await c.publish(1, "", queue, body, properties=Basic.Properties(message_id="tx-7"))
            await c.send(1, commands.Tx.Commit())
            await c.expect(commands.Tx.CommitOk, 1)
            assert app.runtime.core.queues[queue].ready_count() == expected, properties

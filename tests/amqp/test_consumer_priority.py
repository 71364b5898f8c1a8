"""``x-priority`` on basic.consume: the higher-priority consumer gets the messages
while it has prefetch room (RabbitMQ's consumer priorities); a bad value is 406."""

from __future__ import annotations

import trio
from pamqp import commands

from tests.amqp.rawclient import open_amqp

Basic = commands.Basic


async def test_the_high_priority_consumer_is_served_first(app) -> None:
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.open_channel(2)
            await c.declare(1, "p")
            await c.send(1, Basic.Qos(prefetch_count=10))
            await c.expect(Basic.QosOk, 1)
            await c.send(1, Basic.Consume(queue="p", consumer_tag="low"))
            await c.expect(Basic.ConsumeOk, 1)
            await c.send(2, Basic.Qos(prefetch_count=2))
            await c.expect(Basic.QosOk, 2)
            await c.send(2, Basic.Consume(queue="p", consumer_tag="high", arguments={"x-priority": 10}))
            await c.expect(Basic.ConsumeOk, 2)
            for i in range(5):
                await c.publish(1, "", "p", b"%d" % i)
            got = [await c.message() for _ in range(5)]
            assert [(m.consumer_tag, body) for m, _p, body in got] == [
                ("high", b"0"), ("high", b"1"), ("low", b"2"), ("low", b"3"), ("low", b"4")]


async def test_a_non_integer_priority_is_406(app) -> None:
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.declare(1, "p")
            await c.send(1, Basic.Consume(queue="p", arguments={"x-priority": "high"}))
            code, text = await c.closed_with(1)
            assert code == 406 and "x-priority" in text

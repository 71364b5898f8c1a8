"""basic.get as the core's get on the channel (``Broker.channel_get``): get-ok's
fields, and what a get is not (a consumer: no auto-delete, no single-active turn, no
prefetch), as in RabbitMQ."""

from __future__ import annotations

import trio
from pamqp import commands

from tests.amqp.rawclient import open_amqp

Basic = commands.Basic


async def test_get_ok_carries_tag_redelivered_exchange_key_and_message_count(app) -> None:
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.declare(1, "g")
            await c.send(1, commands.Queue.Bind(queue="g", exchange="amq.direct", routing_key="rk"))
            await c.expect(commands.Queue.BindOk, 1)
            for body in (b"one", b"two", b"three"):
                await c.publish(1, "amq.direct", "rk", body)
            await c.send(1, Basic.Get(queue="g"))
            method, _p, body = await c.message()
            assert isinstance(method, Basic.GetOk) and body == b"one"
            assert (method.delivery_tag, method.redelivered, method.exchange, method.routing_key,
                    method.message_count) == (1, False, "amq.direct", "rk", 2)
            await c.send(1, Basic.Reject(delivery_tag=1, requeue=True))
            await c.send(1, Basic.Get(queue="g"))
            method, _p, body = await c.message()
            assert (method.delivery_tag, method.redelivered, body, method.message_count) == (2, True, b"one", 2)
            await c.send(1, Basic.Ack(delivery_tag=0, multiple=True))  # tag 0: every one so far
            await c.send(1, Basic.Get(queue="g", no_ack=True))
            method, _p, body = await c.message()
            assert (method.delivery_tag, body, method.message_count) == (3, b"two", 1)
            core = app.runtime.core
            assert core.queues["g"].unacked == 0 and core.queues["g"].ready_count() == 1


async def test_a_get_does_not_make_an_auto_delete_queue_go(app) -> None:
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.declare(1, "ad", auto_delete=True)
            await c.publish(1, "", "ad", b"m")
            await c.send(1, Basic.Get(queue="ad", no_ack=True))
            await c.message()
            await c.send(1, Basic.Get(queue="ad"))
            await c.expect(Basic.GetEmpty, 1)
            assert "ad" in app.runtime.core.queues  # RabbitMQ: only a last consumer's cancel


async def test_a_get_beside_a_single_active_consumer_and_past_the_prefetch(app) -> None:
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.declare(1, "sac", arguments={"x-single-active-consumer": True})
            await c.send(1, Basic.Qos(prefetch_count=1, global_=True))
            await c.expect(Basic.QosOk, 1)
            await c.send(1, Basic.Consume(queue="sac", consumer_tag="active"))
            await c.expect(Basic.ConsumeOk, 1)
            for body in (b"a", b"b", b"c"):
                await c.publish(1, "", "sac", body)
            method, _p, body = await c.message()
            assert isinstance(method, Basic.Deliver) and body == b"a"
            # the active consumer is full (prefetch 1): a get still takes the next one
            await c.send(1, Basic.Get(queue="sac"))
            method, _p, body = await c.message()
            assert isinstance(method, Basic.GetOk) and body == b"b" and method.message_count == 1
            await c.send(1, Basic.Get(queue="sac"))
            method, _p, body = await c.message()
            assert isinstance(method, Basic.GetOk) and body == b"c" and method.message_count == 0

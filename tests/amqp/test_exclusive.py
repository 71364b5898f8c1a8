"""Exclusive queues belong to the AMQP connection (as in RabbitMQ): every channel of
it may use them, other connections get 405, and they go when the connection closes,
not with the channel that declared them."""

from __future__ import annotations

import trio
from pamqp import commands

from tests.amqp.rawclient import open_amqp

Basic = commands.Basic


async def test_another_channel_of_the_connection_may_use_it(app) -> None:
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.open_channel(2)
            await c.declare(1, "mine", exclusive=True)
            ok = await c.declare(2, "mine", exclusive=True)  # the same queue, redeclared
            assert ok.queue == "mine"
            await c.publish(2, "", "mine", b"m")
            await c.send(2, Basic.Consume(queue="mine", consumer_tag="c2"))
            await c.expect(Basic.ConsumeOk, 2)
            method, _p, body = await c.message()
            assert isinstance(method, Basic.Deliver) and body == b"m"


async def test_it_outlives_its_channel_and_goes_with_the_connection(app) -> None:
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        core = app.runtime.core
        async with open_amqp(app) as c, open_amqp(app) as other:
            await c.open_channel(1)
            server_named = (await c.declare(1, "", exclusive=True)).queue
            await c.declare(1, "kept", exclusive=True)
            await c.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            await c.expect(commands.Channel.CloseOk, 1)
            assert {"kept", server_named} <= set(core.queues)
            await c.open_channel(2)
            await c.send(2, Basic.Get(queue="kept"))
            await c.expect(Basic.GetEmpty, 2)
            await other.open_channel(1)
            await other.send(1, commands.Queue.Declare(queue="kept", passive=True))
            code, text = await other.closed_with(1)
            assert code == 405 and text.startswith("RESOURCE_LOCKED")
            await c.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            await c.expect(commands.Connection.CloseOk)
        with trio.fail_after(5):
            while "kept" in core.queues or server_named in core.queues:
                await trio.sleep(0.01)
        assert len(core.connections) == 0

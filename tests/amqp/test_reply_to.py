"""Direct reply-to (``amq.rabbitmq.reply-to``) over the AMQP listener, with a raw
pamqp client against the in-process broker: the reply consumer, the rewritten
``reply_to``, replies from AMQP, HTTP channel and REST publishers, the passive
declare check, and RabbitMQ 3.10's refusals (codes and texts)."""

from __future__ import annotations

from typing import Any

import trio
from pamqp import commands

from tests.amqp.rawclient import RawAMQP, open_amqp
from tests.support.channel import Clients
from tests.support.http import HTTPClient

Basic = commands.Basic
REPLY_TO = "amq.rabbitmq.reply-to"


async def requester(c: RawAMQP, channel: int = 1, tag: str = "replies") -> str:
    """Open ``channel`` with a reply consumer; publish one request to ``rpc`` and
    return the address its ``reply_to`` was given."""
    await c.open_channel(channel)
    await c.send(channel, Basic.Consume(queue=REPLY_TO, consumer_tag=tag, no_ack=True))
    ok = await c.expect(Basic.ConsumeOk, channel)
    assert ok.consumer_tag == tag
    await c.declare(channel, "rpc")
    await c.publish(channel, "", "rpc", b"request",
                    properties=Basic.Properties(reply_to=REPLY_TO, correlation_id="c1"))
    await c.send(channel, Basic.Get(queue="rpc", no_ack=True))
    method, props, body = await c.message()
    assert isinstance(method, Basic.GetOk) and body == b"request"
    address: str = props.reply_to
    assert address.startswith(REPLY_TO + ".") and address != REPLY_TO + "."
    assert props.correlation_id == "c1"
    return address


async def test_rpc_round_trip_over_amqp(app: Any) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        async with open_amqp(app) as c, open_amqp(app) as server:
            address = await requester(c)
            await server.open_channel(1)
            await server.send(1, commands.Confirm.Select())
            await server.expect(commands.Confirm.SelectOk, 1)
            await server.publish(1, "", address, b"answer", properties=Basic.Properties(correlation_id="c1"))
            assert (await server.expect(Basic.Ack, 1)).delivery_tag == 1
            method, props, body = await c.message()
            assert isinstance(method, Basic.Deliver)
            assert (method.consumer_tag, method.exchange, method.routing_key, method.redelivered) == (
                "replies", "", address, False)
            assert (body, props.correlation_id) == (b"answer", "c1")
            # the passive declare: there, with no messages and one consumer
            ok = await server.declare(1, address, passive=True)
            assert (ok.queue, ok.message_count, ok.consumer_count) == (address, 0, 1)
            # nothing was a queue, nothing stayed
            assert not any(name.startswith(REPLY_TO) for name in app.runtime.core.queues)


async def test_a_reply_from_rest_and_from_an_http_channel(app: Any, client: HTTPClient, clients: Clients) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        async with open_amqp(app) as c:
            address = await requester(c)
            reply = await client.post(f"/exchanges/amq.default/publish?routing_key={address}", body=b"from rest",
                                      headers=[("X-Correlation-Id", "c1")])
            assert reply.status == 200 and reply.json()["confirm"] == "ack"
            method, props, body = await c.message()
            assert isinstance(method, Basic.Deliver) and body == b"from rest" and props.correlation_id == "c1"
            ch = await clients.channel()
            await ch.send({"op": "publish", "exchange": "", "routing_key": address, "body": "from channel"})
            await ch.expect("ack", delivery_tag=1)
            method, _props, body = await c.message()
            assert isinstance(method, Basic.Deliver) and body == b"from channel"
            assert method.routing_key == address


async def test_a_vanished_requester_and_a_forged_address(app: Any) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        async with open_amqp(app) as c, open_amqp(app) as server:
            address = await requester(c)
            other = await requester(c, 2, "other")
            await server.open_channel(1)
            forged = address[:-1] + ("9" if address[-1] != "9" else "8")
            wrong_secret = f"{REPLY_TO}.guess.{address.rsplit('.', 1)[1]}"
            for key in (forged, wrong_secret):
                await server.publish(1, "", key, b"forged", mandatory=True)
                method, _p, body = await server.message()
                assert isinstance(method, Basic.Return) and (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
                assert body == b"forged"
                await server.send(1, commands.Queue.Declare(queue=key, passive=True))
                assert await server.closed_with(1) == (404, f"NOT_FOUND - no queue '{key}' in vhost '/'")
                await server.open_channel(1)
            # a mandatory reply is returned even though it was delivered (RabbitMQ 3.10)
            await server.publish(1, "", other, b"to other", mandatory=True)
            method, _p, _b = await server.message()
            assert isinstance(method, Basic.Return) and method.reply_code == 312
            method, _p, body = await c.message()
            assert (method.consumer_tag, body) == ("other", b"to other")  # nothing went to channel 1
            # the requester's channel ends: its address is gone
            await c.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            await c.expect(commands.Channel.CloseOk, 1)
            await server.publish(1, "", address, b"late", mandatory=True)
            method, _p, _b = await server.message()
            assert isinstance(method, Basic.Return) and method.reply_code == 312
            await server.send(1, commands.Queue.Declare(queue=address, passive=True))
            assert (await server.closed_with(1))[0] == 404


async def test_refusals_match_rabbitmq(app: Any) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.send(1, Basic.Consume(queue=REPLY_TO, no_ack=False))
            assert await c.closed_with(1) == (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
            await c.open_channel(1)
            await c.send(1, Basic.Consume(queue=REPLY_TO, no_ack=True))
            tag = (await c.expect(Basic.ConsumeOk, 1)).consumer_tag
            assert tag.startswith("amq.ctag-")
            await c.send(1, Basic.Consume(queue=REPLY_TO, no_ack=True))
            assert await c.closed_with(1) == (406, "PRECONDITION_FAILED - reply consumer already set")
            # a request with reply_to on a channel without the reply consumer
            await c.open_channel(1)
            await c.declare(1, "rpc")
            await c.publish(1, "", "rpc", b"req", properties=Basic.Properties(reply_to=REPLY_TO))
            assert await c.closed_with(1) == (406, "PRECONDITION_FAILED - fast reply consumer does not exist")
            assert app.runtime.core.queues["rpc"].ready_count() == 0  # nothing half-applied
            # names that begin like it are the check's, whatever else they are
            await c.open_channel(1)
            for name in (REPLY_TO + "X", REPLY_TO + "."):
                await c.send(1, commands.Queue.Declare(queue=name))
                assert await c.closed_with(1) == (404, f"NOT_FOUND - no queue '{name}' in vhost '/'")
                await c.open_channel(1)
            ok = await c.declare(1, REPLY_TO, passive=True)
            assert (ok.queue, ok.message_count, ok.consumer_count) == (REPLY_TO, 0, 1)
            # a reply_to that is only like it is an ordinary property
            await c.publish(1, "", "rpc", b"req", properties=Basic.Properties(reply_to=REPLY_TO + ".x"))
            await c.send(1, Basic.Get(queue="rpc", no_ack=True))
            _m, props, _b = await c.message()
            assert props.reply_to == REPLY_TO + ".x"
            # a tag in use by another consumer: 530, a connection exception
            await c.send(1, Basic.Consume(queue="rpc", consumer_tag="t"))
            await c.expect(Basic.ConsumeOk, 1)
            await c.send(1, Basic.Consume(queue=REPLY_TO, consumer_tag="t", no_ack=True))
            assert await c.closed_with(None) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 't'")


async def test_cancel_ends_the_address_and_a_new_consume_has_a_new_one(app: Any) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        async with open_amqp(app) as c:
            address = await requester(c)
            await c.send(1, Basic.Cancel(consumer_tag="replies"))
            await c.expect(Basic.CancelOk, 1)
            await c.publish(1, "", address, b"after cancel")
            await c.send(1, commands.Queue.Declare(queue=address, passive=True))
            assert (await c.closed_with(1))[0] == 404
            again = await requester(c, 1, "replies")
            assert again != address
            await c.publish(1, "", again, b"to myself")
            method, _p, body = await c.message()
            assert isinstance(method, Basic.Deliver) and body == b"to myself"

"""Direct reply-to with an HTTP channel as the requester (broker/api/channel/replyto.py):
``consume`` of ``amq.rabbitmq.reply-to``, publishes whose ``reply_to`` becomes the
channel's reply address, replies from an HTTP channel, REST and AMQP delivered as
``deliver`` events with delivery tags of their own, the refusals (the AMQP rules,
the channel's error codes, nothing of a refused publish taken), ``cancel``, and a
requester whose input ended. An in-process broker over ``trio.testing`` memory
streams; the AMQP responder is the raw pamqp client of tests/amqp."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from pamqp import commands

from tests.amqp.rawclient import open_amqp
from tests.support.app import MemoryBroker
from tests.support.channel import ChannelClient, Clients, rest
from tests.support.memory_fixtures import broker, clients  # noqa: F401 (fixtures)

REPLY_TO = "amq.rabbitmq.reply-to"
Event = dict[str, Any]


async def requester(clients: Clients, tag: str = "replies", **headers: Any) -> tuple[ChannelClient, str]:
    """A channel with a reply consumer that published one request to ``rpc``; (the
    channel, the address its request's ``reply_to`` was given)."""
    ch = await clients.channel(**headers)
    ok = await ch.call({"op": "consume", "queue": REPLY_TO, "consumer_tag": tag, "no_ack": True})
    assert ok == {"ev": "consume_ok", "id": ok["id"], "consumer_tag": tag, "active": True}
    await ch.ok({"op": "declare_queue", "queue": "rpc"})
    await ch.send({"op": "publish", "routing_key": "rpc", "body": "question",
                   "properties": {"reply_to": REPLY_TO, "correlation_id": "c1"}})
    got = await ch.ok({"op": "get", "queue": "rpc", "no_ack": True})
    assert got["ev"] == "get_ok" and got["message"]["body"] == "question"
    address: str = got["message"]["properties"]["reply_to"]
    assert address.startswith(REPLY_TO + ".") and address.endswith(f".{ch.channel_id}")
    assert got["message"]["properties"]["correlation_id"] == "c1"
    return ch, address


def delivers(events: list[Event]) -> list[Event]:
    return [e for e in events if e["ev"] == "deliver"]


async def test_a_round_trip_between_http_channels_each_reply_with_its_own_tag(
    broker: MemoryBroker, clients: Clients
) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        ch, address = await requester(clients)
        # a queue of its own too: its deliveries and the replies share the channel's tags
        await ch.ok({"op": "declare_queue", "queue": "mine"})
        await ch.ok({"op": "consume", "queue": "mine", "consumer_tag": "c", "no_ack": True})
        responder = await clients.channel()
        await responder.send(
            {"op": "publish", "exchange": "", "routing_key": address, "body": "r1",
             "properties": {"correlation_id": "c1"}},
            {"op": "publish", "exchange": "amq.default", "routing_key": address, "body": "r2"},
            {"op": "publish", "routing_key": "mine", "body": "m"},
        )
        got = []
        while len(got) < 3:
            got += delivers([await ch.next_event()])
        first = got[0]
        assert first == {
            "ev": "deliver", "consumer_tag": "replies", "delivery_tag": first["delivery_tag"], "redelivered": False,
            "delivery_count": 0, "exchange": "", "routing_key": address,
            "message": {"body": "r1", "properties": {"correlation_id": "c1"}},
        }
        assert [(d["consumer_tag"], d["message"]["body"]) for d in got] == [("replies", "r1"), ("replies", "r2"), ("c", "m")]
        tags = [d["delivery_tag"] for d in got]
        assert tags == sorted(set(tags)), tags  # every delivery its own tag, in order
        # nothing was a queue, nothing stayed, nothing to settle
        assert not any(name.startswith(REPLY_TO) for name in broker.runtime.core.queues)
        assert broker.runtime.core.views.channel_settled(ch.channel_id)


async def test_a_reply_from_rest_and_from_amqp(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        ch, address = await requester(clients)
        status, answer = await rest(broker.connect(), "POST", f"/exchanges/amq.default/publish?routing_key={address}",
                                    b"from rest", headers=[("X-Correlation-Id", "c1")])
        assert status == 200 and answer["confirm"] == "ack", answer
        [d] = delivers(await ch.events_until(lambda e: e["ev"] == "deliver"))
        assert (d["routing_key"], d["message"]["body"], d["message"]["properties"]["correlation_id"]) == (
            address, "from rest", "c1")
        async with open_amqp(broker.app) as amqp:
            await amqp.open_channel(1)
            await amqp.publish(1, "", address, b"from amqp",
                               properties=commands.Basic.Properties(correlation_id="c2", content_type="text/plain"))
            [d] = delivers(await ch.events_until(lambda e: e["ev"] == "deliver"))
        assert (d["consumer_tag"], d["exchange"], d["routing_key"]) == ("replies", "", address)
        assert d["message"] == {"body": "from amqp", "properties": {"correlation_id": "c2", "content_type": "text/plain"}}


async def test_an_amqp_responder_sees_the_address_and_batches_carry_replies(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        ch = await clients.channel(headers=[("Ackbus-Features", "batches")])
        await ch.ok({"op": "consume", "queue": REPLY_TO, "no_ack": True})
        async with open_amqp(broker.app) as amqp:
            await amqp.open_channel(1)
            await amqp.declare(1, "rpc")
            await ch.send({"op": "publish", "routing_key": "rpc", "body": "q",
                           "properties": {"reply_to": REPLY_TO}})
            await ch.sync()
            await amqp.send(1, commands.Basic.Get(queue="rpc", no_ack=True))
            _method, props, body = await amqp.message()
            assert body == b"q" and props.reply_to.startswith(REPLY_TO + ".")
            await amqp.publish(1, "", props.reply_to, b"a")
            event = await ch.next_event()
        assert event["ev"] == "deliveries", event
        [[tag, _delivery_tag, redelivered, count, exchange, key, _props, text]] = event["d"]
        assert tag.startswith("amq.ctag-")  # generated, as RabbitMQ names them
        assert (redelivered, count, exchange, key, text) == (False, 0, "", props.reply_to, "a")


async def test_the_refusals(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        error = await ch.call({"op": "consume", "queue": REPLY_TO})  # manual acks
        assert (error["ev"], error["error"], error["message"]) == (
            "error", "precondition_failed", "reply consumer cannot acknowledge")
        ch = await clients.channel()
        await ch.ok({"op": "consume", "queue": REPLY_TO, "no_ack": True})
        error = await ch.call({"op": "consume", "queue": REPLY_TO, "no_ack": True})
        assert (error["error"], error["message"]) == ("precondition_failed", "reply consumer already set")
        ch = await clients.channel()
        await ch.ok({"op": "declare_queue", "queue": "rpc"})
        await ch.ok({"op": "consume", "queue": "rpc", "consumer_tag": "t"})
        error = await ch.call({"op": "consume", "queue": REPLY_TO, "consumer_tag": "t", "no_ack": True})
        assert (error["error"], error["message"]) == (
            "not_allowed", "consumer tag 't' is already in use on this channel")


@pytest.mark.parametrize("tx", [False, True])
async def test_a_request_without_a_reply_consumer_is_refused_and_nothing_of_it_taken(
    broker: MemoryBroker, clients: Clients, tx: bool
) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        await ch.ok({"op": "declare_queue", "queue": "rpc"})
        if tx:
            await ch.ok({"op": "tx_select"})
        # one chunk: the publishes before the refused one are taken (typed path first)
        await ch.send(
            {"op": "publish", "routing_key": "rpc", "body": "before", "properties": {"message_id": "a"}},
            {"op": "publish", "routing_key": "rpc", "body": "refused", "properties": {"reply_to": REPLY_TO}, "id": 9},
            {"op": "publish", "routing_key": "rpc", "body": "after"},
        )
        events = await ch.remaining_events()
        assert events[-1] == {"ev": "error", "id": 9, "error": "precondition_failed",
                              "message": "fast reply consumer does not exist"}
        queue = broker.runtime.core.queues["rpc"]
        if tx:  # the transaction ended with the channel: nothing of it
            assert queue.ready_count() == 0
        else:
            assert [e["ev"] for e in events[:-1]] == ["ack"] and queue.ready_count() == 1


async def test_a_transactions_request_carries_the_address_at_the_commit(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch, address = await requester(clients)
        await ch.ok({"op": "tx_select"})
        await ch.send({"op": "publish", "routing_key": "rpc", "body": "in tx", "properties": {"reply_to": REPLY_TO}})
        assert broker.runtime.core.queues["rpc"].ready_count() == 0  # held
        await ch.ok({"op": "tx_commit"})
        got = await ch.ok({"op": "get", "queue": "rpc", "no_ack": True})
        assert (got["message"]["body"], got["message"]["properties"]["reply_to"]) == ("in tx", address)


async def test_cancel_ends_the_address_and_a_new_consume_has_a_new_one(clients: Clients) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        ch, address = await requester(clients)
        cancelled = await ch.call({"op": "cancel", "consumer_tag": "replies"})
        assert (cancelled["ev"], cancelled["consumer_tag"]) == ("cancel_ok", "replies")
        responder = await clients.channel()
        await responder.send({"op": "publish", "routing_key": address, "body": "late", "mandatory": True})
        assert [e["ev"] for e in await responder.events_until(lambda e: e["ev"] == "ack")] == ["return", "ack"]
        assert not delivers(await ch.sync())
        await ch.ok({"op": "consume", "queue": REPLY_TO, "consumer_tag": "replies", "no_ack": True})
        await ch.send({"op": "publish", "routing_key": "rpc", "body": "again", "properties": {"reply_to": REPLY_TO}})
        got = await ch.ok({"op": "get", "queue": "rpc", "no_ack": True})
        again = got["message"]["properties"]["reply_to"]
        assert again != address and again.startswith(REPLY_TO + ".")
        await responder.send({"op": "publish", "routing_key": again, "body": "to the new one"})
        [d] = delivers(await ch.events_until(lambda e: e["ev"] == "deliver"))
        assert d["message"]["body"] == "to the new one"
        # a reply is no delivery to settle: its tag is unknown to ack
        await ch.send({"op": "ack", "delivery_tag": d["delivery_tag"]})
        error = (await ch.remaining_events())[-1]
        assert error["error"] == "unknown_delivery_tag", error


async def test_a_requester_whose_input_ended_still_receives_its_replies(
    broker: MemoryBroker, clients: Clients
) -> None:
    with trio.fail_after(10):  # (a reply that never comes fails, not hangs)
        ch, address = await requester(clients)
        await ch.end_body()  # as curl does, piping its ops
        responder = await clients.channel()
        await responder.send({"op": "publish", "routing_key": address, "body": "answer"})
        [d] = delivers(await ch.events_until(lambda e: e["ev"] == "deliver"))
        assert d["message"]["body"] == "answer"
        assert broker.runtime.core.views.reply_address(ch.channel_id) == address

"""Direct reply-to's declare check on an HTTP channel (broker/api/channel/reply_declare.py):
``declare_queue`` of ``amq.rabbitmq.reply-to`` and of reply addresses, passive or
not, answers as the AMQP listener's ``queue.declare`` does, for the pseudo-queue and
for an address alive and gone, compared answer for answer with a raw AMQP client on
the same broker; and REST's queue calls, which keep knowing no such queue (as
RabbitMQ's management API). An in-process broker over ``trio.testing`` memory streams.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from pamqp import commands

from tests.amqp.rawclient import open_amqp
from tests.support.app import MemoryBroker
from tests.support.channel import ChannelClient, ChannelEnded, Clients
from tests.support.memory_fixtures import broker, clients  # noqa: F401 (fixtures)
from tests.support.security import NONE, add_user
from tests.support.wait import wait_until

REPLY_TO = "amq.rabbitmq.reply-to"
Answer = tuple[Any, ...]


async def http_answer(ch: ChannelClient, name: str, passive: bool) -> Answer:
    """``declare_queue`` of ``name``: ("ok", queue, messages, consumers) or
    ("not_found",) (a channel error: the channel has ended)."""
    event = await ch.call({"op": "declare_queue", "queue": name, "passive": passive})
    if event["ev"] == "error":
        assert (event["error"], event["message"]) == ("not_found", f"no queue {name!r}"), event
        with pytest.raises(ChannelEnded):  # as every channel error, it ends the channel
            await ch.next_event()
        return ("not_found",)
    assert event["ev"] == "ok" and event["op"] == "declare_queue", event
    assert event["created"] is False, event
    return ("ok", event["queue"], event["messages"], event["consumers"])


async def amqp_answer(amqp: Any, name: str, passive: bool) -> Answer:
    """``queue.declare`` of ``name`` on channel 1: ("ok", queue, messages, consumers) or
    ("not_found",) (the 404 closes the channel: it is opened again)."""
    await amqp.send(1, commands.Queue.Declare(queue=name, passive=passive))
    _channel, method = await amqp.recv()
    if isinstance(method, commands.Channel.Close):
        assert (method.reply_code, method.reply_text) == (404, f"NOT_FOUND - no queue '{name}' in vhost '/'")
        await amqp.send(1, commands.Channel.CloseOk())
        await amqp.open_channel(1)
        return ("not_found",)
    assert isinstance(method, commands.Queue.DeclareOk), method
    return ("ok", method.queue, method.message_count, method.consumer_count)


async def test_the_pseudo_queue_and_a_live_address_are_there_passive_or_not(
    broker: MemoryBroker, clients: Clients
) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        asker = await clients.channel()
        for passive in (True, False):
            assert await http_answer(asker, REPLY_TO, passive) == ("ok", REPLY_TO, 0, 1)
        requester = await clients.channel()
        await requester.ok({"op": "consume", "queue": REPLY_TO, "consumer_tag": "replies", "no_ack": True})
        address = broker.runtime.core.views.reply_address(requester.channel_id)
        assert address is not None
        for ch in (requester, asker):  # the requester itself, and any other channel
            for passive in (True, False):
                assert await http_answer(ch, address, passive) == ("ok", address, 0, 1)
        # nothing was declared: no queue of these names, nothing logged as one
        assert not any(name.startswith(REPLY_TO) for name in broker.runtime.core.queues)


async def test_a_gone_address_and_names_only_like_it_are_not_found(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        asker = await clients.channel()
        requester = await clients.channel()
        await requester.ok({"op": "consume", "queue": REPLY_TO, "consumer_tag": "replies", "no_ack": True})
        cancelled = broker.runtime.core.views.reply_address(requester.channel_id)
        assert cancelled is not None
        await requester.ok({"op": "cancel", "consumer_tag": "replies"})
        await requester.ok({"op": "consume", "queue": REPLY_TO, "consumer_tag": "again", "no_ack": True})
        ended = broker.runtime.core.views.reply_address(requester.channel_id)
        assert ended is not None and ended != cancelled
        assert await http_answer(asker, ended, True) == ("ok", ended, 0, 1)
        await requester.abort()
        await wait_until(lambda: not broker.runtime.core.views.reply_exists(ended), 5,
                         what="the ended requester's address gone")
        for name in (cancelled, ended, REPLY_TO + "X", REPLY_TO + ".", REPLY_TO + ".forged.1"):
            for passive in (True, False):
                assert await http_answer(await clients.channel(), name, passive) == ("not_found",), name
        # nothing was declared
        assert not any(name.startswith(REPLY_TO) for name in broker.runtime.core.queues)


async def test_http_and_amqp_answer_alike(broker: MemoryBroker, clients: Clients) -> None:
    """The same questions over both protocols, for each state of an address: the same
    answers (RabbitMQ 3.10's: tests/system/test_amqp_reply_to_differential.py)."""
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        async with open_amqp(broker.app) as amqp:
            await amqp.open_channel(1)
            requester = await clients.channel()
            await requester.ok({"op": "consume", "queue": REPLY_TO, "consumer_tag": "replies", "no_ack": True})
            address = broker.runtime.core.views.reply_address(requester.channel_id)
            assert address is not None

            async def both(name: str) -> list[Answer]:
                """Passive, then not: over HTTP (a new channel each, as a not_found
                ends it), then over AMQP."""
                answers = []
                for passive in (True, False):
                    answers.append(await http_answer(await clients.channel(), name, passive))
                    answers.append(await amqp_answer(amqp, name, passive))
                return answers

            assert await both(REPLY_TO) == [("ok", REPLY_TO, 0, 1)] * 4
            assert await both(address) == [("ok", address, 0, 1)] * 4
            await requester.ok({"op": "cancel", "consumer_tag": "replies"})
            assert await both(address) == [("not_found",)] * 4
            assert await both(REPLY_TO + "X") == [("not_found",)] * 4


async def test_rest_knows_no_such_queue(broker: MemoryBroker, clients: Clients) -> None:
    """REST's queue calls are of queues, as RabbitMQ's management API: the pseudo-queue
    and a live reply address are no queue there (404), and a declare of them is not
    the channel's check."""
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        requester = await clients.channel()
        await requester.ok({"op": "consume", "queue": REPLY_TO, "consumer_tag": "replies", "no_ack": True})
        address = broker.runtime.core.views.reply_address(requester.channel_id)
        assert address is not None
        for name in (REPLY_TO, address):
            status, body = await clients.rest("GET", f"/queues/{name}")
            assert (status, body["error"]) == (404, "not_found"), body
            status, body = await clients.rest("PUT", f"/queues/{name}", {"passive": True})
            assert (status, body["error"]) == (404, "not_found"), body
            status, body = await clients.rest("PUT", f"/queues/{name}", {})
            assert (status, body["error"]) == (403, "access_refused"), body
        assert not any(name.startswith(REPLY_TO) for name in broker.runtime.core.queues)


async def test_no_permission_is_asked(broker: MemoryBroker, clients: Clients) -> None:
    """As over AMQP (and as for ``consume`` of the pseudo-queue): the check touches no
    queue, so a user who may configure nothing still asks it."""
    creds = add_user(broker.runtime.core, "nobody", permissions=NONE)
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel(headers=creds)
        assert await http_answer(ch, REPLY_TO, False) == ("ok", REPLY_TO, 0, 1)
        refused = await ch.call({"op": "declare_queue", "queue": "mine"})
        assert (refused["ev"], refused["error"]) == ("error", "access_refused"), refused

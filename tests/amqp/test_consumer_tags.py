"""An AMQP channel's consumer tags name one consumer each, a queue consumer's or the
direct reply-to consumer's (one answer to "is this tag taken", the core's:
broker/core/consumertags.py): a ``basic.consume`` of a tag in use is RabbitMQ's
connection exception ``530 NOT_ALLOWED - attempt to reuse consumer tag '…'``, and a
cancelled consumer's tag is free again. Relayed consumers' cells (cluster mode) are
tests/cluster/test_consumer_tag_holders.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from pamqp import commands

from tests.amqp.rawclient import open_amqp

Basic = commands.Basic
REPLY_TO = "amq.rabbitmq.reply-to"
QUEUE = Basic.Consume(queue="q", consumer_tag="t")
REPLY = Basic.Consume(queue=REPLY_TO, consumer_tag="t", no_ack=True)


@pytest.mark.parametrize(
    ("first", "second"),
    [(QUEUE, QUEUE), (QUEUE, REPLY), (REPLY, QUEUE)],
    ids=["queue-then-queue", "queue-then-reply", "reply-then-queue"],
)
async def test_a_tag_in_use_is_530(app: Any, first: Basic.Consume, second: Basic.Consume) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.declare(1, "q")
            await c.send(1, first)
            await c.expect(Basic.ConsumeOk, 1)
            await c.send(1, second)
            assert await c.closed_with(None) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 't'")


async def test_a_cancelled_consumers_tag_is_free_again_for_either_kind(app: Any) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.declare(1, "q")
            for first, second in ((QUEUE, REPLY), (REPLY, QUEUE), (QUEUE, QUEUE)):
                await c.send(1, first)
                await c.expect(Basic.ConsumeOk, 1)
                await c.send(1, Basic.Cancel(consumer_tag="t"))
                await c.expect(Basic.CancelOk, 1)
                await c.send(1, second)
                assert (await c.expect(Basic.ConsumeOk, 1)).consumer_tag == "t"
                await c.send(1, Basic.Cancel(consumer_tag="t"))
                await c.expect(Basic.CancelOk, 1)


async def test_tags_are_per_channel(app: Any) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        async with open_amqp(app) as c:
            for channel, first in ((1, QUEUE), (2, REPLY), (3, QUEUE)):
                await c.open_channel(channel)
                await c.declare(channel, "q")
                await c.send(channel, first)
                assert (await c.expect(Basic.ConsumeOk, channel)).consumer_tag == "t"

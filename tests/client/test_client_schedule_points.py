"""Settling and iterating pass a trio schedule point once every YIELD_EVERY calls, not
on every call (docs/client.md, "Batching"), so a loop of acks queues them all before
the channel's writer runs; and still at least that often, so such a loop never starves
other tasks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest
import trio

import client
from client.codec import Properties
from client.consumer import YIELD_EVERY, Message, MessageStream, Settler
from tests.client.fakebroker import FakeBroker

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["trio"])]


class UnusedSettler:
    """A settler for messages that are only iterated here, never settled."""

    async def settle(self, message: Message, op: str, requeue: bool, delay_s: float | None = None) -> bool:
        raise AssertionError("not settled in these tests")

    def touch(self, message: Message) -> bool:
        raise AssertionError("not touched in these tests")


def make_message(settler: Settler, tag: int) -> Message:
    return Message(
        settler, 1, body=b"x", properties=Properties(), exchange="", routing_key="q",
        redelivered=False, delivery_tag=tag, consumer_tag="c",
    )


class StepCounter(trio.abc.Instrument):
    """Counts the steps a task runs: every schedule point it passes starts a new one."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


async def schedule_points(work: Callable[[], Awaitable[None]]) -> int:
    """How many schedule points ``work()`` passed."""
    counter = StepCounter(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(counter)
    try:
        await work()
    finally:
        trio.lowlevel.remove_instrument(counter)
    return counter.steps


async def test_acks_yield_once_every_yield_every_calls(conn: client.Connection, fake: FakeBroker) -> None:
    count = 3 * YIELD_EVERY
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        for i in range(count):
            await ch.start_publish("", "q", b"m%d" % i)
        await ch.wait_for_confirms()
        async with ch.consume("q", prefetch=0) as stream:
            messages = [await stream.receive() for _ in range(count)]

            async def ack_all() -> None:
                for message in messages:
                    assert await message.ack()

            steps = await schedule_points(ack_all)
            with anyio.fail_after(5):
                while len(fake.acked_ids) < count:
                    await anyio.sleep(0.01)
    assert sorted(fake.acked_ids) == sorted(m.message_id for m in messages)
    assert steps == 3  # one schedule point per YIELD_EVERY acks: not 48, not 0


async def test_stream_yields_once_every_yield_every_messages_while_it_has_some() -> None:
    settler = UnusedSettler()
    stream = MessageStream("q", "c", prefetch=0, no_ack=False, exclusive=False, arguments=None)
    for tag in range(1, 2 * YIELD_EVERY + 1):
        stream.push(make_message(settler, tag))

    async def take_all() -> None:
        for tag in range(1, 2 * YIELD_EVERY + 1):
            assert (await stream.receive()).delivery_tag == tag

    assert await schedule_points(take_all) == 2


async def test_start_publish_yields_once_every_yield_every_calls(conn: client.Connection) -> None:
    async with conn.channel(max_pending=10 * YIELD_EVERY) as ch:
        await ch.declare_queue("q")

        async def publish_all() -> None:
            for i in range(3 * YIELD_EVERY):
                await ch.start_publish("", "q", b"m%d" % i)

        # the window never fills, so only the every-YIELD_EVERY schedule points remain
        assert await schedule_points(publish_all) == 3
        await ch.wait_for_confirms()

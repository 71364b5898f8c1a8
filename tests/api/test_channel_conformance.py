"""The channel protocol and the REST calls the client uses, as both the real broker
and the client tests' fake broker (``tests/client/fakebroker.py``) speak them: the same
tests run against each, so the fake the client is tested against cannot drift from the
broker it stands in for (in the manner of trio's ``testing/_check_streams.py``).

Every behaviour the fake models is checked here against both: confirms in tag order
(coalesced or not), returns, nacks of unknown exchanges, dedup of a resent
``message_id``, prefetch, single and multiple acks, nacks and rejects with and
without requeue, redelivery after a channel ends, confirms held until the disk (or the
fake's knob) releases them, and REST declare/get/ack/nack. Each implementation comes
as a :class:`Target`: how to connect, and how to hold and release confirms.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio.abc
import pytest
import trio

from client.endpoint import Endpoint
from client.transport import receive_some
from tests.client.fakebroker import open_fake_broker
from tests.support.app import open_memory_broker
from tests.support.channel import ChannelClient, open_channel
from tests.support.fakewal import FakeWAL, attach_fake_wal
from tests.support.http import HTTPConnection

OpenStream = Callable[[], Awaitable[trio.abc.Stream]]


@dataclass
class Target:
    """One implementation of the protocol under test."""

    connect: OpenStream
    #: from now on, confirms wait until release_confirms()
    hold_confirms: Callable[[], None]
    release_confirms: Callable[[], None]


@asynccontextmanager
async def _real() -> AsyncIterator[Target]:
    async with open_memory_broker() as broker:
        held: list[FakeWAL] = []

        async def connect() -> trio.abc.Stream:
            return broker.connect()

        def hold() -> None:
            # a log whose disk the test drives: persistent publishes wait for it
            held.append(attach_fake_wal(broker.runtime))

        def release() -> None:
            held[-1].make_durable()

        yield Target(connect, hold, release)


class _TrioFace(trio.abc.Stream):
    """The fake broker's (anyio) byte stream with the trio stream methods the channel
    test client calls."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._stream = stream

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send(bytes(data))

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await receive_some(self._stream, max_bytes or 65536)

    async def aclose(self) -> None:
        await self._stream.aclose()


@asynccontextmanager
async def _fake() -> AsyncIterator[Target]:
    async with open_fake_broker() as fake:
        endpoint = Endpoint.parse("http://fake.invalid:8080")

        async def connect() -> trio.abc.Stream:
            return _TrioFace(await fake.open_stream(endpoint))

        def hold() -> None:
            fake.hold_confirms = True

        def release() -> None:
            fake.hold_confirms = False
            fake.release_confirms()

        yield Target(connect, hold, release)


@pytest.fixture(params=[_real, _fake], ids=["broker", "fakebroker"])
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    async with request.param() as target:
        yield target


@pytest.fixture
async def channel(target: Target) -> ChannelClient:
    return await open_channel(await target.connect())


async def _rest(target: Target, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One REST request on a connection of its own: (status, JSON body)."""
    conn = HTTPConnection(await target.connect())
    try:
        if body is None:
            reply = await conn.request(method, path, body=b"")
        else:
            reply = await conn.request(method, path, json=body)
        return reply.status, reply.json()
    finally:
        await conn.aclose()


async def _queue(target: Target, name: str) -> dict[str, Any]:
    status, info = await _rest(target, "GET", f"/queues/{name}")
    assert status == 200, info
    return info


async def _until(ch: ChannelClient, ev: str) -> list[dict[str, Any]]:
    return await ch.events_until(lambda e: e["ev"] == ev)


async def _acked_through(ch: ChannelClient, tag: int) -> list[dict[str, Any]]:
    """Events until every publish tag up to ``tag`` is acked (coalesced or not)."""
    seen: list[dict[str, Any]] = []
    done = 0
    while done < tag:
        event = await ch.next_event()
        seen.append(event)
        if event["ev"] == "ack":
            done = event["delivery_tag"] if event["multiple"] else done + 1
    return seen


async def test_publishes_are_acked_in_tag_order(channel: ChannelClient) -> None:
    await channel.ok({"op": "declare_queue", "queue": "q"})
    await channel.send(*({"op": "publish", "routing_key": "q", "body": f"m{i}"} for i in range(3)))
    events = await _acked_through(channel, 3)
    assert [e["ev"] for e in events if e["ev"] != "ack"] == []


async def test_an_unroutable_mandatory_publish_is_returned_before_its_ack(channel: ChannelClient) -> None:
    await channel.send({"op": "publish", "routing_key": "nowhere", "body": "x", "mandatory": True})
    events = await _acked_through(channel, 1)
    assert [e["ev"] for e in events] == ["return", "ack"]
    assert events[0]["delivery_tag"] == 1 and events[0]["routing_key"] == "nowhere"


async def test_a_publish_to_an_unknown_exchange_is_nacked_and_the_channel_goes_on(
    channel: ChannelClient,
) -> None:
    await channel.send({"op": "publish", "exchange": "no-such", "routing_key": "q", "body": "x"})
    nack = await channel.expect("nack")
    assert nack["delivery_tag"] == 1 and "no-such" in nack["reason"]
    await channel.ok({"op": "declare_queue", "queue": "still-open"})


async def test_consume_deliver_ack_and_a_requeued_message_comes_back_redelivered(
    channel: ChannelClient,
) -> None:
    await channel.ok({"op": "declare_queue", "queue": "w"})
    await channel.send({"op": "publish", "routing_key": "w", "body": "job"})
    await _acked_through(channel, 1)
    await channel.send({"op": "consume", "queue": "w", "consumer_tag": "c", "prefetch": 1, "id": 7})
    events = await _until(channel, "deliver")
    assert [e["ev"] for e in events] == ["consume_ok", "deliver"]
    first = events[-1]
    assert first["redelivered"] is False and first["message"]["body"] == "job"
    await channel.send({"op": "nack", "delivery_tag": first["delivery_tag"], "requeue": True})
    again = await channel.expect("deliver")
    assert again["redelivered"] is True and again["message"]["body"] == "job"
    await channel.send({"op": "ack", "delivery_tag": again["delivery_tag"]})
    await channel.send({"op": "cancel", "consumer_tag": "c", "id": 8})
    assert (await _until(channel, "cancel_ok"))[-1]["consumer_tag"] == "c"


async def test_close_answers_close_ok_and_ends_the_response(channel: ChannelClient) -> None:
    await channel.send({"op": "close", "id": 1})
    assert (await channel.expect("close_ok"))["id"] == 1
    assert await channel.remaining_events() == []


async def test_an_unknown_op_is_an_error_event(channel: ChannelClient) -> None:
    await channel.send({"op": "frobnicate", "id": 3})
    error = await channel.expect("error")
    assert error["error"] == "unknown_op" and error["id"] == 3


async def _publish_and_confirm(ch: ChannelClient, queue: str, bodies: list[str], **extra: Any) -> None:
    await ch.send(*({"op": "publish", "routing_key": queue, "body": b, **extra} for b in bodies))


async def _deliveries(ch: ChannelClient) -> list[dict[str, Any]]:
    """The deliveries among the events caused by the ops sent so far."""
    return [e for e in await ch.sync() if e["ev"] == "deliver"]


async def _consume(ch: ChannelClient, queue: str, prefetch: int, tag: str = "c") -> None:
    reply = await ch.call({"op": "consume", "queue": queue, "consumer_tag": tag, "prefetch": prefetch})
    assert reply["ev"] == "consume_ok" and reply["consumer_tag"] == tag, reply


# -- publishing ----------------------------------------------------------------------------


async def test_a_resent_message_id_is_acked_again_but_queued_once(target: Target, channel: ChannelClient) -> None:
    await channel.ok({"op": "declare_queue", "queue": "dd"})
    once = {"op": "publish", "routing_key": "dd", "body": "x", "properties": {"message_id": "m-1"}}
    other = {"op": "publish", "routing_key": "dd", "body": "y", "properties": {"message_id": "m-2"}}
    await channel.send(once, once, other)
    events = await _acked_through(channel, 3)
    assert {e["ev"] for e in events} == {"ack"}
    assert (await _queue(target, "dd"))["messages_ready"] == 2


async def test_confirms_wait_while_held_and_come_in_tag_order_once_released(
    target: Target, channel: ChannelClient
) -> None:
    await channel.ok({"op": "declare_queue", "queue": "held", "durable": True})
    target.hold_confirms()
    await _publish_and_confirm(channel, "held", ["1", "2", "3"])
    assert await channel.sync() == []  # replies are not held up behind the confirms
    target.release_confirms()
    events = await _acked_through(channel, 3)
    assert [e["ev"] for e in events] == ["ack"] * len(events)
    tags = [e["delivery_tag"] for e in events]
    assert tags == sorted(tags) and tags[-1] == 3


# -- consuming -----------------------------------------------------------------------------


async def test_prefetch_bounds_the_unacked_deliveries_of_a_consumer(target: Target, channel: ChannelClient) -> None:
    await channel.ok({"op": "declare_queue", "queue": "pf"})
    await _publish_and_confirm(channel, "pf", [f"m{i}" for i in range(5)])
    await _acked_through(channel, 5)
    await _consume(channel, "pf", prefetch=2)
    first = await _deliveries(channel)
    assert [d["message"]["body"] for d in first] == ["m0", "m1"]
    await channel.send({"op": "ack", "delivery_tag": first[0]["delivery_tag"]})
    [third] = await _deliveries(channel)
    assert third["message"]["body"] == "m2"
    info = await _queue(target, "pf")
    assert (info["messages_ready"], info["messages_unacked"], info["consumers"]) == (2, 2, 1)


async def test_a_multiple_ack_settles_every_delivery_up_to_its_tag(target: Target, channel: ChannelClient) -> None:
    await channel.ok({"op": "declare_queue", "queue": "ma"})
    await _publish_and_confirm(channel, "ma", ["a", "b", "c", "d"])
    await _acked_through(channel, 4)
    await _consume(channel, "ma", prefetch=3)
    delivered = await _deliveries(channel)
    assert len(delivered) == 3
    await channel.send({"op": "ack", "delivery_tag": delivered[1]["delivery_tag"], "multiple": True})
    [fourth] = await _deliveries(channel)  # two slots free, one message left
    assert fourth["message"]["body"] == "d"
    info = await _queue(target, "ma")
    assert (info["messages_ready"], info["messages_unacked"]) == (0, 2)


async def test_nack_and_reject_without_requeue_drop_and_with_requeue_redeliver(
    target: Target, channel: ChannelClient
) -> None:
    await channel.ok({"op": "declare_queue", "queue": "nk"})
    await _publish_and_confirm(channel, "nk", ["drop-nack", "drop-reject", "again1", "again2"])
    await _acked_through(channel, 4)
    await _consume(channel, "nk", prefetch=4)
    d = await _deliveries(channel)
    assert [x["message"]["body"] for x in d] == ["drop-nack", "drop-reject", "again1", "again2"]
    await channel.send({"op": "nack", "delivery_tag": d[0]["delivery_tag"], "requeue": False})
    await channel.send({"op": "reject", "delivery_tag": d[1]["delivery_tag"], "requeue": False})
    assert await _deliveries(channel) == []
    await channel.send({"op": "nack", "delivery_tag": d[3]["delivery_tag"], "multiple": True, "requeue": True})
    again = await _deliveries(channel)
    assert sorted(x["message"]["body"] for x in again) == ["again1", "again2"]
    assert all(x["redelivered"] for x in again)
    await channel.send({"op": "ack", "delivery_tag": again[-1]["delivery_tag"], "multiple": True})
    await channel.sync()
    info = await _queue(target, "nk")
    assert (info["messages_ready"], info["messages_unacked"]) == (0, 0)


async def test_acking_an_unknown_delivery_tag_is_a_channel_error(channel: ChannelClient) -> None:
    await channel.send({"op": "ack", "delivery_tag": 99, "id": "x"})
    error = await channel.expect("error")
    assert error["error"] == "unknown_delivery_tag"
    assert await channel.remaining_events() == []


async def test_unacked_deliveries_come_back_redelivered_after_the_channel_ends(target: Target) -> None:
    first = await open_channel(await target.connect())
    await first.ok({"op": "declare_queue", "queue": "rd"})
    await _publish_and_confirm(first, "rd", ["x", "y"])
    await _acked_through(first, 2)
    await _consume(first, "rd", prefetch=0)
    assert len(await _deliveries(first)) == 2
    await first.send({"op": "close", "id": "bye"})
    await first.expect("close_ok")
    second = await open_channel(await target.connect())
    await _consume(second, "rd", prefetch=0, tag="c2")
    again = await _deliveries(second)
    assert [(d["message"]["body"], d["redelivered"]) for d in again] == [("x", True), ("y", True)]


# -- REST ----------------------------------------------------------------------------------


async def test_rest_declare_get_ack_and_nack(target: Target, channel: ChannelClient) -> None:
    status, _ = await _rest(target, "PUT", "/queues/r", {"durable": True})
    assert status in (200, 201)
    await _publish_and_confirm(channel, "r", ["one", "two", "three"])
    await _acked_through(channel, 3)
    assert (await _queue(target, "r"))["messages_ready"] == 3
    status, got = await _rest(target, "POST", "/queues/r/get?max=2", {})
    assert status == 200
    assert [(m["body"], m["redelivered"]) for m in got["messages"]] == [("one", False), ("two", False)]
    leases = [m["lease_id"] for m in got["messages"]]
    info = await _queue(target, "r")
    assert (info["messages_ready"], info["messages_unacked"]) == (1, 2)
    status, _ = await _rest(target, "POST", "/queues/r/ack", {"lease_ids": leases[:1]})
    assert status == 200
    status, _ = await _rest(target, "POST", "/queues/r/nack", {"lease_ids": leases[1:], "requeue": True})
    assert status == 200
    info = await _queue(target, "r")
    assert (info["messages_ready"], info["messages_unacked"]) == (2, 0)
    status, got = await _rest(target, "POST", "/queues/r/get?max=5", {})
    assert sorted((m["body"], m["redelivered"]) for m in got["messages"]) == [("three", False), ("two", True)]


async def test_rest_on_an_unknown_queue_is_404(target: Target) -> None:
    status, body = await _rest(target, "GET", "/queues/nope")
    assert status == 404 and body["error"] == "not_found"
    status, body = await _rest(target, "POST", "/queues/nope/get", {})
    assert status == 404 and body["error"] == "not_found"


async def test_redeclaring_an_exchange_with_another_type_is_a_channel_error(channel: ChannelClient) -> None:
    await channel.ok({"op": "declare_exchange", "exchange": "x", "type": "fanout"})
    reply = await channel.call({"op": "declare_exchange", "exchange": "x", "type": "direct"})
    assert reply["ev"] == "error" and reply["error"] == "precondition_failed"


async def test_consuming_from_an_unknown_queue_is_a_channel_error(channel: ChannelClient) -> None:
    reply = await channel.call({"op": "consume", "queue": "nowhere", "consumer_tag": "c"})
    assert reply["ev"] == "error" and reply["error"] == "not_found"


async def test_a_bound_fanout_exchange_routes_to_every_queue(target: Target, channel: ChannelClient) -> None:
    await channel.ok({"op": "declare_exchange", "exchange": "fan", "type": "fanout"})
    for queue in ("f1", "f2"):
        await channel.ok({"op": "declare_queue", "queue": queue})
        await channel.ok({"op": "bind", "exchange": "fan", "queue": queue, "routing_key": ""})
    await channel.send({"op": "publish", "exchange": "fan", "routing_key": "any", "body": "b"})
    await _acked_through(channel, 1)
    assert [(await _queue(target, q))["messages_ready"] for q in ("f1", "f2")] == [1, 1]

"""The channel protocol as both the real broker and the client tests' fake broker
(``tests/client/fakebroker.py``) speak it: the same tests run against each, so the
fake the client is tested against cannot drift from the broker it stands in for (in the
manner of trio's ``testing/_check_streams.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.abc
import pytest
import trio

from client.endpoint import Endpoint
from client.transport import receive_some
from tests.client.fakebroker import open_fake_broker
from tests.support.app import open_memory_broker
from tests.support.channel import ChannelClient, open_channel

OpenStream = Callable[[], Awaitable[trio.abc.Stream]]


@asynccontextmanager
async def _real() -> AsyncIterator[OpenStream]:
    async with open_memory_broker() as broker:

        async def connect() -> trio.abc.Stream:
            return broker.connect()

        yield connect


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
async def _fake() -> AsyncIterator[OpenStream]:
    async with open_fake_broker() as fake:
        endpoint = Endpoint.parse("http://fake.invalid:8080")

        async def connect() -> trio.abc.Stream:
            return _TrioFace(await fake.open_stream(endpoint))

        yield connect


@pytest.fixture(params=[_real, _fake], ids=["broker", "fakebroker"])
async def channel(request: pytest.FixtureRequest) -> AsyncIterator[ChannelClient]:
    async with request.param() as connect:
        ch = await open_channel(await connect())
        yield ch


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

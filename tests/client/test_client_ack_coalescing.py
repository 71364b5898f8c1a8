"""Acks of deliveries settled in order leave as one ``multiple`` ack per run
(``SessionLink.send_ack``): fewer ops for the broker, the same outcome as one ack
per message, and never an ack that covers a delivery the consumer has not settled."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

import client
from tests.client.fakebroker import FakeBroker
from tests.support.app import MemoryBroker, open_memory_broker

pytestmark = pytest.mark.anyio


def acks(fake: FakeBroker) -> list[tuple[int, bool]]:
    return [(op["delivery_tag"], bool(op.get("multiple"))) for op in fake.ops_seen if op["op"] == "ack"]


async def fill(ch: client.Channel, queue: str, n: int) -> None:
    await ch.declare_queue(queue)
    for i in range(n):
        ch.publish_nowait("", queue, str(i).encode())
    await ch.wait_for_confirms()


async def test_in_order_acks_coalesce_into_multiple_acks(fake: FakeBroker, conn: client.Connection) -> None:
    async with conn.channel() as ch:
        await fill(ch, "q", 50)
        async with ch.consume("q", prefetch=50) as messages:
            await anyio.wait_all_tasks_blocked()
            got = [await messages.receive() for _ in range(50)]
            for message in got:
                assert await message.ack()
        await anyio.wait_all_tasks_blocked()
        sent = acks(fake)
        assert len(sent) < 50 and all(multiple for _, multiple in sent)
        assert sent[-1][0] == got[-1].delivery_tag
        assert sorted(fake.acked_ids) == sorted(m.message_id for m in got)
        assert fake.bodies("q") == [] and fake.queues["q"].unacked == 0


async def test_an_ack_with_an_earlier_delivery_unsettled_goes_alone(
    fake: FakeBroker, conn: client.Connection
) -> None:
    async with conn.channel() as ch:
        await fill(ch, "q", 3)
        async with ch.consume("q", prefetch=3) as messages:
            await anyio.wait_all_tasks_blocked()
            m1, m2, m3 = [await messages.receive() for _ in range(3)]
            assert await m2.ack()
            await anyio.wait_all_tasks_blocked()
            # m1 is still unsettled: a multiple ack would settle it too
            assert acks(fake) == [(m2.delivery_tag, False)]
            assert fake.queues["q"].unacked == 2
            assert await m1.ack()
            assert await m3.ack()
        await anyio.wait_all_tasks_blocked()
        assert acks(fake)[0] == (m2.delivery_tag, False)
        assert all(multiple for _, multiple in acks(fake)[1:])
        assert fake.queues["q"].unacked == 0 and fake.bodies("q") == []


@pytest.fixture
async def mb() -> AsyncIterator[MemoryBroker]:
    async with open_memory_broker() as broker:
        yield broker


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_coalesced_acks_against_the_real_broker(mb: MemoryBroker) -> None:
    """Acks in order with a nack (requeue) and a reject among them: the broker accepts
    every multiple ack (it checks the tag it names), settles exactly the acked ones,
    and gives the nacked one back."""

    async def open_stream(endpoint: object) -> anyio.abc.ByteStream:
        return mb.connect_client()

    async with client.connect("http://broker.test:8080", open_stream=open_stream) as conn, conn.channel() as ch:
        await fill(ch, "work", 300)
        seen: list[bytes] = []
        with anyio.fail_after(30):  # a message settled by mistake would never come back
            async with ch.consume("work", prefetch=100) as messages:
                async for message in messages:
                    seen.append(message.body)
                    if message.body == b"150" and not message.redelivered:
                        assert await message.nack(requeue=True)
                    elif message.body == b"200":
                        assert await message.reject(requeue=False)
                    else:
                        assert await message.ack()
                    if len(seen) == 301:
                        break
        info = await ch.declare_queue("work", passive=True)
        assert info.messages == 0
        assert sorted(seen) == sorted([str(i).encode() for i in range(300)] + [b"150"])
        assert ch.statistics().reconnects == 0


class _Recording(anyio.abc.ByteStream):
    """A client stream that keeps a copy of what the client sent."""

    def __init__(self, inner: anyio.abc.ByteStream) -> None:
        self.inner, self.sent = inner, bytearray()

    async def send(self, item: bytes) -> None:
        self.sent += item
        await self.inner.send(item)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self.inner.receive(max_bytes)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_out_of_order_acks_leave_as_delivery_tags_lists(mb: MemoryBroker) -> None:
    """Against the real broker, which agrees to batches: deliveries acked newest first
    (no ack can be ``multiple``) leave as ``ack`` ops listing many tags, and settle
    exactly those deliveries."""
    streams: list[_Recording] = []

    async def open_stream(endpoint: object) -> anyio.abc.ByteStream:
        streams.append(_Recording(mb.connect_client()))
        return streams[-1]

    async with client.connect("http://broker.test:8080", open_stream=open_stream) as conn, conn.channel() as ch:
        await fill(ch, "rev", 100)
        with anyio.fail_after(30):
            async with ch.consume("rev", prefetch=100) as messages:
                got = [await messages.receive() for _ in range(100)]
                for message in reversed(got[1:]):
                    assert await message.ack()
                await anyio.wait_all_tasks_blocked()
                assert await got[0].ack()
        info = await ch.declare_queue("rev", passive=True)
        assert info.messages == 0 and ch.statistics().reconnects == 0
    sent = b"".join(bytes(s.sent) for s in streams)
    assert sent.count(b'"delivery_tags":[') < 99  # many acks to an op
    assert b'"delivery_tags":[100,99' in sent


def test_the_formatted_multiple_ack_is_the_encoded_one() -> None:
    from client.codec import encode_op
    from client.session import _MULTIPLE_ACK

    for tag in (1, 255, 2**31, 2**63 - 1):
        assert _MULTIPLE_ACK % tag == encode_op({"op": "ack", "delivery_tag": tag, "multiple": True})

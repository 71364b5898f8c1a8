"""Direct reply-to with the client library as the requester (docs/client.md, "RPC
with direct reply-to"): ``consume("amq.rabbitmq.reply-to", no_ack=True)``, requests
published with ``reply_to="amq.rabbitmq.reply-to"``, a responder on another client
channel; and the refusal of a request on a channel without the reply consumer.
Against the real broker in process (memory streams), under trio."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

import client
from client import Properties
from tests.support.app import open_memory_broker

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["trio"])]

REPLY_TO = "amq.rabbitmq.reply-to"


@pytest.fixture
async def conn() -> AsyncIterator[client.Connection]:
    async with open_memory_broker() as mb:

        async def open_stream(endpoint: object) -> anyio.abc.ByteStream:
            return mb.connect_client()

        async with client.connect("http://broker.test:8080", open_stream=open_stream) as c:
            yield c


async def serve(conn: client.Connection, n: int) -> None:
    """A responder: answer ``n`` requests of ``rpc`` (body upper-cased, to their
    ``reply_to``, with their ``correlation_id``)."""
    async with conn.channel() as ch, ch.consume("rpc") as requests:
        for _ in range(n):
            request = await requests.receive()
            props = request.properties
            assert props.reply_to is not None and props.reply_to.startswith(REPLY_TO + ".")
            await ch.publish("", props.reply_to, request.body.upper(),
                             properties=Properties(correlation_id=props.correlation_id))
            await request.ack()


async def test_rpc_through_direct_reply_to(conn: client.Connection) -> None:
    with anyio.fail_after(20):  # (a reply that never comes fails, not hangs)
        async with conn.channel() as ch:
            await ch.declare_queue("rpc")
            async with anyio.create_task_group() as tg, ch.consume(REPLY_TO, no_ack=True) as replies:
                tg.start_soon(serve, conn, 3)
                for n in range(3):
                    await ch.publish("", "rpc", f"call {n}", properties={"reply_to": REPLY_TO, "correlation_id": f"c{n}"})
                got = [await replies.receive() for _ in range(3)]
            assert sorted((m.properties.correlation_id, m.body) for m in got) == [
                (f"c{n}", f"CALL {n}".encode()) for n in range(3)]
            assert {(m.exchange, m.consumer_tag, m.redelivered) for m in got} == {("", replies.consumer_tag, False)}
            assert all(m.routing_key.startswith(REPLY_TO + ".") for m in got)


async def test_a_request_without_the_reply_consumer_is_refused(conn: client.Connection) -> None:
    with anyio.fail_after(20):  # (an answer that never comes fails, not hangs)
        async with conn.channel() as ch:
            await ch.declare_queue("rpc")
            with pytest.raises(client.PublishRefused, match="fast reply consumer does not exist"):
                await ch.publish("", "rpc", "call", properties={"reply_to": REPLY_TO})
            info = await ch.declare_queue("rpc", passive=True)  # (the channel goes on, on a new session)
            assert info.messages == 0

"""Direct reply-to with a real pika (BlockingConnection) against a broker subprocess:
the RPC program of RabbitMQ's documentation, unchanged (a requester consuming
``amq.rabbitmq.reply-to`` with no-ack, a responder replying to ``reply_to``), a
requester that vanished, a made-up address, the no-ack rule and the passive
declare check; and the same RPC with aio-pika, which declares the pseudo-queue
passively before consuming it (docs/amqp.md, "Direct reply-to")."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.broker import BrokerProcess, amqp_broker

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.timeout(120)

REPLY_TO = "amq.rabbitmq.reply-to"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with amqp_broker(tmp_path_factory.mktemp("replyto") / "data") as proc:
        yield proc


def _connect(broker: BrokerProcess) -> Any:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port, heartbeat=0))


def _serve_one(responder: Any, queue: str, timeout_s: float = 10) -> bool:
    """Answer one request of ``queue`` as an RPC server does (body upper-cased, to
    its ``reply_to`` with its ``correlation_id``); False if none came in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        method, props, body = responder.basic_get(queue, auto_ack=True)
        if method is not None:
            responder.basic_publish("", props.reply_to, body.upper(),
                                    pika.BasicProperties(correlation_id=props.correlation_id))
            return True
        time.sleep(0.01)  # (polls for a request published on another connection)
    return False


def _wait(conn: Any, got: list[Any], n: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def test_rpc_round_trips_through_direct_reply_to(broker: BrokerProcess) -> None:
    client, server = _connect(broker), _connect(broker)
    responder = server.channel()
    responder.confirm_delivery()
    responder.queue_declare("rpc_queue")
    ch = client.channel()
    replies: list[tuple[str, bytes]] = []
    ch.basic_consume(REPLY_TO, lambda _c, _m, props, body: replies.append((props.correlation_id, body)),
                     auto_ack=True)
    ids = []
    for n in range(3):
        ids.append(str(uuid.uuid4()))
        ch.basic_publish("", "rpc_queue", f"call {n}".encode(),
                         pika.BasicProperties(reply_to=REPLY_TO, correlation_id=ids[-1]))
        assert _serve_one(responder, "rpc_queue")
    _wait(client, replies, 3)
    assert replies == [(ids[n], f"CALL {n}".encode()) for n in range(3)]
    client.close()
    server.close()


def test_a_vanished_requester_a_forged_address_and_the_passive_check(broker: BrokerProcess) -> None:
    client, server = _connect(broker), _connect(broker)
    responder = server.channel()
    responder.confirm_delivery()
    responder.queue_declare("rpc_check")
    ch = client.channel()
    got: list[bytes] = []
    ch.basic_consume(REPLY_TO, lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    ch.basic_publish("", "rpc_check", b"q", pika.BasicProperties(reply_to=REPLY_TO))
    deadline = time.monotonic() + 10
    method = None
    while method is None and time.monotonic() < deadline:
        method, props, _body = responder.basic_get("rpc_check", auto_ack=True)
    assert method is not None
    address = props.reply_to
    assert address.startswith(REPLY_TO + ".")
    ok = responder.queue_declare(address, passive=True)
    assert (ok.method.message_count, ok.method.consumer_count) == (0, 1)
    # a made-up address: returned (mandatory), never delivered to the requester
    forged = address[:-2] + ("00" if not address.endswith("00") else "11")
    with pytest.raises(pika.exceptions.UnroutableError):
        responder.basic_publish("", forged, b"forged", mandatory=True)
    responder.basic_publish("", address, b"real")
    _wait(client, got, 1)
    client.process_data_events(time_limit=0.2)
    assert got == [b"real"]
    # the requester goes: its address with it
    client.close()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        server.channel().queue_declare(address, passive=True)
    assert refused.value.reply_code == 404
    responder.basic_publish("", address, b"too late")  # confirmed, dropped
    # the reply consumer is no-ack only
    other = _connect(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        other.channel().basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
    assert (refused.value.reply_code, refused.value.reply_text) == (
        406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
    other.close()
    responder.queue_delete("rpc_check")
    server.close()


def test_aio_pika_rpc_through_direct_reply_to(broker: BrokerProcess) -> None:
    aio_pika = pytest.importorskip("aio_pika")
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"

    async def main() -> list[tuple[str | None, bytes]]:
        async with await aio_pika.connect(url) as client, await aio_pika.connect(url) as server:
            # the responder: answers each request to its reply_to
            serving = await server.channel()
            requests = await serving.declare_queue("aio_rpc")

            async def answer(message: Any) -> None:
                async with message.process():
                    await serving.default_exchange.publish(
                        aio_pika.Message(message.body.upper(), correlation_id=message.correlation_id),
                        routing_key=message.reply_to,
                    )

            await requests.consume(answer)
            # the requester: the pseudo-queue, declared passively (aio-pika's way), no-ack
            ch = await client.channel()
            replies = await ch.declare_queue(REPLY_TO, passive=True)
            got: asyncio.Queue[tuple[str | None, bytes]] = asyncio.Queue()

            async def on_reply(message: Any) -> None:
                await got.put((message.correlation_id, message.body))

            await replies.consume(on_reply, no_ack=True)
            out = []
            for n in range(3):
                await ch.default_exchange.publish(
                    aio_pika.Message(f"call {n}".encode(), reply_to=REPLY_TO, correlation_id=f"id-{n}"),
                    routing_key="aio_rpc",
                )
                out.append(await asyncio.wait_for(got.get(), 10))
            await serving.queue_delete("aio_rpc")
            return out

    assert asyncio.run(main()) == [(f"id-{n}", f"CALL {n}".encode()) for n in range(3)]

"""The AMQP listener's output over a real socket (``server._Output``): deliveries are
written in the step of the task that pumps them (the reader settling acks), not by a
wake-up of the writer task; what the socket does not take is sent by the writer
before anything queued after it, so the client sees every frame once and in order."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from pamqp import commands

from broker.amqp import server as server_module
from tests.amqp.rawclient import RawAMQP, amqp_server

Basic = commands.Basic


class _CountingSends:
    """Counts the writer task's ``send_all`` calls on the broker's side of the socket."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.calls = 0
        self._send_all = stream.send_all

    async def __call__(self, data: Any) -> None:
        self.calls += 1
        await self._send_all(data)


@asynccontextmanager
async def _socket_connection(app: Any, *, server_sndbuf: int | None = None) -> AsyncIterator[tuple[RawAMQP, _CountingSends]]:
    """One handshaken AMQP connection over a socket pair; the broker's sends counted."""
    broker_sock, client_sock = trio.socket.socketpair()
    if server_sndbuf is not None:
        broker_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, server_sndbuf)
    broker_stream, client_stream = trio.SocketStream(broker_sock), trio.SocketStream(client_sock)
    counting = _CountingSends(broker_stream)
    broker_stream.send_all = counting  # type: ignore[method-assign]
    server = amqp_server(app)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_stream, broker_stream, ("127.0.0.1", 40000))
        client = RawAMQP(client_stream)
        await client.handshake()
        yield client, counting
        nursery.cancel_scope.cancel()
    client_sock.close()


async def test_deliveries_made_by_acks_go_out_in_the_readers_step(app) -> None:
    async with _socket_connection(app) as (c, sends):
        await c.open_channel(1)
        await c.declare(1, "q")
        for i in range(60):
            await c.publish(1, "", "q", b"m%d" % i)
        await c.send(1, Basic.Qos(prefetch_count=5))
        await c.expect(Basic.QosOk, 1)
        await c.send(1, Basic.Consume(queue="q", consumer_tag="c"))
        await c.expect(Basic.ConsumeOk, 1)
        before = sends.calls
        bodies = []
        with trio.fail_after(10):
            for expected_tag in range(1, 61):
                method, _props, body = await c.message()
                assert isinstance(method, Basic.Deliver) and method.delivery_tag == expected_tag
                bodies.append(body)
                await c.send(1, Basic.Ack(delivery_tag=method.delivery_tag))
        assert bodies == [b"m%d" % i for i in range(60)]
        # every delivery after the first five was made room for by an ack: the reader's
        # pump wrote it, the writer task sent nothing
        assert sends.calls == before
        await c.send(1, commands.Queue.Declare(queue="q", passive=True))
        ok = await c.expect(commands.Queue.DeclareOk, 1)
        assert ok.message_count == 0
        assert app.runtime.core.queues["q"].unacked == 0


async def test_what_the_socket_does_not_take_is_sent_first_by_the_writer(app, monkeypatch) -> None:
    count, size = 64, 20_000
    left_over: list[int] = []
    take_unsent = server_module._Output.take_unsent

    def recording_take_unsent(self: Any) -> bytes:
        unsent = take_unsent(self)
        if unsent:
            left_over.append(len(unsent))
        return unsent

    monkeypatch.setattr(server_module._Output, "take_unsent", recording_take_unsent)
    async with _socket_connection(app, server_sndbuf=4096) as (c, sends):
        await c.open_channel(1)
        await c.declare(1, "big")
        for i in range(count):
            await c.publish(1, "", "big", bytes([i]) * size)
        # the barrier: the publishes are in the queue
        await c.send(1, commands.Queue.Declare(queue="big", passive=True))
        assert (await c.expect(commands.Queue.DeclareOk, 1)).message_count == count
        before = sends.calls
        # no prefetch: all of them are delivered at once, far over the socket's buffer
        await c.send(1, Basic.Consume(queue="big", consumer_tag="c", no_ack=True))
        await c.expect(Basic.ConsumeOk, 1)
        with trio.fail_after(10):
            for i in range(count):
                method, _props, body = await c.message()
                assert isinstance(method, Basic.Deliver) and method.delivery_tag == i + 1
                assert body == bytes([i]) * size
            # what follows the deliveries comes after them
            await c.send(1, commands.Queue.Declare(queue="big", passive=True))
            assert (await c.expect(commands.Queue.DeclareOk, 1)).message_count == 0
        # a write in the pump's step left bytes over, and the writer sent them
        assert left_over and sends.calls > before

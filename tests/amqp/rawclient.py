"""A raw AMQP 0-9-1 client for tests, on any trio stream: pamqp encodes and decodes
every frame (independent of the broker's own hand-written codec on purpose), and
malformed bytes can be sent as they are.

``open_amqp(app)`` serves one connection of the in-process broker's AMQP listener over
``trio.testing`` memory streams (so ``autojump_clock`` drives heartbeats)."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from broker.amqp import AMQPServer

__all__ = ["RawAMQP", "open_amqp", "amqp_server"]


class ConnectionGone(Exception):
    pass


class RawAMQP:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.frame_max = 131072

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, channel: int, method: Any) -> None:
        await self.stream.send_all(pframe.marshal(method, channel))

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionGone("connection closed by the broker")
        self.buffer += data

    async def recv_raw(self, n: int) -> bytes:
        while len(self.buffer) < n:
            await self._fill()
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    async def recv(self, *, skip_heartbeats: bool = True) -> tuple[int, Any]:
        """The next frame: (channel, pamqp frame value)."""
        while True:
            while len(self.buffer) < 7:
                await self._fill()
            size = struct.unpack_from(">I", self.buffer, 3)[0]
            while len(self.buffer) < 8 + size:
                await self._fill()
            raw = bytes(self.buffer[: 8 + size])
            del self.buffer[: 8 + size]
            _n, channel, value = pframe.unmarshal(raw)
            if skip_heartbeats and value.name == "Heartbeat":
                continue
            return channel, value

    async def expect(self, kind: type, channel: int | None = None) -> Any:
        got_channel, value = await self.recv()
        assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r} ({getattr(value, '__dict__', '')})"
        if channel is not None:
            assert got_channel == channel
        return value

    async def message(self) -> tuple[Any, Any, bytes]:
        """A deliver/get-ok/return with its content: (method, properties, body)."""
        _ch, method = await self.recv()
        _ch, head = await self.recv()
        assert isinstance(head, pheader.ContentHeader), head
        body = b""
        while len(body) < head.body_size:
            _ch, part = await self.recv()
            assert isinstance(part, pbody.ContentBody), part
            body += part.value
        return method, head.properties, body

    async def handshake(
        self, user: str = "guest", password: str = "guest", *, heartbeat: int = 0, frame_max: int = 131072,
        mechanism: str = "PLAIN", client_properties: dict[str, Any] | None = None,
    ) -> None:
        """Open the connection; ``client_properties`` are added to the client's own."""
        await self.send_bytes(b"AMQP\x00\x00\x09\x01")
        start = await self.expect(commands.Connection.Start)
        assert start.server_properties["capabilities"]["publisher_confirms"] is True
        if mechanism == "PLAIN":
            response = f"\x00{user}\x00{password}"
        else:
            from broker.amqp.tables import encode_table

            response = encode_table({"LOGIN": user, "PASSWORD": password})[4:].decode()
        await self.send(0, commands.Connection.StartOk(
            client_properties={"product": "rawclient", "capabilities": {"connection.blocked": True,
                                                                       "consumer_cancel_notify": True},
                               **(client_properties or {})},
            mechanism=mechanism, response=response,
        ))
        tune = await self.expect(commands.Connection.Tune)
        self.frame_max = min(frame_max, tune.frame_max)
        await self.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=self.frame_max,
                                                      heartbeat=heartbeat))
        await self.send(0, commands.Connection.Open(virtual_host="/"))
        await self.expect(commands.Connection.OpenOk)

    async def open_channel(self, channel: int = 1) -> None:
        await self.send(channel, commands.Channel.Open())
        await self.expect(commands.Channel.OpenOk, channel)

    async def publish(
        self, channel: int, exchange: str, routing_key: str, body: bytes, *, mandatory: bool = False,
        properties: commands.Basic.Properties | None = None,
    ) -> None:
        frames = [pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                         mandatory=mandatory), channel)]
        frames.append(pframe.marshal(pheader.ContentHeader(0, len(body), properties or commands.Basic.Properties()), channel))
        step = self.frame_max - 8
        for start in range(0, len(body), step):
            frames.append(pframe.marshal(pbody.ContentBody(body[start:start + step]), channel))
        await self.stream.send_all(b"".join(frames))

    async def declare(self, channel: int, queue: str = "", **kw: Any) -> Any:
        await self.send(channel, commands.Queue.Declare(queue=queue, **kw))
        return await self.expect(commands.Queue.DeclareOk, channel)

    async def closed_with(self, channel: int | None = None) -> tuple[int, str]:
        """Wait for a channel.close (or connection.close with channel None): (code, text);
        answers with close-ok."""
        while True:
            ch, value = await self.recv()
            if channel is None and isinstance(value, commands.Connection.Close):
                await self.send(0, commands.Connection.CloseOk())
                return value.reply_code, value.reply_text
            if channel is not None and ch == channel and isinstance(value, commands.Channel.Close):
                await self.send(channel, commands.Channel.CloseOk())
                return value.reply_code, value.reply_text

    async def at_eof(self) -> bool:
        try:
            while True:
                await self._fill()
        except (ConnectionGone, trio.BrokenResourceError, trio.ClosedResourceError):
            return True


def amqp_server(app: Any, **kw: Any) -> AMQPServer:
    return AMQPServer(app.runtime, login=app.auth.login, **kw)


@asynccontextmanager
async def open_amqp(app: Any, *, remote: Any = ("127.0.0.1", 40000), server: AMQPServer | None = None,
                    handshake: bool = True, **handshake_kw: Any) -> AsyncIterator[RawAMQP]:
    """One AMQP connection to ``app`` over memory streams, handshaken unless asked."""
    server = server or amqp_server(app)
    client_stream, server_stream = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_stream, server_stream, remote)
        client = RawAMQP(client_stream)
        if handshake:
            await client.handshake(**handshake_kw)
        yield client
        nursery.cancel_scope.cancel()

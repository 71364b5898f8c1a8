"""An in-memory byte stream pair for anyio (trio's ``memory_stream_pair`` for both
backends): what one end sends, the other receives, with unbounded buffering."""

from __future__ import annotations

import anyio
import anyio.abc
import anyio.lowlevel

__all__ = ["MemoryByteStream", "memory_stream_pair"]


class _Pipe:
    """Bytes in flight in one direction."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.eof = False  # the sender closed its end (or sent EOF)
        self.broken = False  # the receiver closed its end
        self.readable = anyio.Event()

    def wake(self) -> None:
        self.readable.set()
        self.readable = anyio.Event()


class MemoryByteStream(anyio.abc.ByteStream):
    """One end of a :func:`memory_stream_pair`."""

    def __init__(self, outgoing: _Pipe, incoming: _Pipe) -> None:
        self._out = outgoing
        self._in = incoming
        self._closed = False

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise anyio.ClosedResourceError
        if self._out.broken:
            raise anyio.BrokenResourceError
        if item:
            self._out.buffer += item
            self._out.wake()

    async def send_eof(self) -> None:
        self._out.eof = True
        self._out.wake()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.lowlevel.checkpoint()
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            pipe = self._in
            if pipe.buffer:
                data = bytes(pipe.buffer[:max_bytes])
                del pipe.buffer[:max_bytes]
                return data
            if pipe.eof:
                raise anyio.EndOfStream
            await pipe.readable.wait()

    async def aclose(self) -> None:
        self._closed = True
        self._out.eof = True
        self._in.broken = True
        self._out.wake()
        self._in.wake()
        await anyio.lowlevel.checkpoint()


def memory_stream_pair() -> tuple[MemoryByteStream, MemoryByteStream]:
    """Two connected in-memory byte streams."""
    a_to_b, b_to_a = _Pipe(), _Pipe()
    return MemoryByteStream(a_to_b, b_to_a), MemoryByteStream(b_to_a, a_to_b)

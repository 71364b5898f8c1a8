"""An in-memory byte stream pair for anyio (trio's ``memory_stream_pair`` for both
backends): what one end sends, the other receives, with unbounded buffering.

It keeps the contract trio holds its own streams to (``tests/test_memstream.py`` runs
``trio.testing.check_two_way_stream`` and ``check_half_closeable_stream`` on it):
every call is a checkpoint; two tasks sending (or receiving) on one end at once is a
``BusyResourceError``; ``max_bytes`` must be a positive integer; using an end after
closing it is ``ClosedResourceError``, sending to an end whose peer closed is
``BrokenResourceError``; ``send_eof`` is idempotent and ends sending only.
"""

from __future__ import annotations

import operator

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
        self._sending = False
        self._receiving = False

    def _enter_send(self) -> None:
        if self._sending:
            raise anyio.BusyResourceError("sending")
        self._sending = True

    async def send(self, item: bytes) -> None:
        self._enter_send()
        try:
            await anyio.lowlevel.checkpoint()
            if self._closed or self._out.eof:
                raise anyio.ClosedResourceError
            if self._out.broken:
                raise anyio.BrokenResourceError
            if item:
                self._out.buffer += item
                self._out.wake()
        finally:
            self._sending = False

    async def wait_send_might_not_block(self) -> None:
        """Trio's ``wait_send_all_might_not_block``: a send never blocks here (the
        buffer is unbounded), so this only checks and checkpoints."""
        self._enter_send()
        try:
            await anyio.lowlevel.checkpoint()
            if self._closed:
                raise anyio.ClosedResourceError
        finally:
            self._sending = False

    async def send_eof(self) -> None:
        self._enter_send()
        try:
            await anyio.lowlevel.checkpoint()
            if self._closed:
                raise anyio.ClosedResourceError
            if not self._out.eof:
                self._out.eof = True
                self._out.wake()
        finally:
            self._sending = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        max_bytes = operator.index(max_bytes)  # TypeError for 1.5, as trio's streams
        if max_bytes < 1:
            await anyio.lowlevel.checkpoint()
            raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise anyio.BusyResourceError("receiving")
        self._receiving = True
        try:
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
        finally:
            self._receiving = False

    async def aclose(self) -> None:
        if not self._closed:
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

"""``tests/support/memstream.py`` (the anyio byte streams the client tests' fake broker
serves over) against trio's own stream conformance checks,
``trio.testing.check_two_way_stream`` and ``check_half_closeable_stream``: the suite
trio holds its own streams to. It runs under trio (anyio's trio backend), through a
face that only renames (anyio's ``send``/``receive``/``send_eof`` to trio's
``send_all``/``receive_some``/``send_eof``, anyio's exceptions to trio's), so what the
checks find is the stream's own behaviour.
"""

from __future__ import annotations

import anyio
import trio
import trio.testing

from tests.support.memstream import MemoryByteStream, memory_stream_pair


class TrioFace(trio.abc.HalfCloseableStream):
    """A :class:`MemoryByteStream` under trio's stream method names."""

    def __init__(self, stream: MemoryByteStream) -> None:
        self.stream = stream

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self.stream.send(bytes(data))
        except anyio.BusyResourceError as exc:
            raise trio.BusyResourceError(str(exc)) from exc
        except anyio.ClosedResourceError as exc:
            raise trio.ClosedResourceError from exc
        except anyio.BrokenResourceError as exc:
            raise trio.BrokenResourceError from exc

    async def wait_send_all_might_not_block(self) -> None:
        try:
            await self.stream.wait_send_might_not_block()
        except anyio.BusyResourceError as exc:
            raise trio.BusyResourceError(str(exc)) from exc
        except anyio.ClosedResourceError as exc:
            raise trio.ClosedResourceError from exc

    async def send_eof(self) -> None:
        try:
            await self.stream.send_eof()
        except anyio.BusyResourceError as exc:
            raise trio.BusyResourceError(str(exc)) from exc
        except anyio.ClosedResourceError as exc:
            raise trio.ClosedResourceError from exc

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        try:
            return await self.stream.receive(max_bytes if max_bytes is not None else 65536)
        except anyio.EndOfStream:
            return b""
        except anyio.BusyResourceError as exc:
            raise trio.BusyResourceError(str(exc)) from exc
        except anyio.ClosedResourceError as exc:
            raise trio.ClosedResourceError from exc
        except anyio.BrokenResourceError as exc:
            raise trio.BrokenResourceError from exc

    async def aclose(self) -> None:
        await self.stream.aclose()


async def _pair() -> tuple[TrioFace, TrioFace]:
    left, right = memory_stream_pair()
    return TrioFace(left), TrioFace(right)


async def test_memory_stream_pair_passes_trios_two_way_stream_checks() -> None:
    await trio.testing.check_two_way_stream(_pair, None)


async def test_memory_stream_pair_passes_trios_half_closeable_stream_checks() -> None:
    await trio.testing.check_half_closeable_stream(_pair, None)

"""The chunked transfer coding of channel bodies (RFC 9112 §7.1): the pure decoder, and
the duplex exchange that frames both bodies with it after h11 read the heads."""

from __future__ import annotations

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from client.chunked import (
    LAST_CHUNK,
    MAX_LINE_BYTES,
    MAX_TRAILER_BYTES,
    ChunkedDecoder,
    encode_chunk,
)
from client.duplex import DuplexExchange
from client.endpoint import Endpoint
from client.errors import ConnectionLost, ProtocolError
from client.transport import receive_some
from tests.support.memstream import memory_stream_pair

pytestmark = pytest.mark.anyio

BODY = b"".join([
    encode_chunk(b'{"ev":"open","channel":"1"}\n'),
    b"1a;name=value;other\r\n" + b"a" * 26 + b"\r\n",  # chunk extensions are ignored
    b"3\n", b"b\nc\r\n",  # a bare LF ends a size line too
    encode_chunk(b"d" * 300),
    b"0\r\nX-Trailer: yes\r\nX-More: 1\r\n\r\n",
])
PAYLOAD = b'{"ev":"open","channel":"1"}\n' + b"a" * 26 + b"b\nc" + b"d" * 300


def decode_in_pieces(data: bytes, size: int) -> tuple[bytes, ChunkedDecoder]:
    decoder = ChunkedDecoder()
    out = [decoder.feed(data[i:i + size]) for i in range(0, len(data), size)]
    return b"".join(out), decoder


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64, len(BODY)])
def test_decoding_does_not_depend_on_how_the_bytes_are_cut(size: int) -> None:
    payload, decoder = decode_in_pieces(BODY, size)
    assert payload == PAYLOAD
    assert decoder.done


def test_one_whole_chunk_is_returned_as_it_is() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(encode_chunk(b"line\n")) == b"line\n"
    assert decoder.feed(encode_chunk(b"x" * 70000)) == b"x" * 70000
    assert not decoder.done
    assert decoder.feed(LAST_CHUNK) == b""
    assert decoder.done
    assert decoder.feed(b"anything after the body is ignored") == b""


def test_chunk_data_is_passed_on_before_the_chunk_is_complete() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"a\r\n01234") == b"01234"
    assert decoder.feed(b"56789\r") == b"56789"
    assert decoder.feed(b"\n") == b""
    assert not decoder.done


def test_encode_chunk() -> None:
    assert encode_chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"
    with pytest.raises(ValueError):
        encode_chunk(b"")


@pytest.mark.parametrize(
    "data",
    [
        b"zz\r\nab\r\n",  # not hex
        b"\r\n",  # no size
        b"-1\r\n",
        b"0x2\r\nab\r\n",
        b"12345678901234567\r\n",  # more hex digits than any size needs
        b"2\r\nabX\r\n",  # data not followed by CRLF
        b"2\r\nab\rX",
        b"2\r\nab\n\r\n",
    ],
)
def test_malformed_framing_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_in_pieces(data, 1)
    with pytest.raises(ProtocolError):
        ChunkedDecoder().feed(data)


def test_lines_are_bounded_before_they_are_buffered() -> None:
    decoder = ChunkedDecoder()
    decoder.feed(b"1;" + b"e" * (MAX_LINE_BYTES - 10))
    with pytest.raises(ProtocolError):
        decoder.feed(b"e" * 20)
    decoder = ChunkedDecoder()
    decoder.feed(b"0\r\n")
    with pytest.raises(ProtocolError):
        for _ in range(MAX_TRAILER_BYTES // 1000 + 1):
            decoder.feed(b"X-A: " + b"a" * 993 + b"\r\n")


# --- the duplex exchange ------------------------------------------------------------

ENDPOINT = Endpoint("http", "broker", 8080)


async def open_exchange(
    nursery: anyio.abc.TaskGroup, answer: list[bytes]
) -> tuple[DuplexExchange, anyio.abc.ByteStream, list[bytes], anyio.Event]:
    """A client exchange over a memory stream whose peer sends ``answer`` piece by
    piece (each ``send_all`` a separate read for the client) and records what it got."""
    client_side, server_side = memory_stream_pair()
    received: list[bytes] = []
    finished = anyio.Event()  # the client closed its side and everything was received

    async def server() -> None:
        try:
            for piece in answer:
                await server_side.send(piece)
                for _ in range(3):  # let the client read it (asyncio's
                    await anyio.lowlevel.checkpoint()  # wait_all_tasks_blocked polls at 10 Hz)
            while data := await receive_some(server_side):
                received.append(data)
            finished.set()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    nursery.start_soon(server)
    exchange = await DuplexExchange.open(client_side, ENDPOINT, "/channel")
    return exchange, server_side, received, finished


async def read_all(exchange: DuplexExchange) -> bytes:
    out = []
    while data := await exchange.receive_some():
        out.append(data)
    return b"".join(out)


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_the_response_body_is_decoded_from_bytes_that_came_with_the_head() -> None:
    async with anyio.create_task_group() as nursery:
        exchange, _, _, _ = await open_exchange(nursery, [HEAD + BODY[:40], BODY[40:]])
        assert await read_all(exchange) == PAYLOAD
        nursery.cancel_scope.cancel()


async def test_the_response_body_arriving_byte_by_byte() -> None:
    async with anyio.create_task_group() as nursery:
        exchange, _, _, _ = await open_exchange(nursery, [HEAD] + [BODY[i:i + 1] for i in range(len(BODY))])
        assert await read_all(exchange) == PAYLOAD
        nursery.cancel_scope.cancel()


async def test_a_response_that_is_not_chunked_is_read_through_h11() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n"
    async with anyio.create_task_group() as nursery:
        exchange, _, _, _ = await open_exchange(nursery, [head + b"hello", b" world"])
        assert await read_all(exchange) == b"hello world"
        nursery.cancel_scope.cancel()


async def test_a_body_cut_short_is_connection_lost() -> None:
    async with anyio.create_task_group() as nursery:
        exchange, server_side, _, _ = await open_exchange(nursery, [HEAD + encode_chunk(b"a\n")])
        assert await exchange.receive_some() == b"a\n"
        await server_side.aclose()
        with pytest.raises(ConnectionLost):
            await exchange.receive_some()
        nursery.cancel_scope.cancel()


async def test_malformed_framing_in_the_response_is_a_protocol_error() -> None:
    async with anyio.create_task_group() as nursery:
        exchange, _, _, _ = await open_exchange(nursery, [HEAD + b"2\r\nabXY"])
        with pytest.raises(ProtocolError):
            await exchange.receive_some()
        nursery.cancel_scope.cancel()


async def test_the_request_body_is_chunked_and_ended() -> None:
    async with anyio.create_task_group() as nursery:
        exchange, _, received, finished = await open_exchange(nursery, [HEAD + LAST_CHUNK])
        await exchange.send(b'{"op":"close"}\n')
        await exchange.send(b"")  # nothing: an empty chunk would end the body
        await exchange.end()
        assert await exchange.receive_some() == b""
        await exchange.aclose()
        await finished.wait()
        sent = b"".join(received)
        head, _, body = sent.partition(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head.lower()
        assert body == encode_chunk(b'{"op":"close"}\n') + LAST_CHUNK
        nursery.cancel_scope.cancel()

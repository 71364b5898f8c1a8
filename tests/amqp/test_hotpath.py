"""The one-pass reader of publishes and acks (``broker/amqp/hotpath.py``) against the
frame-by-frame path it stands in for: the same bytes give the same events, the same
output and the same state, for well-formed streams and for streams with bytes broken
at random places."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from broker.amqp.connection import (
    AMQPConnection,
    ChannelOpened,
    Content,
    Method,
    TuneLimits,
)
from broker.amqp.events import Acks
from broker.amqp.frames import ACK, Ack
from tests.amqp.test_connection import events, m, opened


class _NoHotPath:
    """Takes nothing: every frame goes the frame-by-frame way."""

    def scan(self, buf: bytearray, pos: int, *_args: Any) -> int:
        return pos


def _without_hot_path(conn: AMQPConnection) -> AMQPConnection:
    conn._hot = _NoHotPath()  # type: ignore[assignment]
    return conn


def _publish(channel: int, body: bytes, props: commands.Basic.Properties, *, key: str = "q",
             frame_max: int = 131072) -> bytes:
    out = m(channel, commands.Basic.Publish(exchange="ex" if key == "k2" else "", routing_key=key,
                                            mandatory=key == "k2"))
    out += pframe.marshal(pheader.ContentHeader(0, len(body), props), channel)
    chunk = frame_max - 8
    for start in range(0, len(body), chunk):
        out += pframe.marshal(pbody.ContentBody(body[start : start + chunk]), channel)
    return out


def _ack(channel: int, tag: int, multiple: bool = False) -> bytes:
    return m(channel, commands.Basic.Ack(delivery_tag=tag, multiple=multiple))


def _stream(rng: random.Random) -> bytes:
    """Publishes (with and without properties, empty bodies, bodies over many frames),
    acks, nacks, other methods and heartbeats, on channels 1 and 2, in a random order."""
    parts = [m(2, commands.Channel.Open())]
    for i in range(60):
        choice = rng.randrange(9)
        channel = rng.choice((1, 2))
        if choice <= 2:
            parts.append(_publish(channel, b"x" * rng.randrange(0, 300), commands.Basic.Properties(delivery_mode=2)))
        elif choice == 3:
            parts.append(_publish(channel, b"", commands.Basic.Properties()))
        elif choice == 4:
            props = commands.Basic.Properties(content_type="text/plain", headers={"n": i, "s": "v"}, priority=3)
            parts.append(_publish(channel, b"y" * rng.randrange(1, 40), props, key="k2"))
        elif choice == 5:
            parts.append(_publish(channel, b"z" * 9000, commands.Basic.Properties(), frame_max=4096))
        elif choice == 6:
            parts.append(_ack(channel, rng.randrange(1, 99), rng.random() < 0.2))
        elif choice == 7:
            parts.append(m(channel, commands.Basic.Nack(delivery_tag=i, multiple=False, requeue=True)))
        else:
            parts.append(rng.choice((b"\x08\x00\x00\x00\x00\x00\x00\xce", m(channel, commands.Basic.Qos(prefetch_count=i)))))
    return b"".join(parts)


def _normal(event: Any) -> list[Any]:
    """The event as the frame-by-frame path gives it (a run of acks: one per tag)."""
    if isinstance(event, Acks):
        return [Method(event.channel, ACK, Ack(tag, False)) for tag in event.tags]
    if isinstance(event, Method) and not hasattr(event.method, "__dataclass_fields__"):
        return [("method", event.channel, event.index, type(event.method).__name__, sorted(vars(event.method).items()))]
    return [event]


def _run(conn: AMQPConnection, data: bytes, sizes: list[int]) -> tuple[list[Any], bytes, str, set[int]]:
    seen = []
    pos = 0
    for size in sizes:
        conn.receive_data(data[pos : pos + size])
        seen += [n for e in events(conn) for n in _normal(e)]
        pos += size
    conn.receive_data(data[pos:])
    seen += [n for e in events(conn) for n in _normal(e)]
    return seen, conn.data_to_send(), conn.state.value, set(conn.channels)


def _both(data: bytes, sizes: list[int], limits: TuneLimits | None = None) -> None:
    hot = opened(limits, frame_max=4096)
    plain = _without_hot_path(opened(limits, frame_max=4096))
    assert _run(hot, data, sizes) == _run(plain, data, sizes)


@pytest.mark.parametrize("seed", range(20))
def test_well_formed_streams_give_the_same_events(seed: int) -> None:
    rng = random.Random(seed)
    data = _stream(rng)
    reads = [rng.randrange(1, 3000) for _ in range(rng.randrange(0, 12))]
    _both(data, reads)
    conn = opened(frame_max=4096)
    conn.receive_data(data)
    got = events(conn)
    assert isinstance(got[0], ChannelOpened)
    assert sum(isinstance(e, Content) for e in got) == data.count(b"\x00\x3c\x00\x28")  # every publish came


@pytest.mark.parametrize("seed", range(200))
def test_broken_streams_give_the_same_errors(seed: int) -> None:
    rng = random.Random(1000 + seed)
    data = bytearray(_stream(rng))
    for _ in range(rng.randrange(1, 4)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    reads = [rng.randrange(1, 3000) for _ in range(rng.randrange(0, 6))]
    _both(bytes(data), reads, TuneLimits(max_body_bytes=rng.choice((200, 128 << 20))))


def test_a_publish_cut_anywhere_is_assembled_the_same() -> None:
    data = _publish(1, b"body", commands.Basic.Properties(delivery_mode=2)) + _ack(1, 7)
    for cut in range(1, len(data)):
        _both(data, [cut])


def test_acks_and_publishes_are_read_in_one_pass() -> None:
    """Without the frame-by-frame path at all (its reader refuses to be called while
    bytes are left)."""
    conn = opened()
    data = (_publish(1, b"a", commands.Basic.Properties(delivery_mode=2)) + _ack(1, 5, True) + _ack(1, 6)
            + _ack(1, 7) + _ack(2, 1) + _publish(1, b"", commands.Basic.Properties()) + _ack(1, 8))
    conn.receive_data(m(2, commands.Channel.Open()))
    assert isinstance(events(conn)[0], ChannelOpened)
    reader = conn._reader

    def refuse() -> None:
        raise AssertionError("the frame-by-frame path was used")

    reader.next_frame = lambda: None if reader.buffered() == 0 else refuse()  # type: ignore[assignment, method-assign, func-returns-value]
    conn.receive_data(data)
    got = events(conn)
    assert [type(e).__name__ for e in got] == ["Content", "Method", "Acks", "Acks", "Content", "Acks"]
    assert got[0].publish.routing_key == "q" and got[0].body == b"a" and got[0].properties == {"delivery_mode": 2}
    assert (got[1].method.delivery_tag, got[1].method.multiple) == (5, True)
    assert (got[2].channel, got[2].tags, got[3].channel, got[3].tags) == (1, [6, 7], 2, [1])
    assert got[4].body == b"" and got[4].properties is None
    assert got[5].tags == [8]

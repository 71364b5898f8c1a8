"""The connection state machine alone (no sockets, no broker): handshake, tune limits,
heartbeats, and each kind of bad input answered with RabbitMQ's reply code."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from broker.amqp.connection import (
    AMQPConnection,
    ChannelClosedByPeer,
    ChannelFailed,
    ChannelOpened,
    ConnectionEnded,
    Content,
    Login,
    Method,
    Opened,
    State,
    TuneLimits,
)

HEADER = b"AMQP\x00\x00\x09\x01"


def frames(data: bytes) -> list[tuple[int, Any]]:
    out = []
    while data:
        n, channel, value = pframe.unmarshal(data)
        out.append((channel, value))
        data = data[n:]
    return out


def events(conn: AMQPConnection) -> list[Any]:
    out = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def m(channel: int, method: Any) -> bytes:
    return pframe.marshal(method, channel)


def opened(limits: TuneLimits | None = None, *, heartbeat: int = 0, frame_max: int = 131072) -> AMQPConnection:
    conn = AMQPConnection(limits or TuneLimits(), {"capabilities": {}})
    conn.receive_data(HEADER)
    conn.receive_data(m(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00u\x00p")))
    login = events(conn)[0]
    assert isinstance(login, Login) and (login.username, login.password) == ("u", "p")
    conn.accept_login("u")
    conn.receive_data(m(0, commands.Connection.TuneOk(channel_max=0, frame_max=frame_max, heartbeat=heartbeat)))
    conn.receive_data(m(0, commands.Connection.Open(virtual_host="/")))
    assert isinstance(events(conn)[0], Opened)
    conn.receive_data(m(1, commands.Channel.Open()))
    assert isinstance(events(conn)[0], ChannelOpened)
    conn.channel_open_ok(1)
    assert isinstance(frames(conn.data_to_send())[-1][1], commands.Channel.OpenOk)
    return conn


def closed_with(conn: AMQPConnection) -> tuple[str, int, int]:
    """(the closing method's name, its channel, its code) from the output."""
    for channel, value in frames(conn.data_to_send()):
        if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
            return value.name, channel, value.reply_code
    raise AssertionError("no close sent")


def test_handshake_offers_our_limits_and_takes_the_clients() -> None:
    conn = AMQPConnection(TuneLimits(channel_max=100, frame_max=65536, heartbeat_s=30), {"product": "ackbus"})
    conn.receive_data(HEADER)
    (_, start), = frames(conn.data_to_send())
    assert isinstance(start, commands.Connection.Start) and start.mechanisms == "PLAIN AMQPLAIN"
    conn.receive_data(m(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00u\x00p")))
    events(conn)
    conn.accept_login("u")
    (_, tune), = frames(conn.data_to_send())
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (100, 65536, 30)
    conn.receive_data(m(0, commands.Connection.TuneOk(channel_max=10, frame_max=8192, heartbeat=5)))
    assert (conn.channel_max, conn.frame_max, conn.heartbeat_s) == (10, 8192, 5)


def test_header_split_across_reads() -> None:
    conn = AMQPConnection(TuneLimits(), {})
    for byte in HEADER:
        conn.receive_data(bytes([byte]))
    assert conn.state is State.AWAIT_START_OK


def test_frame_max_above_ours_is_530() -> None:
    conn = AMQPConnection(TuneLimits(frame_max=8192), {})
    conn.receive_data(HEADER)
    conn.receive_data(m(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00u\x00p")))
    conn.accept_login("u")
    conn.data_to_send()
    conn.receive_data(m(0, commands.Connection.TuneOk(channel_max=0, frame_max=1 << 20, heartbeat=0)))
    assert closed_with(conn)[2] == 530


def test_unknown_mechanism_is_403() -> None:
    conn = AMQPConnection(TuneLimits(), {})
    conn.receive_data(HEADER)
    conn.data_to_send()
    conn.receive_data(m(0, commands.Connection.StartOk(mechanism="EXTERNAL", response="")))
    assert closed_with(conn)[2] == 403


def test_frame_over_frame_max_is_501() -> None:
    conn = opened(frame_max=4096)
    conn.receive_data(struct.pack(">BHI", 3, 1, 5000) + b"x" * 5000 + b"\xce")
    assert closed_with(conn) == ("Connection.Close", 0, 501)
    assert any(isinstance(e, ConnectionEnded) and e.code == 501 for e in events(conn))


def test_bad_frame_end_is_501() -> None:
    conn = opened()
    conn.receive_data(m(1, commands.Basic.Qos(prefetch_count=1))[:-1] + b"\x00")
    assert closed_with(conn)[2] == 501


def test_body_longer_than_its_header_is_501() -> None:
    conn = opened()
    conn.receive_data(m(1, commands.Basic.Publish(exchange="", routing_key="q")))
    conn.receive_data(pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1))
    conn.receive_data(pframe.marshal(pbody.ContentBody(b"toolong"), 1))
    assert closed_with(conn)[2] == 501


def test_header_without_publish_is_505() -> None:
    conn = opened()
    conn.receive_data(pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1))
    assert closed_with(conn)[2] == 505


def test_method_instead_of_body_is_505() -> None:
    conn = opened()
    conn.receive_data(m(1, commands.Basic.Publish(exchange="", routing_key="q")))
    conn.receive_data(pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1))
    conn.receive_data(m(1, commands.Basic.Qos()))
    assert closed_with(conn)[2] == 505


def test_method_on_a_channel_never_opened_is_504() -> None:
    conn = opened()
    conn.receive_data(m(7, commands.Basic.Qos()))
    assert closed_with(conn) == ("Connection.Close", 0, 504)


def test_second_channel_open_is_504() -> None:
    conn = opened()
    conn.receive_data(m(1, commands.Channel.Open()))
    assert closed_with(conn)[2] == 504


def test_malformed_method_is_502_and_unknown_method_540() -> None:
    conn = opened()
    conn.receive_data(struct.pack(">BHI", 1, 1, 6) + struct.pack(">HH", 50, 10) + b"\x00\x00" + b"\xce")
    assert closed_with(conn)[2] == 502
    conn = opened()
    conn.receive_data(struct.pack(">BHI", 1, 1, 4) + struct.pack(">HH", 99, 99) + b"\xce")
    assert closed_with(conn)[2] == 540


def test_oversized_body_closes_the_channel_with_406_and_the_rest_is_discarded() -> None:
    conn = opened(TuneLimits(max_body_bytes=10))
    conn.receive_data(m(1, commands.Basic.Publish(exchange="", routing_key="q")))
    conn.receive_data(pframe.marshal(pheader.ContentHeader(0, 11, commands.Basic.Properties()), 1))
    assert closed_with(conn) == ("Channel.Close", 1, 406)
    assert any(isinstance(e, ChannelFailed) for e in events(conn))
    # the body that follows is discarded until close-ok, then the number is free again
    conn.receive_data(pframe.marshal(pbody.ContentBody(b"x" * 11), 1))
    assert conn.state is State.OPEN and not events(conn)
    conn.receive_data(m(1, commands.Channel.CloseOk()))
    conn.receive_data(m(1, commands.Channel.Open()))
    assert isinstance(events(conn)[0], ChannelOpened)


def test_publish_is_assembled_from_many_body_frames() -> None:
    conn = opened()
    conn.receive_data(m(1, commands.Basic.Publish(exchange="ex", routing_key="k", mandatory=True)))
    conn.receive_data(pframe.marshal(pheader.ContentHeader(0, 6, commands.Basic.Properties(content_type="t")), 1))
    conn.receive_data(pframe.marshal(pbody.ContentBody(b"abc"), 1) + pframe.marshal(pbody.ContentBody(b"def"), 1))
    (content,) = events(conn)
    assert isinstance(content, Content)
    assert (content.body, content.properties, content.publish.mandatory) == (b"abcdef", {"content_type": "t"}, True)


def test_channel_close_by_peer_and_flow() -> None:
    conn = opened()
    conn.receive_data(m(1, commands.Channel.Flow(active=True)))
    assert isinstance(frames(conn.data_to_send())[0][1], commands.Channel.FlowOk)
    conn.receive_data(m(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)))
    assert isinstance(events(conn)[0], ChannelClosedByPeer)
    conn.channel_close_ok(1)
    assert isinstance(frames(conn.data_to_send())[0][1], commands.Channel.CloseOk)


def test_other_methods_reach_the_session() -> None:
    conn = opened()
    conn.receive_data(m(1, commands.Queue.Declare(queue="q")))
    (event,) = events(conn)
    assert isinstance(event, Method) and event.method.queue == "q"


def test_heartbeats_are_sent_and_a_silent_client_is_dropped() -> None:
    conn = opened(heartbeat=10)
    conn.last_received = conn.last_sent = 100.0
    conn.check_timers(104.0)
    assert conn.data_to_send(104.0) == b""
    conn.check_timers(105.0)
    assert conn.data_to_send(105.0) == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    conn.receive_data(b"\x08\x00\x00\x00\x00\x00\x00\xce", now=110.0)
    conn.check_timers(129.0)
    assert not conn.closed
    conn.check_timers(131.0)
    assert conn.closed
    assert any(isinstance(e, ConnectionEnded) and "heartbeat" in e.text for e in events(conn))


def test_after_close_only_close_ok_counts() -> None:
    conn = opened()
    conn.close(320, "shutting down")
    assert closed_with(conn)[2] == 320
    conn.receive_data(m(1, commands.Queue.Declare(queue="q")))
    assert not [e for e in events(conn) if isinstance(e, Method)]
    conn.receive_data(m(0, commands.Connection.CloseOk()))
    assert conn.closed


@pytest.mark.parametrize("garbage", [b"\x00" * 7, b"\xff" * 64, b"AMQP" + b"\xff" * 12])
def test_garbage_after_the_handshake_closes_with_a_5xx(garbage: bytes) -> None:
    conn = opened()
    conn.receive_data(garbage)
    name, _channel, code = closed_with(conn)
    assert name == "Connection.Close" and 500 <= code < 600


def test_a_silent_client_is_dropped_during_the_handshake() -> None:
    conn = AMQPConnection(TuneLimits(handshake_timeout_s=10), {}, now=100.0)
    conn.receive_data(HEADER, now=100.0)
    conn.check_timers(109.0)
    assert not conn.closed
    assert conn.next_timer() == pytest.approx(110.01)
    conn.check_timers(111.0)
    assert conn.closed


def test_unfinished_bodies_on_many_channels_are_bounded() -> None:
    conn = opened(TuneLimits(max_body_bytes=1000))
    for channel in range(1, 7):
        if channel > 1:
            conn.receive_data(m(channel, commands.Channel.Open()))
            conn.channel_open_ok(channel)
        conn.receive_data(m(channel, commands.Basic.Publish(exchange="", routing_key="q")))
        conn.receive_data(pframe.marshal(pheader.ContentHeader(0, 1000, commands.Basic.Properties()), channel))
        conn.receive_data(pframe.marshal(pbody.ContentBody(b"x" * 999), channel))  # one byte short each
        if conn.state is not State.OPEN:
            break
    assert closed_with(conn)[2] == 506
    assert channel == 5  # the fifth unfinished body passed 4 x max_body_bytes

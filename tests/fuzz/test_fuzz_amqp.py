"""Fuzzing the AMQP port: no sequence of frames on one connection may crash the broker,
hang it, or touch another connection.

One broker subprocess takes every case. A case opens a connection, sometimes completes
the handshake, then sends a random mix of well-formed methods with random fields,
publishes whose body disagrees with their header, random frames and raw garbage, and
ends with ``connection.close``. After each case the broker answers ``/healthz`` and a
fresh AMQP connection completes a handshake; a sentinel connection opened before the
first case still works at the end, and the broker's log holds no failed connection
(an exception that escaped the session). ``ACKBUS_FUZZ_EXAMPLES`` sets the number of
cases (``scripts/fuzz``: 100,000 by default)."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from tests.support.broker import BrokerProcess, free_port

EXAMPLES = int(os.environ.get("ACKBUS_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
HEADER = b"AMQP\x00\x00\x09\x01"

NAMES = st.sampled_from(["q", "x", "", "amq.direct", "amq.gen-1", "amq.default", "é", "q" * 200, "fz", "amq.topic"])
KEYS = st.sampled_from(["", "k", "a.b", "#", "*.x"])
ARGS = st.dictionaries(
    st.sampled_from(["x-max-length", "x-message-ttl", "x-expires", "x-dead-letter-exchange", "x-max-priority",
                     "x-queue-type", "x-overflow", "x-match", "alternate-exchange", "x-single-active-consumer", "zz"]),
    st.one_of(st.integers(-5, 300), st.text(max_size=8), st.booleans(), st.none()),
    max_size=3,
)
CHANNELS = st.sampled_from([1, 1, 1, 2, 0, 9, 65535])
TAGS = st.integers(0, 5)


def _make(cls: Any, **fields: Any) -> Any:
    """``cls(**fields)`` without pamqp's client-side validation (names RabbitMQ takes,
    values out of range): the broker must cope with whatever arrives."""
    method = cls()
    for key, value in fields.items():
        setattr(method, key, value)
    return method


def _marshal(method: Any, channel: int) -> bytes:
    try:
        return pframe.marshal(method, channel)
    except (ValueError, TypeError, struct.error):
        return b""  # a value no encoder can write (e.g. a name over 255 bytes)


def _methods() -> st.SearchStrategy[Any]:
    b = st.booleans()
    return st.one_of(
        st.builds(partial(_make, commands.Channel.Open)),
        st.builds(lambda: commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)),
        st.builds(partial(_make, commands.Channel.CloseOk)),
        st.builds(partial(_make, commands.Channel.Flow), active=b),
        st.builds(partial(_make, commands.Exchange.Declare), exchange=NAMES, exchange_type=st.sampled_from(["direct", "fanout", "topic", "headers", "bogus"]),
                  passive=b, durable=b, auto_delete=b, internal=b, arguments=ARGS),
        st.builds(partial(_make, commands.Exchange.Delete), exchange=NAMES, if_unused=b),
        st.builds(partial(_make, commands.Exchange.Bind), destination=NAMES, source=NAMES, routing_key=KEYS, arguments=ARGS),
        st.builds(partial(_make, commands.Queue.Declare), queue=NAMES, passive=b, durable=b, exclusive=b, auto_delete=b, arguments=ARGS),
        st.builds(partial(_make, commands.Queue.Bind), queue=NAMES, exchange=NAMES, routing_key=KEYS, arguments=ARGS),
        st.builds(partial(_make, commands.Queue.Unbind), queue=NAMES, exchange=NAMES, routing_key=KEYS, arguments=ARGS),
        st.builds(partial(_make, commands.Queue.Purge), queue=NAMES),
        st.builds(partial(_make, commands.Queue.Delete), queue=NAMES, if_unused=b, if_empty=b),
        st.builds(partial(_make, commands.Basic.Qos), prefetch_count=st.integers(0, 70000).filter(lambda n: n < 65536), global_=b,
                  prefetch_size=st.sampled_from([0, 0, 1])),
        st.builds(partial(_make, commands.Basic.Consume), queue=NAMES, consumer_tag=st.sampled_from(["", "c", "c"]), no_ack=b, exclusive=b),
        st.builds(partial(_make, commands.Basic.Cancel), consumer_tag=st.sampled_from(["", "c", "zz"])),
        st.builds(partial(_make, commands.Basic.Get), queue=NAMES, no_ack=b),
        st.builds(partial(_make, commands.Basic.Ack), delivery_tag=TAGS, multiple=b),
        st.builds(partial(_make, commands.Basic.Nack), delivery_tag=TAGS, multiple=b, requeue=b),
        st.builds(partial(_make, commands.Basic.Reject), delivery_tag=TAGS, requeue=b),
        st.builds(partial(_make, commands.Basic.Recover), requeue=b),
        st.builds(partial(_make, commands.Confirm.Select)),
        st.builds(partial(_make, commands.Tx.Select)),
        st.builds(partial(_make, commands.Tx.Commit)),
        st.builds(partial(_make, commands.Tx.Rollback)),
        st.builds(lambda: commands.Connection.Blocked(reason="x")),
        st.builds(lambda: commands.Connection.TuneOk(channel_max=1, frame_max=4096, heartbeat=0)),
    )


def _publish(exchange: str, key: str, body: bytes, declared: int, props: Any, mandatory: bool, channel: int) -> bytes:
    head = pheader.ContentHeader(0, declared, props)
    return (_marshal(_make(commands.Basic.Publish, exchange=exchange, routing_key=key, mandatory=mandatory), channel)
            + _marshal(head, channel) + (pframe.marshal(pbody.ContentBody(body), channel) if body else b""))


PROPS = st.builds(
    partial(_make, commands.Basic.Properties),
    content_type=st.one_of(st.none(), st.text(max_size=10)),
    headers=st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-(1 << 40), 1 << 40), st.text(max_size=5), st.booleans()), max_size=3)),
    delivery_mode=st.one_of(st.none(), st.sampled_from([1, 2, 0, 7])),
    priority=st.one_of(st.none(), st.integers(0, 255)),
    expiration=st.one_of(st.none(), st.sampled_from(["0", "100", "-1", "abc", "99999999999999"])),
)
PUBLISHES = st.builds(
    lambda ex, key, body, delta, props, mandatory, ch: _publish(ex, key, body, max(0, len(body) + delta), props, mandatory, ch),
    NAMES, KEYS, st.binary(max_size=64), st.sampled_from([0, 0, 0, -1, 1, 5]), PROPS, st.booleans(), CHANNELS,
)
METHOD_FRAMES = st.builds(_marshal, _methods(), CHANNELS)
RANDOM_FRAMES = st.builds(
    lambda kind, ch, payload, end: struct.pack(">BHI", kind, ch, len(payload)) + payload + end,
    st.sampled_from([1, 2, 3, 8, 0, 4, 206]), CHANNELS, st.binary(max_size=40), st.sampled_from([b"\xce", b"\xce", b"\x00"]),
)
MUTATED = st.builds(
    lambda frame, at, byte: frame[:at % max(1, len(frame))] + bytes([byte]) + frame[at % max(1, len(frame)) + 1:],
    METHOD_FRAMES, st.integers(0, 200), st.integers(0, 255),
)
FRAMES = st.lists(st.one_of(METHOD_FRAMES, METHOD_FRAMES, PUBLISHES, RANDOM_FRAMES, MUTATED, st.binary(max_size=30)), max_size=12)


def _recv_frame(sock: socket.socket, buf: bytearray) -> Any:
    while True:
        if len(buf) >= 7:
            size = struct.unpack_from(">I", buf, 3)[0]
            if len(buf) >= 8 + size:
                raw = bytes(buf[: 8 + size])
                del buf[: 8 + size]
                return pframe.unmarshal(raw)[2]
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        buf += data


def handshake(port: int) -> socket.socket:
    """A connection opened as far as ``connection.open-ok``, with channel 1 open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    buf = bytearray()
    sock.sendall(HEADER)
    assert isinstance(_recv_frame(sock, buf), commands.Connection.Start)
    sock.sendall(pframe.marshal(commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"), 0))
    tune = _recv_frame(sock, buf)
    assert isinstance(tune, commands.Connection.Tune), tune
    sock.sendall(pframe.marshal(commands.Connection.TuneOk(channel_max=16, frame_max=4096, heartbeat=0), 0)
                 + pframe.marshal(commands.Connection.Open(virtual_host="/"), 0)
                 + pframe.marshal(commands.Channel.Open(), 1))
    assert isinstance(_recv_frame(sock, buf), commands.Connection.OpenOk)
    assert isinstance(_recv_frame(sock, buf), commands.Channel.OpenOk)
    return sock


def _drain(sock: socket.socket, timeout_s: float) -> None:
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except (TimeoutError, OSError):
        pass


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    port = free_port()
    proc = BrokerProcess(tmp_path_factory.mktemp("fuzz-amqp") / "data", env={"ACKBUS_AMQP_PORT": str(port)})
    proc.amqp_port = port  # type: ignore[attr-defined]
    proc.start()
    sentinel = handshake(port)
    sentinel.sendall(pframe.marshal(commands.Queue.Declare(queue="sentinel"), 1))
    assert isinstance(_recv_frame(sentinel, bytearray()), commands.Queue.DeclareOk)
    proc.sentinel = sentinel  # type: ignore[attr-defined]
    try:
        yield proc
        # the sentinel connection was never touched by any case
        buf = bytearray()
        sentinel.settimeout(10)
        sentinel.sendall(pframe.marshal(commands.Queue.Declare(queue="sentinel", passive=True), 1))
        assert isinstance(_recv_frame(sentinel, buf), commands.Queue.DeclareOk)
        log = proc.log_path.read_text(errors="replace")
        assert "amqp connection failed" not in log, log[-5000:]
        assert "Traceback" not in log, log[-5000:]
    finally:
        sentinel.close()
        proc.stop()


@FUZZ
@given(opening=st.sampled_from(["handshake", "handshake", "handshake", "header", "garbage"]), frames=FRAMES)
def test_amqp_frames_never_hurt_the_broker(broker: BrokerProcess, opening: str, frames: list[bytes]) -> None:
    port = broker.amqp_port  # type: ignore[attr-defined]
    if opening == "handshake":
        sock = handshake(port)
    else:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(HEADER if opening == "header" else b"AMQP\x00\x00\x08\x00")
    try:
        try:
            sock.sendall(b"".join(frames) + pframe.marshal(
                commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 0))
        except OSError:
            pass  # the broker closed first: fine
        _drain(sock, 0.2)
    finally:
        sock.close()
    assert broker.request("GET", "/healthz")[0] == 200
    handshake(port).close()  # a new connection is served

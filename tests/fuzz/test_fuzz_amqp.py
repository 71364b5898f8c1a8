"""Fuzzing the AMQP port: no sequence of frames on one connection may crash the broker,
hang it, or touch another connection.

One broker subprocess takes every case. A case opens a connection — the handshake
done right, a handshake with random values (mechanism, credentials, channel-max,
frame-max, heartbeat, vhost; sometimes a byte mutated), the protocol header alone, or
another protocol's header — then sends a random mix of: well-formed methods with
random fields on right and wrong channel numbers; publishes whose body is longer or
shorter than their header said; valid scripts (declare, bind, confirm, publish with
header and body, consume, get, acks, tx) with bytes flipped, inserted, deleted or cut
off; frames over the negotiated frame-max, or whose size field lies; random frames;
raw garbage. It ends with ``connection.close`` and a half-close of the socket.

After each case: the broker ended that connection by itself within a deadline (it
never hangs on a half-read frame), and the sentinel connection, opened before the
first case, answers a passive declare (other connections stay served); every
``CHECK_EVERY`` cases ``/healthz`` answers and a fresh AMQP connection completes a
handshake. At the end the broker's log holds no failed connection (an exception that
escaped the session) and no traceback. ``ACKBUS_FUZZ_EXAMPLES`` sets the number of
cases (``scripts/fuzz``: 100,000 by default)."""

from __future__ import annotations

import os
import socket
import struct
import time
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
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
HEADER = b"AMQP\x00\x00\x09\x01"

NAMES = st.sampled_from(["q", "x", "", "amq.direct", "amq.gen-1", "amq.default", "é", "q" * 200, "fz", "amq.topic",
                         "amq.rabbitmq.reply-to", "amq.rabbitmq.reply-to.x.1"])
KEYS = st.sampled_from(["", "k", "a.b", "#", "*.x", "amq.rabbitmq.reply-to.x.1"])
ARGS = st.dictionaries(
    st.sampled_from(["x-max-length", "x-message-ttl", "x-expires", "x-dead-letter-exchange", "x-max-priority",
                     "x-queue-type", "x-overflow", "x-match", "alternate-exchange", "x-single-active-consumer", "zz",
                     "x-delayed-type", "x-queue-mode", "x-queue-version", "x-queue-leader-locator",
                     "x-queue-master-locator", "x-dead-letter-strategy", "x-max-in-memory-length"]),
    st.one_of(st.integers(-5, 300), st.text(max_size=8), st.booleans(), st.none()),
    max_size=3,
)
CHANNELS = st.sampled_from([1, 1, 1, 2, 0, 9, 65535])
#: The frame-max the handshake negotiates (frames over it are a frame error).
FRAME_MAX = 4096
#: How long the broker may take to end a connection the client closed and half-closed.
END_DEADLINE_S = 10.0
#: Every so many cases, also ``/healthz`` and a fresh handshake.
CHECK_EVERY = 25
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
        st.builds(partial(_make, commands.Exchange.Declare), exchange=NAMES, exchange_type=st.sampled_from(["direct", "fanout", "topic", "headers", "bogus", "x-delayed-message", "x-consistent-hash"]),
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
    headers=st.one_of(st.none(), st.dictionaries(
        st.one_of(st.text(max_size=5), st.sampled_from(["x-delay", "CC", "BCC"])),
        st.one_of(st.integers(-(1 << 40), 1 << 40), st.text(max_size=5), st.booleans(), st.sampled_from(["300", "-5", "1.5"]),
                  st.lists(st.sampled_from(["k", "a.b", "q", ""]), max_size=3)),
        max_size=3)),
    delivery_mode=st.one_of(st.none(), st.sampled_from([1, 2, 0, 7])),
    priority=st.one_of(st.none(), st.integers(0, 255)),
    expiration=st.one_of(st.none(), st.sampled_from(["0", "100", "-1", "abc", "99999999999999"])),
    reply_to=st.one_of(st.none(), st.sampled_from(["amq.rabbitmq.reply-to", "r"])),
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


def _mutate(data: bytes, mutations: list[tuple[int, int, bytes]]) -> bytes:
    """``data`` with each mutation applied: (0: replace a byte, 1: insert bytes,
    2: delete up to 8 bytes, 3: cut off the rest) at a position modulo its length."""
    out = bytearray(data)
    for op, at, extra in mutations:
        if not out:
            break
        at %= len(out)
        if op == 0:
            out[at] = extra[0] if extra else out[at] ^ 0xFF
        elif op == 1:
            out[at:at] = extra
        elif op == 2:
            del out[at:at + 1 + len(extra) % 8]
        else:
            del out[at:]
    return bytes(out)


MUTATIONS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.binary(max_size=6)), min_size=1, max_size=3)


def _script_steps() -> list[bytes]:
    """The steps of a valid script on channel 1 (each a few whole frames)."""
    m = _marshal
    steps = [
        m(commands.Queue.Declare(queue="fz"), 1),
        m(commands.Queue.Declare(queue="", exclusive=True), 1),
        m(commands.Queue.Bind(queue="fz", exchange="amq.direct", routing_key="k"), 1),
        m(commands.Confirm.Select(), 1),
        m(commands.Basic.Qos(prefetch_count=2), 1),
        m(commands.Basic.Consume(queue="fz", consumer_tag="c", arguments={"x-priority": 3}), 1),
        m(commands.Basic.Get(queue="fz"), 1),
        m(commands.Basic.Ack(delivery_tag=1), 1),
        m(commands.Basic.Ack(delivery_tag=0, multiple=True), 1),
        m(commands.Basic.Nack(delivery_tag=2, requeue=True), 1),
        m(commands.Basic.Cancel(consumer_tag="c"), 1),
        m(commands.Basic.Recover(requeue=True), 1),
        m(commands.Tx.Select(), 1),
        m(commands.Tx.Commit(), 1),
        m(commands.Channel.Open(), 2),
        m(commands.Queue.Purge(queue="fz"), 1),
    ]
    for exchange, key, size in (("amq.direct", "k", 10), ("", "fz", 0), ("", "fz", 5000)):
        body = bytes(range(256)) * (size // 256) + b"b" * (size % 256)
        frames = [m(commands.Basic.Publish(exchange=exchange, routing_key=key), 1),
                  m(pheader.ContentHeader(0, len(body), commands.Basic.Properties(delivery_mode=2)), 1)]
        for start in range(0, len(body), FRAME_MAX - 8):
            frames.append(pframe.marshal(pbody.ContentBody(body[start:start + FRAME_MAX - 8]), 1))
        steps.append(b"".join(frames))
    return steps


SCRIPTS = st.builds(
    lambda steps, mutations, mutate: _mutate(b"".join(steps), mutations) if mutate else b"".join(steps),
    st.lists(st.sampled_from(_script_steps()), min_size=1, max_size=10), MUTATIONS, st.booleans(),
)
OVERSIZED = st.one_of(
    # a body frame over frame-max, after a publish and its header that announce it
    st.builds(lambda n, ch: _publish("", "fz", b"", n, commands.Basic.Properties(), False, ch)
              + struct.pack(">BHI", 3, ch, n) + b"o" * n + b"\xce",
              st.sampled_from([FRAME_MAX - 7, FRAME_MAX, FRAME_MAX * 2, 131073]), CHANNELS),
    # a frame whose size field claims far more than follows (or than any frame may be)
    st.builds(lambda kind, size, ch: struct.pack(">BHI", kind, ch, size) + b"\x00" * 16,
              st.sampled_from([1, 2, 3]), st.sampled_from([FRAME_MAX, 1 << 20, (1 << 32) - 1]), CHANNELS),
)
FRAMES = st.lists(
    st.one_of(METHOD_FRAMES, METHOD_FRAMES, PUBLISHES, SCRIPTS, SCRIPTS, OVERSIZED, RANDOM_FRAMES, MUTATED,
              st.binary(max_size=30)),
    max_size=12,
)
#: A handshake with random values in two halves: the start-ok (the broker answers it
#: once the login is checked: a client must wait), then the tune-ok, the open and a
#: channel.open; each half sometimes with bytes mutated (a mutated start-ok is sent
#: with the rest at once: a mutation may leave it incomplete, never answered).
FUZZED_HANDSHAKES = st.builds(
    lambda mechanism, response, channel_max, frame_max, heartbeat, vhost, mutations, where: (
        _mutate(_marshal(_make(commands.Connection.StartOk, mechanism=mechanism, response=response,
                               client_properties={}, locale="en_US"), 0), mutations) if where == 1 else
        _marshal(_make(commands.Connection.StartOk, mechanism=mechanism, response=response,
                       client_properties={}, locale="en_US"), 0),
        (lambda rest: _mutate(rest, mutations) if where == 2 else rest)(
            _marshal(_make(commands.Connection.TuneOk, channel_max=channel_max, frame_max=frame_max,
                           heartbeat=heartbeat), 0)
            + _marshal(_make(commands.Connection.Open, virtual_host=vhost), 0)
            + _marshal(commands.Channel.Open(), 1)),
        where != 1,
    ),
    st.sampled_from(["PLAIN", "PLAIN", "AMQPLAIN", "EXTERNAL", "", "plain"]),
    st.sampled_from(["\x00guest\x00guest", "\x00guest\x00guest", "\x00guest\x00nope", "", "\x00\x00", "guest",
                     "\x00" * 300]),
    st.sampled_from([0, 1, 16, 2047, 2048, 65535]),
    st.sampled_from([0, 8, 4095, 4096, 131072, 131073, (1 << 32) - 1]),
    st.sampled_from([0, 1, 60, 65535]),
    st.sampled_from(["/", "", "other", "/" * 200]),
    MUTATIONS, st.sampled_from([0, 0, 1, 2]),
)


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


def _open(port: int, start_ok: bytes, rest: bytes, wait: bool = True) -> socket.socket:
    """A connection that sent ``start_ok`` once asked, then (once the broker answered
    it, with tune or close; at once unless ``wait``) ``rest``, without waiting for more."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if not wait:
        sock.sendall(HEADER + start_ok + rest)
        return sock
    buf = bytearray()
    sock.sendall(HEADER)
    assert isinstance(_recv_frame(sock, buf), commands.Connection.Start)
    sock.sendall(start_ok)
    try:
        _recv_frame(sock, buf)  # tune, or close (a refused or malformed start-ok)
        sock.sendall(rest)
    except (ConnectionError, OSError):
        pass  # the broker ended it: fine
    return sock


#: The right handshake, frame-max ``FRAME_MAX``, channel 1 opened.
START_OK = pframe.marshal(commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"), 0)
OPEN = (pframe.marshal(commands.Connection.TuneOk(channel_max=16, frame_max=FRAME_MAX, heartbeat=0), 0)
        + pframe.marshal(commands.Connection.Open(virtual_host="/"), 0)
        + pframe.marshal(commands.Channel.Open(), 1))


def handshake(port: int) -> socket.socket:
    """A connection opened as far as ``connection.open-ok``, with channel 1 open."""
    sock = _open(port, START_OK, OPEN)
    buf = bytearray()
    assert isinstance(_recv_frame(sock, buf), commands.Connection.OpenOk)
    assert isinstance(_recv_frame(sock, buf), commands.Channel.OpenOk)
    return sock


def _until_ended(sock: socket.socket, deadline_s: float) -> bool:
    """Read everything the broker sends until it ends the connection: False if it has
    not within ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True  # reset by the broker: ended too


def _sentinel_answers(sock: socket.socket) -> bool:
    """The sentinel connection (channel 1, queue ``sentinel``) answers a passive declare."""
    sock.sendall(pframe.marshal(commands.Queue.Declare(queue="sentinel", passive=True), 1))
    return isinstance(_recv_frame(sock, bytearray()), commands.Queue.DeclareOk)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    port = free_port()
    # (no fsync: the cases are about parsing and the protocol, not durability)
    proc = BrokerProcess(tmp_path_factory.mktemp("fuzz-amqp") / "data",
                         env={"ACKBUS_AMQP_PORT": str(port), "ACKBUS_FSYNC": "never"})
    proc.amqp_port = port
    proc.start()
    sentinel = handshake(port)
    sentinel.sendall(pframe.marshal(commands.Queue.Declare(queue="sentinel"), 1))
    assert isinstance(_recv_frame(sentinel, bytearray()), commands.Queue.DeclareOk)
    proc.sentinel = sentinel  # type: ignore[attr-defined]
    proc.cases = 0  # type: ignore[attr-defined]
    started = time.monotonic()
    try:
        yield proc
        print(f"\namqp fuzz: {proc.cases} cases in {time.monotonic() - started:.0f} s")  # type: ignore[attr-defined]
        # the sentinel connection was never touched by any case
        sentinel.settimeout(10)
        assert _sentinel_answers(sentinel)
        log = proc.log_path.read_text(errors="replace")
        assert "amqp connection failed" not in log, log[-5000:]
        assert "Traceback" not in log, log[-5000:]
    finally:
        sentinel.close()
        proc.stop()


@FUZZ
@given(opening=st.sampled_from(["handshake", "handshake", "handshake", "fuzzed", "header", "garbage"]),
       fuzzed=FUZZED_HANDSHAKES, frames=FRAMES)
def test_amqp_frames_never_hurt_the_broker(broker: BrokerProcess, opening: str, fuzzed: tuple[bytes, bytes, bool], frames: list[bytes]) -> None:
    port = broker.amqp_port
    if opening == "handshake":
        sock = _open(port, START_OK, OPEN)  # (the frames follow the open without waiting)
    elif opening == "fuzzed":
        sock = _open(port, *fuzzed)
    else:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(HEADER if opening == "header" else b"AMQP\x00\x00\x08\x00")
    try:
        try:
            sock.sendall(b"".join(frames) + pframe.marshal(
                commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 0))
            sock.shutdown(socket.SHUT_WR)  # whatever frame it is reading cannot complete now
        except OSError:
            pass  # the broker closed first: fine
        assert _until_ended(sock, END_DEADLINE_S), "the broker did not end a connection its client closed"
    finally:
        sock.close()
    broker.cases += 1  # type: ignore[attr-defined]
    assert _sentinel_answers(broker.sentinel)  # type: ignore[attr-defined]
    if broker.cases % CHECK_EVERY == 0:  # type: ignore[attr-defined]
        assert broker.request("GET", "/healthz")[0] == 200
        handshake(port).close()  # a new connection is served

"""One AMQP 0-9-1 connection as a state machine, without sockets (h11's pattern).

Bytes in (:meth:`AMQPConnection.receive_data`), events out (:meth:`next_event`), bytes
to send out (:meth:`data_to_send`). The machine does the protocol's own work: the
protocol header and the version-mismatch answer, ``start``/``start-ok`` (it decodes
the PLAIN and AMQPLAIN responses; whether they are right is the caller's to say),
``tune`` (channel-max, frame-max and heartbeat negotiated, then enforced), ``open``
(vhost ``/``), heartbeats (times are arguments), channel numbers and their open/close
handshakes, the assembly of a publish's method, header and body frames, and every
framing rule, answering a violation with RabbitMQ's connection or channel exception.

What a method means for the broker (declares, consumes, publishes, acks) is not its
business: those arrive as :class:`Method` and :class:`Content` events for the session
(``session.py``).

Why one module of ~560 lines: the handshake, tune, channel table and content assembly
read and write one state, and every framing rule is a branch of the one frame
dispatch; the events are in ``events.py``, the codec in ``frames.py``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pamqp import commands

from broker.amqp.events import (
    ChannelClosedByPeer,
    ChannelFailed,
    ChannelOpened,
    ConnectionEnded,
    Content,
    Login,
    Method,
    Opened,
)
from broker.amqp.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    PROTOCOL_HEADER,
    ContentHeader,
    FrameError,
    FrameReader,
    PamqpMethod,
    Publish,
    decode_content_header,
    decode_method,
    encode_heartbeat,
    encode_method,
)
from broker.amqp.hotpath import HotReader
from broker.amqp.replies import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_ERROR,
    UNEXPECTED_FRAME,
    reply_text,
)
from broker.amqp.tables import TableError, decode_table

__all__ = [
    "AMQPConnection",
    "ChannelClosedByPeer",
    "ChannelFailed",
    "ChannelOpened",
    "ConnectionEnded",
    "Content",
    "Login",
    "Method",
    "Opened",
    "State",
    "TuneLimits",
]

FRAME_MIN_SIZE = 4096
#: Unfinished message bodies one connection may hold, in units of max_body_bytes.
ASSEMBLING_FACTOR = 4
CLASS_CONNECTION = 10
CLASS_CHANNEL = 20


class State(enum.Enum):
    AWAIT_HEADER = "await_header"
    AWAIT_START_OK = "await_start_ok"
    AUTHENTICATING = "authenticating"
    AWAIT_TUNE_OK = "await_tune_ok"
    AWAIT_OPEN = "await_open"
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close: only close-ok (or close) counts
    CLOSED = "closed"


@dataclass(frozen=True)
class TuneLimits:
    """What the server offers in ``connection.tune``."""

    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat_s: int = 60
    #: Largest message body a publish may carry (RabbitMQ's max_message_size).
    max_body_bytes: int = 128 << 20
    #: How long a client may take between two frames of the handshake, and to open
    #: the connection (RabbitMQ's handshake_timeout).
    handshake_timeout_s: float = 10.0


_NEED_DATA = None


@dataclass(slots=True)
class _Assembly:
    publish: Publish
    header: ContentHeader | None = None
    parts: list[bytes] = field(default_factory=list)
    received: int = 0


class AMQPConnection:
    """The server side of one AMQP 0-9-1 connection (see the module docstring)."""

    def __init__(self, limits: TuneLimits, server_properties: dict[str, Any], *, now: float = 0.0) -> None:
        self.limits = limits
        self.server_properties = server_properties
        self.state = State.AWAIT_HEADER
        self._reader = FrameReader(FRAME_MIN_SIZE)
        self._hot = HotReader()
        self._out = bytearray()
        self._events: deque[Any] = deque()
        #: Negotiated in tune-ok.
        self.channel_max = limits.channel_max
        self.frame_max = limits.frame_max
        self.heartbeat_s = 0
        self.client_properties: dict[str, Any] = {}
        self.username = ""
        #: Open channels; those we closed and await close-ok for are in _closing.
        self.channels: set[int] = set()
        self._closing: set[int] = set()
        self._assembly: dict[int, _Assembly] = {}
        #: Bytes of the bodies being assembled, all channels together.
        self._assembling = 0
        self.last_received = now
        self.last_sent = now
        self.ended: ConnectionEnded | None = None

    # -- input --------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float = 0.0) -> None:
        """Bytes from the client. Any events they complete are queued."""
        if self.state is State.CLOSED:
            return
        self.last_received = now
        self._reader.feed(data)
        try:
            self._parse()
        except FrameError as exc:
            if self.state is State.CLOSING:
                # no close-ok can be read from bytes that do not parse: end now
                self._end(exc.code, exc.text, False)
            else:
                self.close(exc.code, exc.text, exc.class_id, exc.method_id)
                if exc.framing:
                    # the rest of the stream cannot be split into frames: no close-ok
                    # will be readable, so the connection ends once the close is sent
                    self._end(exc.code, exc.text, False)

    def next_event(self) -> Any:
        """The next event, or None when more bytes are needed."""
        return self._events.popleft() if self._events else _NEED_DATA

    def _parse(self) -> None:
        reader = self._reader
        while self.state is not State.CLOSED:
            if self.state is State.AWAIT_HEADER:
                header = reader.read_protocol_header()
                if header is None:
                    if reader.buffered() and not PROTOCOL_HEADER.startswith(reader.peek(8)):
                        self._bad_header()
                    return
                if header != PROTOCOL_HEADER:
                    self._bad_header()
                    return
                self._send_method(0, commands.Connection.Start(
                    server_properties=self.server_properties, mechanisms="PLAIN AMQPLAIN", locales="en_US"
                ))
                self.state = State.AWAIT_START_OK
                continue
            if self.state is State.OPEN and reader.buffered() >= 8:
                # publishes and acks in one pass (hotpath.py); the rest frame by frame
                ready = self.channels.difference(self._assembly) if self._assembly else self.channels
                buf, pos = reader.window()
                end = self._hot.scan(buf, pos, reader.frame_max, self.limits.max_body_bytes, ready, self._events)
                if end != pos:
                    reader.advance(end)
            frame = reader.next_frame()
            if frame is None:
                return
            kind, channel, payload = frame
            if kind == FRAME_HEARTBEAT:
                if channel != 0:
                    raise FrameError(FRAME_ERROR, "heartbeat frame on a channel other than 0")
                continue
            if self.state is State.CLOSING:
                if kind == FRAME_METHOD and channel == 0:
                    index, method = decode_method(payload)
                    if isinstance(method, commands.Connection.CloseOk):
                        self._end(self.ended.code if self.ended else 0, self.ended.text if self.ended else "", False)
                    elif isinstance(method, commands.Connection.Close):
                        self._send_method(0, commands.Connection.CloseOk())
                        self._end(self.ended.code if self.ended else 0, self.ended.text if self.ended else "", False)
                continue  # everything else is discarded while closing
            if channel == 0:
                if kind != FRAME_METHOD:
                    raise FrameError(UNEXPECTED_FRAME, f"frame type {kind} on channel 0")
                self._connection_method(payload)
            else:
                self._channel_frame(kind, channel, payload)

    def _bad_header(self) -> None:
        """Not AMQP 0-9-1: answer with the header we speak and close (the spec's rule)."""
        self._out += PROTOCOL_HEADER
        self._end(0, "protocol header mismatch", False)

    # -- connection class ------------------------------------------------------------

    def _connection_method(self, payload: bytes) -> None:
        index, method = decode_method(payload)
        state = self.state
        if index >> 16 != CLASS_CONNECTION:
            if state is not State.OPEN:
                raise FrameError(CHANNEL_ERROR, f"expected connection method, got {_name(method)}", index >> 16, index & 0xFFFF)
            raise FrameError(COMMAND_INVALID, f"{_name(method)} on channel 0", index >> 16, index & 0xFFFF)
        if isinstance(method, commands.Connection.Close):
            self._send_method(0, commands.Connection.CloseOk())
            self._end(method.reply_code or 0, method.reply_text or "", True)
            return
        if state is State.AWAIT_START_OK and isinstance(method, commands.Connection.StartOk):
            self._start_ok(method)
        elif state is State.AWAIT_TUNE_OK and isinstance(method, commands.Connection.TuneOk):
            self._tune_ok(method)
        elif state is State.AWAIT_OPEN and isinstance(method, commands.Connection.Open):
            if method.virtual_host not in ("/", ""):
                self.close(NOT_ALLOWED, f"vhost '{method.virtual_host}' not found: ackbus has the one vhost '/'", 10, 40)
                return
            self._send_method(0, commands.Connection.OpenOk())
            self.state = State.OPEN
            self._events.append(Opened(method.virtual_host))
        elif state is State.OPEN and isinstance(method, commands.Connection.CloseOk):
            pass  # stray
        elif isinstance(method, (commands.Connection.Blocked, commands.Connection.Unblocked)):
            pass  # clients do not send these; ignore, as RabbitMQ does
        else:
            raise FrameError(COMMAND_INVALID, f"unexpected {_name(method)} in state {state.value}", index >> 16, index & 0xFFFF)

    def _start_ok(self, method: commands.Connection.StartOk) -> None:
        self.client_properties = dict(method.client_properties or {})
        mechanism = method.mechanism or ""
        response = method.response or ""
        raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response)
        if mechanism == "PLAIN":
            parts = raw.split(b"\x00")
            if len(parts) != 3:
                self.close(ACCESS_REFUSED, "ACCESS_REFUSED - malformed PLAIN response", 10, 11)
                return
            username, password = parts[1], parts[2]
        elif mechanism == "AMQPLAIN":
            try:
                table, _end = decode_table(len(raw).to_bytes(4, "big") + raw, typed=False)
            except TableError:
                self.close(ACCESS_REFUSED, "ACCESS_REFUSED - malformed AMQPLAIN response", 10, 11)
                return
            username = str(table.get("LOGIN", "")).encode()
            password = str(table.get("PASSWORD", "")).encode()
        else:
            self.close(ACCESS_REFUSED, f"ACCESS_REFUSED - unsupported authentication mechanism '{mechanism[:64]}'", 10, 11)
            return
        self.state = State.AUTHENTICATING
        self._events.append(
            Login(
                mechanism,
                username.decode("utf-8", "replace"),
                password.decode("utf-8", "replace"),
                self.client_properties,
            )
        )

    def accept_login(self, username: str) -> None:
        """The credentials are right: offer the connection's limits (``tune``)."""
        if self.state is not State.AUTHENTICATING:
            return
        self.username = username
        self.state = State.AWAIT_TUNE_OK
        self._send_method(0, commands.Connection.Tune(
            channel_max=self.limits.channel_max, frame_max=self.limits.frame_max, heartbeat=self.limits.heartbeat_s
        ))

    def refuse_login(self, mechanism: str, text: str | None = None) -> None:
        self.close(
            ACCESS_REFUSED,
            text or f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}. "
            "For details see the broker logfile.",
            10, 11,
        )

    def _tune_ok(self, method: commands.Connection.TuneOk) -> None:
        frame_max = method.frame_max or self.limits.frame_max
        if frame_max < FRAME_MIN_SIZE:
            self.close(NOT_ALLOWED, f"NOT_ALLOWED - frame_max={frame_max} < {FRAME_MIN_SIZE} min size", 10, 31)
            return
        if frame_max > self.limits.frame_max:
            self.close(NOT_ALLOWED, f"NOT_ALLOWED - frame_max={frame_max} > {self.limits.frame_max} max size", 10, 31)
            return
        channel_max = method.channel_max or self.limits.channel_max
        if channel_max > self.limits.channel_max:
            self.close(NOT_ALLOWED, f"NOT_ALLOWED - channel_max={channel_max} > {self.limits.channel_max} max", 10, 31)
            return
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat_s = method.heartbeat or 0
        self._reader.frame_max = frame_max
        self.state = State.AWAIT_OPEN

    # -- channels --------------------------------------------------------------------

    def _channel_frame(self, kind: int, channel: int, payload: bytes) -> None:
        if self.state is not State.OPEN:
            raise FrameError(CHANNEL_ERROR, f"frame on channel {channel} before the connection is open")
        if channel in self._closing:
            if kind == FRAME_METHOD:
                index, method = decode_method(payload)
                if isinstance(method, commands.Channel.CloseOk):
                    self._closing.discard(channel)
                elif isinstance(method, commands.Channel.Close):
                    self._send_method(channel, commands.Channel.CloseOk())
            return  # the rest is discarded until close-ok (the spec's rule)
        assembly = self._assembly.get(channel)
        if kind == FRAME_HEADER:
            if assembly is None or assembly.header is not None:
                raise FrameError(UNEXPECTED_FRAME, f"UNEXPECTED_FRAME - expected method frame, got content header on channel {channel}")
            header = decode_content_header(payload)
            if header.class_id != 60:
                raise FrameError(FRAME_ERROR, f"content header of class {header.class_id}, expected 60")
            if header.body_size > self.limits.max_body_bytes:
                del self._assembly[channel]
                self._fail_channel(
                    channel, PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - message size {header.body_size} is larger than configured max size "
                    f"{self.limits.max_body_bytes}", 60, 40,
                )
                return
            assembly.header = header
            if header.body_size == 0:
                del self._assembly[channel]
                self._events.append(Content(channel, assembly.publish, header.properties, b""))
            return
        if kind == FRAME_BODY:
            if assembly is None or assembly.header is None:
                raise FrameError(UNEXPECTED_FRAME, f"UNEXPECTED_FRAME - expected method frame, got content body on channel {channel}")
            assembly.received += len(payload)
            if assembly.received > assembly.header.body_size:
                raise FrameError(FRAME_ERROR, f"FRAME_ERROR - content body longer than its header's {assembly.header.body_size} bytes")
            self._assembling += len(payload)
            if self._assembling > ASSEMBLING_FACTOR * self.limits.max_body_bytes:
                # unfinished bodies interleaved on many channels: bounded per connection
                raise FrameError(RESOURCE_ERROR, "RESOURCE_ERROR - too many unfinished message bodies on this connection")
            assembly.parts.append(payload)
            if assembly.received == assembly.header.body_size:
                self._assembling -= assembly.received
                del self._assembly[channel]
                body = assembly.parts[0] if len(assembly.parts) == 1 else b"".join(assembly.parts)
                self._events.append(Content(channel, assembly.publish, assembly.header.properties, body))
            return
        # a method frame
        if assembly is not None:
            raise FrameError(UNEXPECTED_FRAME, f"UNEXPECTED_FRAME - expected content {'body' if assembly.header else 'header'} on channel {channel}, got a method")
        index, method = decode_method(payload)
        if type(method) is Publish:
            if channel not in self.channels:
                raise FrameError(CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'", 60, 40)
            self._assembly[channel] = _Assembly(method)
            return
        cls = index >> 16
        if cls == CLASS_CONNECTION:
            raise FrameError(COMMAND_INVALID, f"COMMAND_INVALID - {_name(method)} on channel {channel}", cls, index & 0xFFFF)
        if cls == CLASS_CHANNEL:
            self._channel_method(channel, method, index)
            return
        if channel not in self.channels:
            raise FrameError(CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'", cls, index & 0xFFFF)
        self._events.append(Method(channel, index, method))

    def _channel_method(self, channel: int, method: Any, index: int) -> None:
        if isinstance(method, commands.Channel.Open):
            if channel in self.channels:
                raise FrameError(CHANNEL_ERROR, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)
            if channel > self.channel_max:
                raise FrameError(CHANNEL_ERROR, f"CHANNEL_ERROR - channel {channel} above channel_max {self.channel_max}", 20, 10)
            self.channels.add(channel)
            # open-ok once the session has a core channel for it (channel_open_ok)
            self._events.append(ChannelOpened(channel))
            return
        if channel not in self.channels:
            raise FrameError(CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'", 20, index & 0xFFFF)
        if isinstance(method, commands.Channel.Close):
            self.channels.discard(channel)
            self._events.append(ChannelClosedByPeer(channel))
        elif isinstance(method, commands.Channel.Flow):
            if not method.active:
                self._fail_channel(channel, NOT_IMPLEMENTED, "NOT_IMPLEMENTED - active=false", 20, 20)
                return
            self._send_method(channel, commands.Channel.FlowOk(active=True))
        elif isinstance(method, commands.Channel.CloseOk):
            pass  # a close-ok we did not ask for: ignore
        else:
            self._events.append(Method(channel, index, method))

    def channel_open_ok(self, channel: int) -> None:
        """The session took the channel: answer ``channel.open``."""
        if self.state is State.OPEN and channel in self.channels:
            self._send_method(channel, commands.Channel.OpenOk())

    def channel_close_ok(self, channel: int) -> None:
        """Answer the client's ``channel.close`` (after what was queued for it)."""
        if self.state is State.OPEN:
            self._send_method(channel, commands.Channel.CloseOk())

    def _fail_channel(self, channel: int, code: int, text: str, class_id: int, method_id: int) -> None:
        self.close_channel(channel, code, text, class_id, method_id)
        self._events.append(ChannelFailed(channel, code, text))

    def close_channel(self, channel: int, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """A channel exception: send ``channel.close`` and discard the channel's frames
        until the client's close-ok."""
        if channel not in self.channels or self.state is not State.OPEN:
            return
        self.channels.discard(channel)
        dropped = self._assembly.pop(channel, None)
        if dropped is not None:
            self._assembling -= dropped.received
        self._closing.add(channel)
        self._send_method(channel, commands.Channel.Close(
            reply_code=code, reply_text=_text(code, text), class_id=class_id, method_id=method_id
        ))

    # -- output ---------------------------------------------------------------------

    def _send_method(self, channel: int, method: PamqpMethod) -> None:
        self._out += encode_method(channel, method)

    def send_method(self, channel: int, method: PamqpMethod) -> None:
        """Queue a method reply (declare-ok and the like) on an open channel."""
        if self.state is State.OPEN and channel in self.channels:
            self._out += encode_method(channel, method)

    def send_raw(self, data: bytes) -> None:
        """Queue frames the session encoded itself (deliveries, confirms, returns)."""
        if self.state is State.OPEN:
            self._out += data

    def send_connection_method(self, method: PamqpMethod) -> None:
        """``connection.blocked`` / ``unblocked``."""
        if self.state is State.OPEN:
            self._out += encode_method(0, method)

    def data_to_send(self, now: float = 0.0) -> bytes:
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        self.last_sent = now
        return data

    def pending_output(self) -> int:
        return len(self._out)

    # -- time -----------------------------------------------------------------------

    def check_timers(self, now: float) -> None:
        """Send a heartbeat if nothing was sent for half the interval; end the
        connection when the client sent nothing for two intervals (RabbitMQ's rule).
        Before the handshake ends, a client that stays silent for
        ``handshake_timeout_s`` is dropped (a connection that never logs in holds
        nothing for long)."""
        if self.state is State.CLOSED:
            return
        if self.state in (State.AWAIT_HEADER, State.AWAIT_START_OK, State.AWAIT_TUNE_OK, State.AWAIT_OPEN):
            if now - self.last_received > self.limits.handshake_timeout_s:
                self._end(0, "handshake timed out", False)
            return
        interval = self.heartbeat_s
        if not interval:
            return
        if now - self.last_received > 2 * interval:
            self._end(0, f"missed heartbeats from client, timeout: {interval}s", False)
            return
        if now - self.last_sent >= interval / 2 and not self._out:
            self._out += encode_heartbeat()

    def next_timer(self) -> float | None:
        """When :meth:`check_timers` has something to do next (None: nothing)."""
        if self.state is State.CLOSED:
            return None
        if self.state is not State.OPEN and self.state is not State.CLOSING:
            return self.last_received + self.limits.handshake_timeout_s + 0.01
        interval = self.heartbeat_s
        if not interval:
            return None
        return min(self.last_sent + interval / 2, self.last_received + 2 * interval + 0.01)

    # -- closing --------------------------------------------------------------------

    def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """A connection exception (or the server's own close, code 320): send
        ``connection.close`` and wait for close-ok, discarding everything else."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        if self.state is State.AWAIT_HEADER:
            self._end(code, text, False)
            return
        self.state = State.CLOSING
        self._assembly.clear()
        self._assembling = 0
        self._send_method(0, commands.Connection.Close(
            reply_code=code, reply_text=_text(code, text), class_id=class_id, method_id=method_id
        ))
        self.ended = ConnectionEnded(code, _text(code, text), False)
        self._events.append(self.ended)

    def abandon(self) -> None:
        """The IO layer gives up on the connection (its close-ok never came, or its
        socket ended): it is closed, whatever state it was in."""
        if self.state is not State.CLOSED:
            self._end(self.ended.code if self.ended else 0, self.ended.text if self.ended else "abandoned", False)

    def _end(self, code: int, text: str, by_peer: bool) -> None:
        already = self.ended is not None
        self.state = State.CLOSED
        self.channels.clear()
        self._assembly.clear()
        self._assembling = 0
        if not already:
            self.ended = ConnectionEnded(code, text, by_peer)
            self._events.append(self.ended)

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def wants_blocked(self) -> bool:
        """Whether the client said it understands ``connection.blocked``."""
        caps = self.client_properties.get("capabilities")
        return isinstance(caps, dict) and bool(caps.get("connection.blocked"))

    @property
    def frame_payload_max(self) -> int:
        return self.frame_max - FRAME_OVERHEAD


def _name(method: Any) -> str:
    return getattr(method, "name", type(method).__name__).lower()


def _text(code: int, text: str) -> str:
    """RabbitMQ's form: ``NAME - details``; at most 255 bytes (a short string)."""
    name = reply_text(code)
    if name and not text.startswith(name):
        text = f"{name} - {text}"
    raw = text.encode("utf-8")
    return raw[:255].decode("utf-8", "ignore")

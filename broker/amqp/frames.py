"""The AMQP 0-9-1 frame codec: bytes in, frames and methods out; methods in, bytes out.

Sans-IO, in the manner of h11: :class:`FrameReader` is fed bytes and hands out whole
frames; the ``encode_*`` functions return the bytes of one outgoing method (with its
content frames). The per-message methods, on the hot path, are parsed and written by
hand with ``struct`` (``basic.publish``, ``basic.ack``/``nack``/``reject``, content
headers, ``basic.deliver``, confirms, ``basic.return``): about five times cheaper than
a general codec. Every other method (the handshake, declares, binds) goes through
pamqp, which knows all of them in both directions. The module is long (over 500
lines) because each hand-written method sits beside its twin in the other direction.

Errors are :class:`FrameError` with the AMQP reply code the connection closes with
(501 frame error, 502 syntax error, 505 unexpected frame).
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.base import Frame as PamqpMethod

from broker.amqp.tables import TableError, decode_table, encode_table, sendable_table

__all__ = [
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "FRAME_OVERHEAD",
    "PROTOCOL_HEADER",
    "Ack",
    "ContentHeader",
    "FrameError",
    "FrameReader",
    "Nack",
    "Publish",
    "Reject",
    "decode_method",
    "decode_content_header",
    "encode_method",
    "encode_deliver",
    "encode_get_ok",
    "encode_return",
    "encode_confirm",
    "encode_declare_ok",
    "encode_consume_ok",
    "encode_cancel_ok",
    "encode_cancel",
    "encode_heartbeat",
    "encode_properties",
    "encode_sent_properties",
    "decode_properties",
    "PamqpMethod",
]

log = logging.getLogger("ackbus.amqp")

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
#: Bytes of a frame besides its payload: type, channel, size, frame-end.
FRAME_OVERHEAD = 8

FRAME_ERROR = 501
SYNTAX_ERROR = 502
UNEXPECTED_FRAME = 505

_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">HH")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CONTENT_HEAD = struct.Struct(">HHQH")

# method indexes (class << 16 | method) of the hand-parsed methods
PUBLISH = 0x3C0028
ACK = 0x3C0050
NACK = 0x3C0078
REJECT = 0x3C005A


class FrameError(Exception):
    """Bytes that break the framing or a method's syntax: the connection closes with
    ``code``."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0, *, framing: bool = False) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id
        #: The byte stream itself is broken (no frame boundary can be found any more).
        self.framing = framing


class FrameReader:
    """Splits received bytes into frames: first the protocol header, then
    ``(type, channel, payload)`` triples. ``frame_max`` (0: unlimited until tuned) is
    enforced on every frame."""

    def __init__(self, frame_max: int) -> None:
        self._buffer = bytearray()
        self._pos = 0
        self.frame_max = frame_max
        self.header_seen = False

    def feed(self, data: bytes) -> None:
        if self._pos and self._pos == len(self._buffer):
            self._buffer.clear()
            self._pos = 0
        self._buffer += data

    def buffered(self) -> int:
        return len(self._buffer) - self._pos

    def peek(self, n: int) -> bytes:
        """Up to ``n`` buffered bytes, left in the buffer."""
        return bytes(self._buffer[self._pos : self._pos + n])

    def read_protocol_header(self) -> bytes | None:
        """The 8 bytes of the protocol header once they are here (None before)."""
        if len(self._buffer) - self._pos < 8:
            return None
        header = bytes(self._buffer[self._pos : self._pos + 8])
        self._pos += 8
        self.header_seen = True
        return header

    def window(self) -> tuple[bytearray, int]:
        """The buffer and where its unread bytes start (for ``hotpath``, which reads
        frames in place and then calls :meth:`advance`)."""
        return self._buffer, self._pos

    def advance(self, pos: int) -> None:
        """The bytes before ``pos`` were read."""
        self._pos = pos
        if pos > 65536 and pos * 2 > len(self._buffer):
            del self._buffer[:pos]
            self._pos = 0

    def next_frame(self) -> tuple[int, int, bytes] | None:
        """The next whole frame, or None until more bytes arrive. Raises FrameError."""
        buf = self._buffer
        pos = self._pos
        if len(buf) - pos < 7:
            return None
        kind, channel, size = _FRAME_HEAD.unpack_from(buf, pos)
        if kind not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
            raise FrameError(FRAME_ERROR, f"unknown frame type {kind}", framing=True)
        if self.frame_max and size + FRAME_OVERHEAD > self.frame_max:
            raise FrameError(
                FRAME_ERROR, f"frame size {size + FRAME_OVERHEAD} larger than negotiated frame_max {self.frame_max}",
                framing=True,
            )
        end = pos + 7 + size
        if len(buf) <= end:
            return None
        if buf[end] != FRAME_END:
            raise FrameError(FRAME_ERROR, f"frame end byte 0x{buf[end]:02x}, expected 0xce", framing=True)
        payload = bytes(buf[pos + 7 : end])
        self._pos = end + 1
        if self._pos > 65536 and self._pos * 2 > len(buf):
            del buf[: self._pos]
            self._pos = 0
        return kind, channel, payload


# -- methods in ----------------------------------------------------------------------


@dataclass(slots=True)
class Publish:
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool


@dataclass(slots=True)
class Ack:
    delivery_tag: int
    multiple: bool


@dataclass(slots=True)
class Nack:
    delivery_tag: int
    multiple: bool
    requeue: bool


@dataclass(slots=True)
class Reject:
    delivery_tag: int
    requeue: bool


def _shortstr(payload: bytes, pos: int) -> tuple[str, int]:
    length = payload[pos]
    end = pos + 1 + length
    if end > len(payload):
        raise IndexError
    return payload[pos + 1 : end].decode("utf-8", "surrogateescape"), end


def decode_method(payload: bytes) -> tuple[int, Publish | Ack | Nack | Reject | PamqpMethod]:
    """(method index, the method) of a method frame's payload. Raises FrameError
    (502 for a malformed method, 540 for one the protocol does not define)."""
    if len(payload) < 4:
        raise FrameError(FRAME_ERROR, "method frame shorter than its method id")
    index = _U32.unpack_from(payload, 0)[0]
    try:
        if index == PUBLISH:
            exchange, pos = _shortstr(payload, 6)
            routing_key, pos = _shortstr(payload, pos)
            bits = payload[pos]
            return index, Publish(exchange, routing_key, bool(bits & 1), bool(bits & 2))
        if index == ACK:
            bits = payload[12]
            return index, Ack(_U64.unpack_from(payload, 4)[0], bool(bits & 1))
        if index == NACK:
            bits = payload[12]
            return index, Nack(_U64.unpack_from(payload, 4)[0], bool(bits & 1), bool(bits & 2))
        if index == REJECT:
            bits = payload[12]
            return index, Reject(_U64.unpack_from(payload, 4)[0], bool(bits & 1))
    except (IndexError, struct.error):
        raise FrameError(SYNTAX_ERROR, "malformed method frame", index >> 16, index & 0xFFFF) from None
    factory = commands.INDEX_MAPPING.get(index)
    if factory is None:
        raise FrameError(540, f"unknown method {index >> 16}.{index & 0xFFFF}", index >> 16, index & 0xFFFF)
    method = factory()
    try:
        method.unmarshal(payload[4:])
    except Exception as exc:  # pamqp raises struct.error, ValueError, TypeError, KeyError...
        raise FrameError(SYNTAX_ERROR, f"malformed {method.name}: {exc}", index >> 16, index & 0xFFFF) from None
    return index, method


@dataclass(slots=True)
class ContentHeader:
    class_id: int
    body_size: int
    properties: dict[str, Any] | None


def decode_content_header(payload: bytes) -> ContentHeader:
    """A content header frame's payload. Raises FrameError (502)."""
    try:
        class_id, _weight, body_size, flags = _CONTENT_HEAD.unpack_from(payload, 0)
        if flags == 0x1000 and len(payload) == 15:  # delivery-mode alone: the common case
            return ContentHeader(class_id, body_size, {"delivery_mode": payload[14]})
        properties = decode_properties(flags, payload, 14) if flags else None
    except (IndexError, struct.error, TableError, UnicodeDecodeError) as exc:
        raise FrameError(SYNTAX_ERROR, f"malformed content header: {exc}") from None
    return ContentHeader(class_id, body_size, properties)


_STR_FLAGS = (
    (1 << 15, "content_type"),
    (1 << 14, "content_encoding"),
)
_STR_FLAGS_2 = (
    (1 << 10, "correlation_id"),
    (1 << 9, "reply_to"),
    (1 << 8, "expiration"),
    (1 << 7, "message_id"),
)
_STR_FLAGS_3 = (
    (1 << 5, "type"),
    (1 << 4, "user_id"),
    (1 << 3, "app_id"),
    (1 << 2, "cluster_id"),
)


def decode_properties(flags: int, payload: bytes, pos: int) -> dict[str, Any]:
    """Basic properties as ackbus keeps them (``expiration`` still the AMQP text; the
    caller converts it). Raises IndexError, struct.error, TableError."""
    if flags & 1:
        raise TableError("property flags continue past one word (only 14 basic properties exist)")
    props: dict[str, Any] = {}
    for bit, name in _STR_FLAGS:
        if flags & bit:
            props[name], pos = _shortstr(payload, pos)
    if flags & (1 << 13):
        props["headers"], pos = decode_table(payload, pos)
    if flags & (1 << 12):
        props["delivery_mode"] = payload[pos]
        pos += 1
    if flags & (1 << 11):
        props["priority"] = payload[pos]
        pos += 1
    for bit, name in _STR_FLAGS_2:
        if flags & bit:
            props[name], pos = _shortstr(payload, pos)
    if flags & (1 << 6):
        props["timestamp"] = _U64.unpack_from(payload, pos)[0]
        pos += 8
    for bit, name in _STR_FLAGS_3:
        if flags & bit:
            props[name], pos = _shortstr(payload, pos)
    if pos != len(payload):
        raise TableError("content header longer than its properties")
    return props


def _pack_shortstr(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) > 255:  # (stored before such properties were refused): cut on a character
        raw = raw[:255].decode("utf-8", "ignore").encode("utf-8")
    return bytes((len(raw),)) + raw


def encode_properties(props: dict[str, Any] | None) -> bytes:
    """The property flags and list of a content header (from ackbus's properties)."""
    if not props:
        return b"\x00\x00"
    flags = 0
    parts: list[bytes] = []
    get = props.get
    for bit, name in _STR_FLAGS:
        value = get(name)
        if value is not None:
            flags |= bit
            parts.append(_pack_shortstr(value))
    headers = get("headers")
    if headers is not None:
        flags |= 1 << 13
        parts.append(encode_table(headers))
    value = get("delivery_mode")
    if value is not None:
        flags |= 1 << 12
        parts.append(bytes((value,)))
    value = get("priority")
    if value is not None:
        flags |= 1 << 11
        parts.append(bytes((value,)))
    for bit, name in _STR_FLAGS_2:
        value = get(name)
        if value is not None:
            flags |= bit
            parts.append(_pack_shortstr(str(value)))  # expiration is kept as an int
    value = get("timestamp")
    if value is not None:
        flags |= 1 << 6
        parts.append(_U64.pack(value))
    for bit, name in _STR_FLAGS_3:
        value = get(name)
        if value is not None:
            flags |= bit
            parts.append(_pack_shortstr(value))
    return _U16.pack(flags) + b"".join(parts)


# -- methods out ---------------------------------------------------------------------


def encode_sent_properties(props: dict[str, Any] | None, frame_max: int = 0) -> bytes:
    """:func:`encode_properties` for a message going out (deliver, get-ok, return) on a
    connection of ``frame_max`` (0: unbounded): header fields with no AMQP form (in a
    message stored before publishes were refused them) are left out, the other
    fields kept; headers that would make the content header frame larger than
    ``frame_max`` (a header frame cannot be split) are left out whole. Each with a
    warning, rather than the message held back or the connection failed."""
    try:
        encoded = encode_properties(props)
    except TableError as exc:
        log.warning("message header fields have no AMQP form; sent without them",
                    extra={"fields": {"error": str(exc)}})
        assert props is not None  # (only headers raise)
        headers = props.get("headers")
        kept = {k: v for k, v in props.items() if k != "headers"}
        if isinstance(headers, dict):
            kept["headers"] = sendable_table(headers)
        try:
            encoded = encode_properties(kept)
        except TableError:  # pragma: no cover - sendable_table keeps only what encodes
            del kept["headers"]
            encoded = encode_properties(kept)
    if frame_max and len(encoded) + _CONTENT_HEADER_FIXED + FRAME_OVERHEAD > frame_max and props:
        log.warning("message headers larger than the connection's frame_max; sent without them",
                    extra={"fields": {"frame_max": frame_max, "size": len(encoded)}})
        encoded = encode_properties({k: v for k, v in props.items() if k != "headers"})
    return encoded


#: A content header's class, weight and body size, before its properties.
_CONTENT_HEADER_FIXED = 12


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(kind, channel, len(payload)) + payload + b"\xce"


def encode_method(channel: int, method: PamqpMethod) -> bytes:
    """Any method, through pamqp (the handshake, declares, closes)."""
    return pamqp_frame.marshal(method, channel)


def encode_heartbeat() -> bytes:
    return b"\x08\x00\x00\x00\x00\x00\x00\xce"


_DELIVER_HEAD = struct.Struct(">BHIHH")
_CONFIRM = struct.Struct(">BHIHHQB")


def _content(channel: int, props: bytes, body: bytes, frame_max: int) -> list[bytes]:
    parts = [_frame(FRAME_HEADER, channel, _CONTENT_HEAD.pack(60, 0, len(body), 0)[:12] + props)]
    if body:
        chunk = frame_max - FRAME_OVERHEAD
        if len(body) <= chunk:
            parts.append(_frame(FRAME_BODY, channel, body))
        else:
            view = memoryview(body)
            for start in range(0, len(body), chunk):
                parts.append(_frame(FRAME_BODY, channel, bytes(view[start : start + chunk])))
    return parts


#: Per (channel, consumer tag, exchange, routing key): a struct packing a delivery's
#: method frame and content header's fixed part at once, with its constant bytes.
_deliver_templates: dict[tuple[int, str, str, str], tuple[struct.Struct, bytes, bytes]] = {}
_BODY_FRAME_HEAD = struct.Struct(">BBHI")  # the header frame's end, then a body frame's head


def _deliver_template(channel: int, consumer_tag: str, exchange: str, routing_key: str) -> tuple[struct.Struct, bytes, bytes]:
    tag, ex, rk = _pack_shortstr(consumer_tag), _pack_shortstr(exchange), _pack_shortstr(routing_key)
    head = _DELIVER_HEAD.pack(FRAME_METHOD, channel, len(tag) + len(ex) + len(rk) + 13, 60, 60) + tag
    tail = ex + rk + b"\xce" + bytes((FRAME_HEADER,)) + _U16.pack(channel)
    template = (struct.Struct(f">{len(head)}sQB{len(tail)}sIHHQ"), head, tail)
    if len(_deliver_templates) >= 4096:
        _deliver_templates.clear()
    _deliver_templates[(channel, consumer_tag, exchange, routing_key)] = template
    return template


def encode_deliver(
    channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str,
    props: bytes, body: bytes, frame_max: int,
) -> bytes:
    """``basic.deliver`` with its content header and body frames (``props`` from
    :func:`encode_properties`): it runs once per delivery, so the method frame and
    the header's fixed part are one ``struct`` pack of a template kept per consumer
    and routing key, and the body frame's head a second."""
    template = _deliver_templates.get((channel, consumer_tag, exchange, routing_key))
    if template is None:
        template = _deliver_template(channel, consumer_tag, exchange, routing_key)
    packer, head, tail = template
    size = len(body)
    fixed = packer.pack(head, delivery_tag, 1 if redelivered else 0, tail, 12 + len(props), 60, 0, size)
    chunk = frame_max - FRAME_OVERHEAD
    if size and size <= chunk:
        return b"".join((fixed, props, _BODY_FRAME_HEAD.pack(FRAME_END, FRAME_BODY, channel, size), body, b"\xce"))
    parts: list[bytes | memoryview] = [fixed, props, b"\xce"]
    view = memoryview(body)
    for start in range(0, size, chunk):
        piece = view[start : start + chunk]
        parts += (_FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, b"\xce")
    return b"".join(parts)


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    message_count: int,
    props: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """``basic.get-ok`` with its content."""
    args = b"".join(
        (
            _U64.pack(delivery_tag),
            b"\x01" if redelivered else b"\x00",
            _pack_shortstr(exchange),
            _pack_shortstr(routing_key),
            _U32.pack(message_count),
        )
    )
    method = _DELIVER_HEAD.pack(FRAME_METHOD, channel, len(args) + 4, 60, 71) + args + b"\xce"
    return method + b"".join(_content(channel, props, body, frame_max))


def encode_return(
    channel: int, reply_code: int, reply_text: str, exchange: str, routing_key: str, props: bytes, body: bytes,
    frame_max: int,
) -> bytes:
    """``basic.return`` with its content."""
    text = reply_text.encode()[:255]
    args = b"".join(
        (_U16.pack(reply_code), bytes((len(text),)), text, _pack_shortstr(exchange), _pack_shortstr(routing_key))
    )
    method = _DELIVER_HEAD.pack(FRAME_METHOD, channel, len(args) + 4, 60, 50) + args + b"\xce"
    return method + b"".join(_content(channel, props, body, frame_max))


def _method_frame(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    return _DELIVER_HEAD.pack(FRAME_METHOD, channel, len(args) + 4, class_id, method_id) + args + b"\xce"


def encode_declare_ok(channel: int, queue: str, message_count: int, consumer_count: int) -> bytes:
    """``queue.declare-ok`` (by hand: pamqp refuses names RabbitMQ and ackbus accept)."""
    return _method_frame(channel, 50, 11, _pack_shortstr(queue) + _U32.pack(message_count) + _U32.pack(consumer_count))


def encode_consume_ok(channel: int, consumer_tag: str) -> bytes:
    return _method_frame(channel, 60, 21, _pack_shortstr(consumer_tag))


def encode_cancel_ok(channel: int, consumer_tag: str) -> bytes:
    return _method_frame(channel, 60, 31, _pack_shortstr(consumer_tag))


def encode_cancel(channel: int, consumer_tag: str) -> bytes:
    """The server's ``basic.cancel`` (consumer cancel notification), no-wait."""
    return _method_frame(channel, 60, 30, _pack_shortstr(consumer_tag) + b"\x01")


def encode_confirm(channel: int, delivery_tag: int, multiple: bool, ack: bool) -> bytes:
    """A publisher confirm: ``basic.ack`` or ``basic.nack`` (requeue off)."""
    return _CONFIRM.pack(FRAME_METHOD, channel, 13, 60, 80 if ack else 120, delivery_tag, 1 if multiple else 0) + b"\xce"

"""The channel's NDJSON codec: bytes in, typed events out; ops in, bytes out.

Pure: no trio, no sockets, no reference to a channel. It knows the wire format of
docs/protocol.md and nothing else:

- :class:`LineSplitter` cuts a byte stream into lines (``\\n``-terminated; a ``\\r``
  before the ``\\n`` is tolerated) and refuses a line longer than its limit before
  buffering it, so a broken peer cannot make the client buffer without bound.
- :func:`decode_event` turns one line into one of the event dataclasses below, checking
  the types of the fields the client relies on. Unknown events decode to
  :class:`UnknownEvent` (forward compatibility: a newer broker may add events).
- :func:`encode_op` and :func:`encode_publish` produce one line per operation.
- Bodies travel as ``"body"`` (UTF-8 text) or ``"body_b64"`` (anything else).

Why a module of ~490 lines: it is the whole wire format, one dataclass and one
decoder per event, kept together so the protocol can be read in one place.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

import orjson

from .errors import ProtocolError
from .properties import Properties, check_properties

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "LineSplitter",
    "Properties",
    "ReturnedMessage",
    "encode_body",
    "decode_body",
    "encode_op",
    "encode_publish",
    "decode_event",
    "decode_json",
    "Event",
    "Open",
    "Ack",
    "Nack",
    "Return",
    "Deliver",
    "DeliverBatch",
    "check_properties",
    "delivery_fields",
    "delivery_row",
    "ConsumeOk",
    "ConsumerActive",
    "CancelOk",
    "BrokerCancel",
    "Expired",
    "Ok",
    "Error",
    "CloseOk",
    "Closing",
    "UnknownEvent",
]

# A line holds one message, base64 inflates a body by 4/3: 16 MiB covers a 12 MiB body.
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


class LineSplitter:
    """Incremental NDJSON line splitter.

    ``feed(data)`` returns the complete lines found so far (without their
    terminator); a trailing partial line is kept for the next call. Empty lines are
    skipped (NDJSON allows blank keep-alive lines).
    """

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._buf = bytearray()

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete line held back."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return every line it completes.

        Raises:
            ProtocolError: a line is longer than ``max_line_bytes``.
        """
        lines: list[bytes] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if self._buf:
                self._buf += data[start:end]
                line = bytes(self._buf)
                self._buf.clear()
            else:
                line = data[start:end]
            if len(line) > self._max:
                raise ProtocolError(f"line of {len(line)} bytes exceeds {self._max}")
            if line.endswith(b"\r"):
                line = line[:-1]
            if line:
                lines.append(line)
            start = end + 1
        rest = len(data) - start
        if rest:
            if len(self._buf) + rest > self._max:
                raise ProtocolError(f"line exceeds {self._max} bytes")
            self._buf += data[start:]
        return lines

    def check_at_end(self) -> None:
        """Call when the stream ended cleanly.

        Raises:
            ProtocolError: the stream ended in the middle of a line.
        """
        if self._buf.strip():
            raise ProtocolError(f"stream ended inside a line ({len(self._buf)} bytes)")


@dataclass(frozen=True, slots=True)
class ReturnedMessage:
    """A message the broker returned (unroutable ``mandatory`` publish)."""

    exchange: str
    routing_key: str
    body: bytes
    properties: Properties


def encode_body(body: bytes) -> dict[str, str]:
    """``{"body": text}`` when ``body`` is valid UTF-8, else ``{"body_b64": ...}``."""
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_b64": base64.b64encode(body).decode("ascii")}


def decode_body(obj: Mapping[str, Any]) -> bytes:
    """The body bytes of a wire message object.

    Raises:
        ProtocolError: neither ``body`` nor ``body_b64`` is a string, or bad base64.
    """
    text = obj.get("body")
    if isinstance(text, str):
        return text.encode("utf-8")
    b64 = obj.get("body_b64")
    if isinstance(b64, str):
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ProtocolError(f"bad body_b64: {exc}") from exc
    raise ProtocolError("message has neither body nor body_b64")


def encode_op(op: Mapping[str, Any]) -> bytes:
    """One operation as one NDJSON line (with its ``\\n``)."""
    return orjson.dumps(op, option=orjson.OPT_APPEND_NEWLINE)


def encode_publish(
    *,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: Properties | dict[str, Any],
    mandatory: bool,
    op_id: int | str | None = None,
    delay_s: float | None = None,
) -> bytes:
    """The ``publish`` operation line (``properties`` as :class:`Properties` or as its
    JSON object)."""
    op: dict[str, Any] = {"op": "publish", "exchange": exchange, "routing_key": routing_key}
    op.update(encode_body(body))
    props = properties.to_json() if isinstance(properties, Properties) else properties
    if props:
        op["properties"] = props
    if mandatory:
        op["mandatory"] = True
    if delay_s:
        op["delay_s"] = delay_s
    if op_id is not None:
        op["id"] = op_id
    return encode_op(op)


def decode_json(data: bytes) -> Any:
    """Parse JSON.

    Raises:
        ProtocolError: not valid JSON.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"invalid JSON: {exc}") from exc


# --- events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Open:
    channel: str
    server: str
    #: What the broker agreed to of the features the client asked for.
    features: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Ack:
    delivery_tag: int
    multiple: bool


@dataclass(frozen=True, slots=True)
class Nack:
    delivery_tag: int
    multiple: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Return:
    delivery_tag: int
    reply_code: int
    reason: str
    message: ReturnedMessage


@dataclass(frozen=True, slots=True)
class Deliver:
    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    body: bytes
    properties: Properties
    delivery_count: int = 0


@dataclass(frozen=True, slots=True)
class DeliverBatch:
    """Many deliveries in one event (docs/protocol.md, "Batched deliveries"): its rows
    as received, each read by :func:`delivery_fields` when it is handed out."""

    rows: list[Any]


_ROW = "'deliveries' event: a row must be [consumer_tag, delivery_tag, redelivered, delivery_count, exchange, routing_key, properties, body]"


def delivery_fields(row: Any) -> tuple[str, int, bool, int, str, str, Properties, bytes]:
    """One row of a ``deliveries`` event, checked as a ``deliver`` event is.

    Raises:
        ProtocolError: not a row of eight values of the right types.
    """
    consumer_tag, tag, redelivered, count, exchange, routing_key, props, data = delivery_row(row)
    return consumer_tag, tag, redelivered, count, exchange, routing_key, Properties.from_json(props), data


def delivery_row(row: Any) -> tuple[str, int, bool, int, str, str, dict[str, Any] | None, bytes]:
    """:func:`delivery_fields` with the properties checked but left as received (for
    :meth:`Properties.from_json`, when they are read).

    Raises:
        ProtocolError: not a row of eight values of the right types.
    """
    try:
        consumer_tag, tag, redelivered, count, exchange, routing_key, props, body = row
    except (TypeError, ValueError):
        raise ProtocolError(_ROW) from None
    if (
        type(consumer_tag) is not str or type(tag) is not int or type(redelivered) is not bool
        or type(count) is not int or count < 0 or type(exchange) is not str or type(routing_key) is not str
    ):
        raise ProtocolError(_ROW)
    if type(body) is str:
        data = body.encode("utf-8")
    elif type(body) is dict and type(body.get("b64")) is str:
        data = decode_body({"body_b64": body["b64"]})
    else:
        raise ProtocolError(_ROW)
    return consumer_tag, tag, redelivered, count, exchange, routing_key, check_properties(props), data


@dataclass(frozen=True, slots=True)
class ConsumeOk:
    consumer_tag: str
    id: str | int | None
    #: False for a standby consumer of a single-active-consumer queue
    active: bool = True


@dataclass(frozen=True, slots=True)
class ConsumerActive:
    """A standby consumer became the active one of its single-active-consumer queue."""

    consumer_tag: str


@dataclass(frozen=True, slots=True)
class CancelOk:
    consumer_tag: str
    id: str | int | None


@dataclass(frozen=True, slots=True)
class BrokerCancel:
    """``ev: cancel`` — the broker cancelled a consumer."""

    consumer_tag: str
    reason: str


@dataclass(frozen=True, slots=True)
class Expired:
    consumer_tag: str
    delivery_tag: int


@dataclass(frozen=True, slots=True)
class Ok:
    id: str | int | None
    op: str
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Error:
    code: str
    message: str
    id: str | int | None


@dataclass(frozen=True, slots=True)
class CloseOk:
    pass


@dataclass(frozen=True, slots=True)
class Closing:
    reason: str


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    ev: str
    fields: dict[str, Any]


Event = Union[
    Open, Ack, Nack, Return, Deliver, DeliverBatch, ConsumeOk, ConsumerActive, CancelOk, BrokerCancel, Expired, Ok,
    Error, CloseOk, Closing, UnknownEvent,
]


def _int(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"{obj.get('ev')!r} event: {key!r} must be an integer")
    return value


def _count(obj: dict[str, Any]) -> int:
    """A deliver event's ``delivery_count`` (0 from a broker that sends none)."""
    value = obj.get("delivery_count", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError("'deliver' event: 'delivery_count' must be a count")
    return value


def _str(obj: dict[str, Any], key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise ProtocolError(f"{obj.get('ev')!r} event: {key!r} must be a string")
    return value


def _bool(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"{obj.get('ev')!r} event: {key!r} must be a boolean")
    return value


def _id(obj: dict[str, Any]) -> str | int | None:
    value = obj.get("id")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ProtocolError(f"{obj.get('ev')!r} event: 'id' must be a string or a number")


def _message(obj: dict[str, Any]) -> tuple[bytes, Properties]:
    return decode_body(obj), Properties.from_json(obj.get("properties"))


def decode_event(line: bytes) -> Event:
    """Decode one event line.

    Raises:
        ProtocolError: invalid JSON, not an object, no ``ev``, or a field the client
            relies on is missing or of the wrong type.
    """
    obj = decode_json(line)
    if not isinstance(obj, dict):
        raise ProtocolError("event is not a JSON object")
    ev = obj.get("ev")
    if not isinstance(ev, str):
        raise ProtocolError("event has no 'ev' field")
    if ev == "ack":
        return Ack(_int(obj, "delivery_tag"), _bool(obj, "multiple"))
    if ev == "deliveries":
        rows = obj.get("d")
        if not isinstance(rows, list):
            raise ProtocolError("'deliveries' event: 'd' must be a list")
        return DeliverBatch(rows)
    if ev == "deliver":
        message = obj.get("message")
        if not isinstance(message, dict):
            raise ProtocolError("'deliver' event: 'message' must be an object")
        body, props = _message(message)
        return Deliver(
            consumer_tag=_str(obj, "consumer_tag"),
            delivery_tag=_int(obj, "delivery_tag"),
            redelivered=_bool(obj, "redelivered"),
            exchange=_str(obj, "exchange", ""),
            routing_key=_str(obj, "routing_key", ""),
            body=body,
            properties=props,
            delivery_count=_count(obj),
        )
    if ev == "nack":
        return Nack(_int(obj, "delivery_tag"), _bool(obj, "multiple"), _str(obj, "reason", ""))
    if ev == "return":
        message = obj.get("message")
        if not isinstance(message, dict):
            raise ProtocolError("'return' event: 'message' must be an object")
        body, props = _message(message)
        exchange = _str(obj, "exchange", "")
        routing_key = _str(obj, "routing_key", "")
        return Return(
            delivery_tag=_int(obj, "delivery_tag"),
            reply_code=_int(obj, "reply_code") if "reply_code" in obj else 312,
            reason=_str(obj, "reason", "NO_ROUTE"),
            message=ReturnedMessage(exchange, routing_key, body, props),
        )
    if ev == "ok":
        fields = {k: v for k, v in obj.items() if k not in ("ev", "id", "op")}
        op = obj.get("op")
        return Ok(_id(obj), op if isinstance(op, str) else "", fields)
    if ev == "consume_ok":
        return ConsumeOk(_str(obj, "consumer_tag"), _id(obj), obj.get("active", True) is not False)
    if ev == "active":
        return ConsumerActive(_str(obj, "consumer_tag"))
    if ev == "cancel_ok":
        return CancelOk(_str(obj, "consumer_tag", ""), _id(obj))
    if ev == "error":
        return Error(_str(obj, "error", "error"), _str(obj, "message", ""), _id(obj))
    if ev == "open":
        channel = obj.get("channel", "")
        features = obj.get("features")
        agreed = frozenset(f for f in features if isinstance(f, str)) if isinstance(features, list) else frozenset()
        return Open(str(channel), str(obj.get("server", "")), agreed)
    if ev == "cancel":
        return BrokerCancel(_str(obj, "consumer_tag"), _str(obj, "reason", ""))
    if ev == "expired":
        return Expired(_str(obj, "consumer_tag", ""), _int(obj, "delivery_tag"))
    if ev == "close_ok":
        return CloseOk()
    if ev == "closing":
        return Closing(_str(obj, "reason", ""))
    return UnknownEvent(ev, obj)

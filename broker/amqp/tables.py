"""AMQP field tables and their JSON form, both ways, keeping every field's type.

ackbus keeps message headers as JSON (they cross to HTTP consumers as they are). An
AMQP field table has more types than JSON, so each AMQP value maps to JSON as
docs/amqp.md says: the types JSON has (boolean, the 32- and 64-bit signed integers,
double, UTF-8 long string, table, array, void) become plain JSON values; the others
become a tagged object ``{"$amqp": TYPE, "value": ...}`` that turns back into the same
AMQP type when the message is delivered over AMQP. So an AMQP publisher's headers
reach an AMQP consumer with their exact types, and an HTTP publisher's plain JSON
reaches it as the types a RabbitMQ client would have chosen.

``decode_table(..., typed=False)`` gives plain values only (queue and exchange
arguments: the core wants ``x-max-priority`` as a number, whatever width the client
encoded it in). Sans-IO: bytes in, values out.
"""

from __future__ import annotations

import base64
import decimal
import struct
from typing import Any

from broker.core import tagged_value_error

__all__ = ["TableError", "decode_table", "encode_table", "sendable_table", "TAG", "TYPE_NAMES"]

#: The key of a tagged value.
TAG = "$amqp"

_INT_TYPES: dict[int, tuple[str, struct.Struct]] = {
    ord("b"): ("int8", struct.Struct(">b")),
    ord("B"): ("uint8", struct.Struct(">B")),
    ord("s"): ("int16", struct.Struct(">h")),
    ord("u"): ("uint16", struct.Struct(">H")),
    ord("I"): ("int32", struct.Struct(">i")),
    ord("i"): ("uint32", struct.Struct(">I")),
    ord("l"): ("int64", struct.Struct(">q")),
}
_BY_NAME = {name: (code, st) for code, (name, st) in _INT_TYPES.items()}
#: Every tag name a tagged value may carry.
TYPE_NAMES = frozenset(_BY_NAME) | {"float", "decimal", "timestamp", "bytes", "longstr"}
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_MAX_DEPTH = 32


class TableError(ValueError):
    """A field table that cannot be decoded (AMQP 502 syntax error) or a JSON value
    that has no AMQP form."""


def decode_table(data: bytes | memoryview, offset: int = 0, *, typed: bool = True) -> tuple[dict[str, Any], int]:
    """Decode the field table at ``offset`` (its 4-byte length first); return (the
    table as JSON values, the offset after it). Raises TableError."""
    view = memoryview(data)
    if offset + 4 > len(view):
        raise TableError("field table length past the end of the frame")
    (length,) = _U32.unpack_from(view, offset)
    start = offset + 4
    end = start + length
    if end > len(view):
        raise TableError("field table longer than its frame")
    return _table(view, start, end, typed, 0), end


def _table(view: memoryview, pos: int, end: int, typed: bool, depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise TableError("field table nested too deeply")
    out: dict[str, Any] = {}
    while pos < end:
        klen = view[pos]
        pos += 1
        if pos + klen > end:
            raise TableError("field name past the end of its table")
        try:
            key = bytes(view[pos : pos + klen]).decode("utf-8")
        except UnicodeDecodeError:
            raise TableError("field name is not UTF-8") from None
        pos += klen
        value, pos = _value(view, pos, end, typed, depth)
        out[key] = value
    if pos != end:
        raise TableError("field value past the end of its table")
    return out


def _need(pos: int, n: int, end: int) -> None:
    if pos + n > end:
        raise TableError("field value past the end of its table")


def _value(view: memoryview, pos: int, end: int, typed: bool, depth: int) -> tuple[Any, int]:
    _need(pos, 1, end)
    kind = view[pos]
    pos += 1
    ints = _INT_TYPES.get(kind)
    if ints is not None:
        name, st = ints
        _need(pos, st.size, end)
        (number,) = st.unpack_from(view, pos)
        pos += st.size
        if typed and name not in ("int32", "int64"):
            return {TAG: name, "value": number}, pos
        if typed and (name == "int32") != (-(1 << 31) <= number < (1 << 31)):
            return {TAG: name, "value": number}, pos  # an int64 that fits 32 bits
        return number, pos
    if kind == 0x74:  # t
        _need(pos, 1, end)
        return view[pos] != 0, pos + 1
    if kind == 0x53:  # S
        _need(pos, 4, end)
        (length,) = _U32.unpack_from(view, pos)
        pos += 4
        _need(pos, length, end)
        raw = bytes(view[pos : pos + length])
        pos += length
        try:
            return raw.decode("utf-8"), pos
        except UnicodeDecodeError:
            return ({TAG: "longstr", "value": base64.b64encode(raw).decode()} if typed else raw.hex()), pos
    if kind == 0x78:  # x
        _need(pos, 4, end)
        (length,) = _U32.unpack_from(view, pos)
        pos += 4
        _need(pos, length, end)
        raw = bytes(view[pos : pos + length])
        pos += length
        return ({TAG: "bytes", "value": base64.b64encode(raw).decode()} if typed else raw.hex()), pos
    if kind == 0x64:  # d
        _need(pos, 8, end)
        return _F64.unpack_from(view, pos)[0], pos + 8
    if kind == 0x66:  # f
        _need(pos, 4, end)
        number = _F32.unpack_from(view, pos)[0]
        return ({TAG: "float", "value": number} if typed else number), pos + 4
    if kind == 0x44:  # D
        _need(pos, 5, end)
        scale = view[pos]
        (unscaled,) = _I32.unpack_from(view, pos + 1)
        text = str(decimal.Decimal(unscaled).scaleb(-scale))
        return ({TAG: "decimal", "value": text} if typed else text), pos + 5
    if kind == 0x54:  # T
        _need(pos, 8, end)
        (stamp,) = _U64.unpack_from(view, pos)
        return ({TAG: "timestamp", "value": stamp} if typed else stamp), pos + 8
    if kind == 0x46:  # F
        _need(pos, 4, end)
        (length,) = _U32.unpack_from(view, pos)
        start = pos + 4
        _need(start, length, end)
        return _table(view, start, start + length, typed, depth + 1), start + length
    if kind == 0x41:  # A
        _need(pos, 4, end)
        (length,) = _U32.unpack_from(view, pos)
        pos += 4
        stop = pos + length
        _need(pos, length, end)
        items = []
        while pos < stop:
            item, pos = _value(view, pos, stop, typed, depth + 1)
            items.append(item)
        return items, pos
    if kind == 0x56:  # V
        return None, pos
    raise TableError(f"unknown field type {chr(kind)!r}")


def encode_table(table: dict[str, Any] | None) -> bytes:
    """A field table (with its 4-byte length) from JSON values and tagged values.
    Raises TableError for a value with no AMQP form."""
    if not table:
        return b"\x00\x00\x00\x00"
    if "x-death" in table:  # (a dead letter's headers)
        table = rabbit_death_types(table)
    parts: list[bytes] = []
    _encode_table_items(table, parts, 0)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def _encode_table_items(table: dict[str, Any], parts: list[bytes], depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise TableError("field table nested too deeply")
    for key, value in table.items():
        raw = str(key).encode("utf-8")
        if len(raw) > 255:
            raise TableError("field name longer than 255 bytes")
        parts.append(bytes((len(raw),)) + raw)
        _encode_value(value, parts, depth)


def _encode_value(value: Any, parts: list[bytes], depth: int) -> None:
    if value is None:
        parts.append(b"V")
    elif value is True or value is False:
        parts.append(b"t\x01" if value else b"t\x00")
    elif isinstance(value, int):
        if -(1 << 31) <= value < (1 << 31):
            parts.append(b"I" + _I32.pack(value))
        elif -(1 << 63) <= value < (1 << 63):
            parts.append(b"l" + struct.pack(">q", value))
        else:
            raise TableError("integer outside 64 bits")
    elif isinstance(value, float):
        parts.append(b"d" + _F64.pack(value))
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        parts.append(b"S" + _U32.pack(len(raw)) + raw)
    elif isinstance(value, (bytes, bytearray)):
        parts.append(b"x" + _U32.pack(len(value)) + bytes(value))
    elif isinstance(value, list):
        inner: list[bytes] = []
        for item in value:
            _encode_value(item, inner, depth + 1)
        body = b"".join(inner)
        parts.append(b"A" + _U32.pack(len(body)) + body)
    elif isinstance(value, dict):
        if _is_tagged(value):
            parts.append(_encode_tagged(value[TAG], value["value"]))
            return
        inner = []
        _encode_table_items(value, inner, depth + 1)
        body = b"".join(inner)
        parts.append(b"F" + _U32.pack(len(body)) + body)
    else:
        raise TableError(f"no AMQP form for a {type(value).__name__}")


def _is_tagged(value: dict[str, Any]) -> bool:
    return len(value) == 2 and value.get(TAG) in TYPE_NAMES and "value" in value


def _encode_tagged(name: str, value: Any) -> bytes:
    """A tagged value's AMQP bytes; one whose value does not fit its type is refused
    (the core's rule, ``tagged_value_error``, which publishes are checked by)."""
    why = tagged_value_error(name, value)
    if why is not None:
        raise TableError(f"{name} value must be {why}")
    try:
        ints = _BY_NAME.get(name)
        if ints is not None:
            code, st = ints
            if type(value) is not int:
                raise TableError(f"{name} value must be an integer")
            return bytes((code,)) + st.pack(value)
        if name == "float":
            return b"f" + _F32.pack(float(value))
        if name == "timestamp":
            if type(value) is not int:
                raise TableError("timestamp value must be an integer")
            return b"T" + _U64.pack(value)
        if name == "bytes":
            return encode_bytes(base64.b64decode(str(value), validate=True))
        if name == "longstr":  # a long string that is not UTF-8
            raw = base64.b64decode(str(value), validate=True)
            return b"S" + _U32.pack(len(raw)) + raw
        # decimal
        number = decimal.Decimal(str(value))
        sign, digits, exponent = number.as_tuple()
        if not isinstance(exponent, int):
            raise TableError("decimal value must be finite")
        scale = max(0, -exponent)
        unscaled = int(number.scaleb(scale))
        return b"D" + bytes((scale,)) + _I32.pack(unscaled)
    except (struct.error, ValueError, ArithmeticError, TypeError) as exc:  # (decimal's errors among them)
        if isinstance(exc, TableError):
            raise
        raise TableError(f"{name} value out of range: {exc}") from None


_LEFT_OUT = object()


def sendable_table(table: dict[str, Any]) -> dict[str, Any]:
    """``table`` without the fields AMQP cannot carry (a name over 255 bytes, a value
    with no AMQP form), at any depth, the others kept: for a message stored before
    publishes were refused such headers (docs/amqp.md)."""
    kept = _sendable(table, 0)
    return kept if isinstance(kept, dict) else {}


def _sendable(value: Any, depth: int) -> Any:
    """``value`` with what has no AMQP form left out, or ``_LEFT_OUT``."""
    if depth > _MAX_DEPTH:
        return _LEFT_OUT
    if isinstance(value, dict) and not _is_tagged(value):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if len(str(key).encode("utf-8", "surrogatepass")) > 255:
                continue
            item = _sendable(item, depth + 1)
            if item is not _LEFT_OUT:
                out[key] = item
        return out
    if isinstance(value, list):
        return [kept for kept in (_sendable(item, depth + 1) for item in value) if kept is not _LEFT_OUT]
    try:
        _encode_value(value, [], depth)
    except (TableError, UnicodeError):
        return _LEFT_OUT
    return value


def encode_bytes(raw: bytes) -> bytes:
    return b"x" + _U32.pack(len(raw)) + raw


def rabbit_death_types(headers: dict[str, Any]) -> dict[str, Any]:
    """``x-death`` with RabbitMQ's field types: each entry's ``count`` a long (``l``) and
    its ``time`` a timestamp (``T``), which clients cast to (Java's ``Long`` and
    ``Date``); ackbus keeps them as plain numbers (a JSON number would go out as ``I``)."""
    deaths = headers["x-death"]
    if not isinstance(deaths, list):
        return headers
    typed: list[Any] = []
    for death in deaths:
        if isinstance(death, dict) and TAG not in death:
            death = dict(death)
            count, when = death.get("count"), death.get("time")
            if type(count) is int and -(1 << 63) <= count < (1 << 63):
                death["count"] = {TAG: "int64", "value": count}
            if type(when) is int and 0 <= when < (1 << 63):
                death["time"] = {TAG: "timestamp", "value": when}
        typed.append(death)
    return {**headers, "x-death": typed}

"""What an AMQP field table can carry, checked in message headers given as JSON.

ackbus keeps headers as JSON; an AMQP consumer gets them as a field table
(``broker/amqp/tables.py``, docs/amqp.md), whose field names are short strings (at
most 255 bytes of UTF-8) and whose tagged values (``{"$amqp": TYPE, "value": V}``)
must fit their type. AMQP publishers can only produce tables that fit; a REST,
channel or management publish could say more, which no AMQP consumer could then be
given. So every publish's headers are checked by these rules, in the one walk of
``message.check_json_value`` (``field_table=True``, from ``check_properties``), and
refused with a clear error at the publish.
"""

from __future__ import annotations

import base64
import decimal
import struct
from typing import Any

from .errors import InvalidArgument

__all__ = [
    "MAX_FIELD_NAME_BYTES", "TAG", "TAGGED_TYPES", "check_field_name", "check_tagged", "is_tagged", "tagged_value_error",
]

#: The key of a tagged value.
TAG = "$amqp"
#: An AMQP short string's length limit (field names, and the string properties).
MAX_FIELD_NAME_BYTES = 255

_INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "uint8": (0, (1 << 8) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "uint16": (0, (1 << 16) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint32": (0, (1 << 32) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}
#: Every type a tagged value may name (``broker/amqp/tables.py`` encodes each).
TAGGED_TYPES = frozenset(_INT_RANGES) | {"float", "decimal", "timestamp", "bytes", "longstr"}
_F32 = struct.Struct(">f")
#: An AMQP decimal: a scale octet and a signed 32-bit unscaled value.
_DECIMAL_DIGITS = 10


def is_tagged(value: dict[str, Any]) -> bool:
    """Whether a JSON object is a tagged value (else an ordinary nested table)."""
    return len(value) == 2 and value.get(TAG) in TAGGED_TYPES and "value" in value


def tagged_value_error(name: str, value: object) -> str | None:
    """Why ``value`` does not fit the AMQP type ``name`` (None: it fits)."""
    ints = _INT_RANGES.get(name)
    if ints is not None:
        if type(value) is not int or not ints[0] <= value <= ints[1]:
            return f"an integer {ints[0]}..{ints[1]}"
        return None
    if name == "timestamp":  # (AMQP's are unsigned 64 bits; the log keeps signed ones)
        if type(value) is not int or not 0 <= value < (1 << 63):
            return "an integer 0..2^63-1"
        return None
    if name == "float":
        if type(value) not in (int, float):
            return "a number"
        try:
            _F32.pack(value)
        except (OverflowError, struct.error):
            return "a number within 32-bit float range"
        return None
    if name in ("bytes", "longstr"):
        if not isinstance(value, str):
            return "base64 text"
        try:
            base64.b64decode(value, validate=True)
        except ValueError:  # (binascii.Error among them)
            return "base64 text"
        return None
    return _decimal_error(value)


def _decimal_error(value: object) -> str | None:
    """A decimal: a number or its text, finite, at most 255 places after the point,
    its digits a signed 32-bit integer."""
    why = "a decimal number of at most 10 digits and 255 places"
    if type(value) not in (str, int, float):
        return why
    try:
        number = decimal.Decimal(str(value))
    except (decimal.InvalidOperation, ValueError):
        return why
    _sign, digits, exponent = number.as_tuple()
    if not isinstance(exponent, int):  # infinity, NaN
        return why
    if exponent >= 0:
        if len(digits) + exponent > _DECIMAL_DIGITS:
            return why
        unscaled = int(number)
    else:
        if -exponent > 255 or len(digits) > _DECIMAL_DIGITS:
            return why
        unscaled = int(number.scaleb(-exponent))
    if not -(1 << 31) <= unscaled < (1 << 31):
        return why
    return None


def check_field_name(key: str, what: str) -> None:
    """Refuse a field name over 255 bytes of UTF-8 (AMQP's short string). Raises
    InvalidArgument naming ``what`` and the field."""
    # (63 characters are at most 252 bytes: only longer names need encoding)
    if len(key) > MAX_FIELD_NAME_BYTES // 4 and len(key.encode("utf-8", "surrogatepass")) > MAX_FIELD_NAME_BYTES:
        raise InvalidArgument(
            f"{what}: field name {key[:40]!r}... is longer than {MAX_FIELD_NAME_BYTES} bytes (AMQP's limit)"
        )


def check_tagged(node: dict[str, Any], what: str) -> bool:
    """Whether ``node`` is a tagged value (else a nested table); refuses one whose
    value does not fit its type. Raises InvalidArgument naming ``what``."""
    if not is_tagged(node):
        return False
    name = node[TAG]
    why = tagged_value_error(name, node["value"])
    if why is not None:
        raise InvalidArgument(f"{what}: a {name} value must be {why}")
    return True

"""Message headers an AMQP consumer can be given (broker/core/fieldtables.py, through
``check_properties``): field names of at most 255 bytes of UTF-8 at any depth,
tagged values that fit their type; refused at the publish with the field and the
limit named. What AMQP publishers produce always passes, and what passes, the AMQP
encoder encodes."""

from __future__ import annotations

from typing import Any

import pytest

from broker.amqp.tables import TYPE_NAMES, TableError, decode_table, encode_table
from broker.core import TAGGED_TYPES, InvalidArgument, check_properties


def _tagged(name: str, value: Any) -> dict[str, Any]:
    return {"$amqp": name, "value": value}


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"k" * 256: 1}, "longer than 255 bytes"),
    ({"é" * 128: 1}, "longer than 255 bytes"),  # 128 characters, 256 bytes
    ({"n": {"k" * 256: 1}}, "longer than 255 bytes"),
    ({"l": [1, {"k" * 256: 1}]}, "longer than 255 bytes"),
    ({"i": _tagged("int8", 128)}, "int8 value must be an integer -128..127"),
    ({"i": _tagged("uint8", -1)}, "uint8"),
    ({"i": _tagged("int16", 1 << 15)}, "int16"),
    ({"i": _tagged("uint16", 1 << 16)}, "uint16"),
    ({"i": _tagged("int32", 1 << 31)}, "int32"),
    ({"i": _tagged("uint32", 1 << 32)}, "uint32"),
    ({"i": _tagged("int64", True)}, "int64"),
    ({"i": _tagged("int8", 1.0)}, "int8"),
    ({"t": _tagged("timestamp", -1)}, "timestamp"),
    ({"f": _tagged("float", 1e300)}, "32-bit float"),
    ({"f": _tagged("float", "1.5")}, "float value must be a number"),
    ({"b": _tagged("bytes", "!!")}, "base64"),
    ({"b": _tagged("longstr", 5)}, "base64"),
    ({"d": _tagged("decimal", "NaN")}, "decimal"),
    ({"d": _tagged("decimal", "Infinity")}, "decimal"),
    ({"d": _tagged("decimal", "1e10000000")}, "decimal"),  # (refused without computing it)
    ({"d": _tagged("decimal", "1e-300")}, "decimal"),
    ({"d": _tagged("decimal", "12345678901")}, "decimal"),
    ({"d": _tagged("decimal", "2147483648")}, "decimal"),
    ({"d": _tagged("decimal", "x")}, "decimal"),
    ({"l": [_tagged("int8", 1000)]}, "int8"),
]

ACCEPTED: list[dict[str, Any]] = [
    {"k" * 255: 1},
    {"é" * 127 + "a": 1},  # 255 bytes
    {"i": _tagged("int8", -128), "u": _tagged("uint32", (1 << 32) - 1), "l": _tagged("int64", -(1 << 63))},
    {"t": _tagged("timestamp", (1 << 63) - 1)},
    {"f": _tagged("float", 1.5), "g": _tagged("float", 3)},
    {"b": _tagged("bytes", "aGk="), "s": _tagged("longstr", "")},
    {"d": _tagged("decimal", "1.23"), "e": _tagged("decimal", "-2147483648"), "z": _tagged("decimal", "0E-255")},
    {"d": _tagged("decimal", 1.5), "e": _tagged("decimal", 7)},
    # not tagged: an ordinary table that happens to hold "$amqp"
    {"x": {"$amqp": "nonsense", "value": 1}, "y": {"$amqp": "int8", "value": 1, "more": 2}},
]


@pytest.mark.parametrize(("headers", "why"), REFUSED, ids=range(len(REFUSED)))
def test_refused_at_the_publish(headers: dict[str, Any], why: str) -> None:
    with pytest.raises(InvalidArgument, match="property headers") as info:
        check_properties({"headers": headers})
    assert why in str(info.value)
    with pytest.raises(TableError):  # (the AMQP encoder could not have sent it)
        encode_table(headers)


@pytest.mark.parametrize("headers", ACCEPTED, ids=range(len(ACCEPTED)))
def test_accepted_and_encoded(headers: dict[str, Any]) -> None:
    assert check_properties({"headers": headers}) == {"headers": headers}
    encode_table(headers)


def test_the_tagged_types_are_the_encoders() -> None:
    assert TAGGED_TYPES == TYPE_NAMES


def test_every_table_an_amqp_publisher_can_send_passes() -> None:
    """Extremes of each AMQP type, decoded as a publish's headers are, pass the check."""
    values = {
        "b": _tagged("int8", -128), "B": _tagged("uint8", 255), "s": _tagged("int16", -32768),
        "u": _tagged("uint16", 65535), "I": 2**31 - 1, "i": _tagged("uint32", 2**32 - 1),
        "l": -(2**63), "f": _tagged("float", 3.4028234663852886e38), "T": _tagged("timestamp", 2**63 - 1),
        "x": _tagged("bytes", "AAEC"), "D": _tagged("decimal", "-2.147483648E-246"),
        "S": _tagged("longstr", "/w=="), "k" * 255: {"n": [1, "a", None, True, 2.5]},
    }
    headers, _end = decode_table(encode_table(values))
    assert check_properties({"headers": headers}) == {"headers": headers}

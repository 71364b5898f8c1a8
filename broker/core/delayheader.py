"""The ``x-delay`` header of a publish to an ``x-delayed-message`` exchange.

RabbitMQ's delayed-message plugin holds a message published to such an exchange for
``x-delay`` milliseconds. ackbus maps that onto its own delayed publish (``delay_s``:
publishing.py), so the delay is read here, by the plugin's rules:

* an integer of any AMQP width is taken as it is; a string of decimal digits (an
  optional sign first) as the integer it spells; a floating-point or decimal number
  truncated toward zero;
* anything else (a boolean, a timestamp, bytes, a table, a string that is not an
  integer, no header at all), and a value not in 1..2^32-1 ms (zero, negative, longer
  than the plugin's and ackbus's longest delay, 49.7 days) means no delay: the
  message is routed at once, its headers untouched. (The plugin fails the publish on
  a string that is not an integer; ackbus, which refuses no message for a header's
  value, routes it at once.)

A delayed message gets the delay back negated in its ``x-delay`` header, as the plugin
gives it when it routes the message: its consumers can tell it was delayed, and it
cannot be delayed twice on its way.
"""

from __future__ import annotations

from typing import Any

from .message import MAX_EXPIRATION_MS

__all__ = ["header_delay"]

#: Tagged header values (docs/amqp.md) the plugin takes as integers and as numbers it
#: truncates.
_INTEGER_TAGS = frozenset({"int8", "uint8", "int16", "uint16", "uint32", "int64"})
_FRACTION_TAGS = frozenset({"float", "decimal"})


def header_delay(properties: dict[str, Any] | None) -> tuple[float | None, dict[str, Any] | None]:
    """The delay in seconds a publish's ``x-delay`` header asks for (None: none) and
    the properties to store: when delayed, a copy with ``x-delay`` negated (the
    caller's stay as they are); else ``properties`` themselves."""
    headers = properties.get("headers") if properties else None
    if properties is None or not headers or "x-delay" not in headers:
        return None, properties
    delay_ms = _delay_ms(headers["x-delay"])
    if delay_ms is None or not 0 < delay_ms <= MAX_EXPIRATION_MS:
        return None, properties
    return delay_ms / 1000.0, dict(properties, headers=dict(headers, **{"x-delay": -delay_ms}))


def _delay_ms(value: Any) -> int | None:
    """The integer an ``x-delay`` value stands for (see the module docstring)."""
    if isinstance(value, dict) and len(value) == 2 and "value" in value:
        tag = value.get("$amqp")
        if tag in _INTEGER_TAGS:
            value = value["value"]
        elif tag in _FRACTION_TAGS:
            return _truncated(value["value"])
        else:
            return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _truncated(value)
    if isinstance(value, str):
        digits = value[1:] if value[:1] in ("+", "-") else value
        if digits.isascii() and digits.isdigit():
            # (a longer one is out of range anyway, and int() refuses thousands of digits)
            return int(value) if len(digits) <= 20 else None
    return None


def _truncated(value: Any) -> int | None:
    """A float (or a decimal's string) truncated toward zero; None for anything else,
    and for what is not finite."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if not -1e300 < number < 1e300:  # (inf and NaN fail this)
        return None
    return int(number)

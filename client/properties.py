"""Message properties (AMQP's basic properties) as the client holds them: typed,
checked as the broker checks them, and to and from their JSON object on the wire.

Apart from the codec (``codec.py``) because they are a value users build and read, not
part of the framing; the codec decodes a delivery's properties with
:func:`check_properties` and builds them (:meth:`Properties.from_json`) only when
the consumer reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ProtocolError

__all__ = ["Properties", "check_properties"]


@dataclass(frozen=True, slots=True)
class Properties:
    """Message properties (AMQP basic properties). ``None`` means absent.

    ``delivery_mode`` is 1 (transient) or 2 (persistent; the broker's default);
    ``expiration`` is in milliseconds; ``timestamp`` in seconds since the epoch.
    """

    content_type: str | None = None
    content_encoding: str | None = None
    headers: Mapping[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: int | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    app_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object for the wire, absent properties omitted."""
        out: dict[str, Any] = {}
        for field in _PROPERTY_FIELDS:
            value = getattr(self, field)
            if value is not None:
                out[field] = dict(value) if field == "headers" else value
        return out

    @classmethod
    def from_json(cls, obj: object) -> Properties:
        """Build from a wire object; unknown keys are ignored.

        Raises:
            ProtocolError: ``obj`` is not an object or a known field has a wrong type.
        """
        checked = check_properties(obj)
        if not checked:
            return _EMPTY_PROPERTIES
        props = Properties.__new__(Properties)  # its slots set, not __init__: Python even when compiled (~3 µs)
        found = False
        for name, slot in _PROPERTY_SLOTS:
            value = checked.get(name)
            found = found or value is not None
            slot.__set__(props, value)
        return props if found else _EMPTY_PROPERTIES

    @classmethod
    def coerce(cls, value: Properties | Mapping[str, Any] | None) -> Properties:
        """Accept a :class:`Properties`, a mapping of its fields, or ``None``, and
        check it as the broker would (so a bad property fails here, not as a channel
        error later).

        Raises:
            TypeError: an unknown property name or a wrongly typed value.
            ValueError: a value out of range (see :meth:`validate`).
        """
        if value is None:
            return _EMPTY_PROPERTIES
        if not isinstance(value, Properties):
            unknown = set(value) - set(_PROPERTY_FIELDS)
            if unknown:
                raise TypeError(f"unknown message properties: {sorted(unknown)}")
            value = cls(**value)
        value.validate()
        return value

    def validate(self) -> None:
        """Check types and ranges: text properties at most 255 bytes of UTF-8,
        ``delivery_mode`` 1 or 2, ``priority`` 0..255, ``expiration`` and
        ``timestamp`` non-negative integers, ``headers`` a mapping.

        Raises:
            TypeError, ValueError: the first offending property.
        """
        for name, kind in _PROPERTY_TYPES.items():
            value = getattr(self, name)
            if value is None:
                continue
            if kind is dict:
                if not isinstance(value, Mapping):
                    raise TypeError(f"property {name} must be a mapping")
                continue
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TypeError(f"property {name} must be {kind.__name__}, got {value!r}")
            if isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > 255:
                raise ValueError(f"property {name} is longer than 255 bytes")
        if self.delivery_mode is not None and self.delivery_mode not in (1, 2):
            raise ValueError("delivery_mode must be 1 (transient) or 2 (persistent)")
        if self.priority is not None and not 0 <= self.priority <= 255:
            raise ValueError("priority must be 0..255")
        for name in ("expiration", "timestamp"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")

    def replace(self, **changes: Any) -> Properties:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


_PROPERTY_FIELDS = tuple(f.name for f in dataclasses.fields(Properties))
_PROPERTY_TYPES: dict[str, type] = {
    "content_type": str,
    "content_encoding": str,
    "headers": dict,
    "delivery_mode": int,
    "priority": int,
    "correlation_id": str,
    "reply_to": str,
    "expiration": int,
    "message_id": str,
    "timestamp": int,
    "type": str,
    "app_id": str,
}
_EMPTY_PROPERTIES = Properties()
_PROPERTY_SLOTS = tuple((name, vars(Properties)[name]) for name in _PROPERTY_FIELDS)  # see from_json


def check_properties(obj: object) -> dict[str, Any] | None:
    """``obj`` checked as :meth:`Properties.from_json` checks it, without building the
    :class:`Properties` (a delivery's are built when first read:
    :attr:`client.consumer.Message.properties`).

    Raises:
        ProtocolError: ``obj`` is not an object or a known field has a wrong type.
    """
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ProtocolError(f"properties must be an object, got {type(obj).__name__}")
    for field, value in obj.items():
        kind = _PROPERTY_TYPES.get(field)
        if kind is None or value is None:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ProtocolError(f"property {field!r} has the wrong type: {value!r}")
    return obj

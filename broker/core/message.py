"""Messages and their properties (AMQP 0-9-1 basic properties).

A :class:`Message` is immutable once published and shared by reference between every
queue it was routed to, so its body is stored once however many queues hold it. The
per-queue state of a message (has it been delivered before?) lives in :class:`Entry`.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgument

__all__ = ["Message", "Entry", "check_properties", "PROPERTY_NAMES"]

_STR_PROPS = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "message_id",
    "type",
    "app_id",
    "user_id",
    "cluster_id",
)
PROPERTY_NAMES = frozenset(
    _STR_PROPS + ("headers", "delivery_mode", "priority", "expiration", "timestamp")
)


def check_properties(props: object) -> dict[str, Any] | None:
    """Validate message properties from JSON; return them (None when empty).

    Raises InvalidArgument naming the offending property.
    """
    if props is None:
        return None
    if not isinstance(props, dict):
        raise InvalidArgument("properties must be an object")
    if not props:
        return None
    for key, value in props.items():
        if value is None:
            continue
        if key in _STR_PROPS:
            if not isinstance(value, str):
                raise InvalidArgument(f"property {key} must be a string")
            try:
                too_long = len(value) > 255 or len(value.encode()) > 255
            except UnicodeEncodeError:
                raise InvalidArgument(f"property {key} is not valid UTF-8 text") from None
            if too_long:
                raise InvalidArgument(f"property {key} is longer than 255 bytes")
        elif key == "headers":
            if not isinstance(value, dict):
                raise InvalidArgument("property headers must be an object")
        elif key == "delivery_mode":
            if value not in (1, 2) or isinstance(value, bool):
                raise InvalidArgument("property delivery_mode must be 1 (transient) or 2 (persistent)")
        elif key == "priority":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
                raise InvalidArgument("property priority must be an integer 0..255")
        elif key in ("expiration", "timestamp"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgument(f"property {key} must be a non-negative integer")
        else:
            raise InvalidArgument(f"unknown property {key!r}")
    if any(v is None for v in props.values()):
        props = {k: v for k, v in props.items() if v is not None}
    return props or None


class Message:
    """One published message. Immutable after publish; shared between queues."""

    __slots__ = ("seq", "exchange", "routing_key", "body", "properties", "persistent", "expires_at")

    def __init__(
        self,
        seq: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        expires_at: float | None = None,
    ) -> None:
        self.seq = seq
        self.exchange = exchange
        self.routing_key = routing_key
        self.body = body
        self.properties = properties
        self.persistent = properties is None or properties.get("delivery_mode", 2) == 2
        # Wall-clock time after which the message is dead (per-message expiration or
        # the queue's x-message-ttl, whichever is sooner), or None.
        self.expires_at = expires_at

    @property
    def message_id(self) -> str | None:
        if self.properties is None:
            return None
        return self.properties.get("message_id")

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, exchange={self.exchange!r}, routing_key={self.routing_key!r})"


class Entry:
    """A message's place in one queue: the message plus whether it was delivered before."""

    __slots__ = ("message", "delivered", "expires_at")

    def __init__(self, message: Message, delivered: bool = False, expires_at: float | None = None) -> None:
        self.message = message
        self.delivered = delivered
        self.expires_at = expires_at

    @property
    def seq(self) -> int:
        return self.message.seq

    def __lt__(self, other: "Entry") -> bool:
        return self.message.seq < other.message.seq

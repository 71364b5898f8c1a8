"""Messages and their properties (AMQP 0-9-1 basic properties).

A :class:`StoredMessage` is immutable once published and shared by reference between every
queue it was routed to, so its body is stored once however many queues hold it. The
per-queue state of a message (how often was it delivered?) lives in :class:`Entry`.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgument
from .fieldtables import TAG, check_field_name, check_tagged
from .senderselected import check_routing_headers

__all__ = [
    "MAX_EXPIRATION_MS",
    "MAX_JSON_DEPTH",
    "MAX_JSON_ITEMS",
    "StoredMessage",
    "Entry",
    "check_json_value",
    "check_properties",
    "PROPERTY_NAMES",
]

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


#: Deepest nesting of objects and arrays in a JSON value the broker keeps (message
#: headers, entity arguments). The log, checkpoints and deliveries encode them with
#: orjson, which refuses more than 254 levels: a value accepted must never fail to
#: encode later. 32 is far beyond any real use (AMQP field tables nest a few levels).
MAX_JSON_DEPTH = 32
#: Most items (keys plus elements, at every level) in one such value.
MAX_JSON_ITEMS = 10_000
#: Largest integer in such a value: JSON numbers the log stores as signed 64-bit.
_INT64 = (1 << 63) - 1
#: Largest ``expiration`` (ms): 2^32 - 1, RabbitMQ's bound for a message TTL (49.7 days).
MAX_EXPIRATION_MS = (1 << 32) - 1


def check_json_value(value: object, what: str, *, field_table: bool = False) -> None:
    """Refuse a JSON value the broker could not keep: nested deeper than
    ``MAX_JSON_DEPTH``, with more than ``MAX_JSON_ITEMS`` items, or holding an
    integer outside 64 bits. ``field_table`` (message headers): also one an AMQP
    consumer could not be given (``fieldtables.py``: field names over 255 bytes,
    tagged values that do not fit their type).

    Raises InvalidArgument naming ``what`` and the limit.
    """
    items = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if field_table:
                if TAG in node and check_tagged(node, what):
                    continue  # (its value fits its type: a scalar within 64 bits)
                for key in node:
                    if len(key) > 63:
                        check_field_name(key, what)
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            if isinstance(node, int) and not isinstance(node, bool) and not -_INT64 - 1 <= node <= _INT64:
                raise InvalidArgument(f"{what} holds an integer outside 64 bits")
            continue
        if depth > MAX_JSON_DEPTH:
            raise InvalidArgument(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
        items += len(node)
        if items > MAX_JSON_ITEMS:
            raise InvalidArgument(f"{what} has more than {MAX_JSON_ITEMS} items")
        for child in children:
            if isinstance(child, (dict, list)) or type(child) is int:
                stack.append((child, depth + 1))
    return None


def check_properties(props: object, *, amqp_limits: bool = True) -> dict[str, Any] | None:
    """Validate message properties from JSON; return them (None when empty).
    ``amqp_limits`` False: headers an AMQP consumer could not be given pass (a stored
    message from before they were refused, forwarded between nodes).

    Raises InvalidArgument naming the offending property.
    """
    if props is None:
        return None
    if not isinstance(props, dict):
        raise InvalidArgument("properties must be an object")
    if not props:
        return None
    has_none = False
    for key, value in props.items():
        if value is None:
            has_none = True
            continue
        if key in _STR_PROPS:
            if not isinstance(value, str):
                raise InvalidArgument(f"property {key} must be a string")
            if value.isascii():  # O(1): no encoding needed to know its UTF-8 length
                too_long = len(value) > 255
            else:
                try:
                    too_long = len(value) > 255 or len(value.encode()) > 255
                except UnicodeEncodeError:
                    raise InvalidArgument(f"property {key} is not valid UTF-8 text") from None
            if too_long:
                raise InvalidArgument(f"property {key} is longer than 255 bytes")
        elif key == "headers":
            if not isinstance(value, dict):
                raise InvalidArgument("property headers must be an object")
            check_json_value(value, "property headers", field_table=amqp_limits)
            if "CC" in value or "BCC" in value:
                check_routing_headers(value)
        elif key == "delivery_mode":
            if value not in (1, 2) or isinstance(value, bool):
                raise InvalidArgument("property delivery_mode must be 1 (transient) or 2 (persistent)")
        elif key == "priority":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
                raise InvalidArgument("property priority must be an integer 0..255")
        elif key == "expiration":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_EXPIRATION_MS:
                raise InvalidArgument(f"property expiration must be an integer 0..{MAX_EXPIRATION_MS} (ms)")
        elif key == "timestamp":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _INT64:
                raise InvalidArgument(f"property timestamp must be an integer 0..{_INT64}")
        else:
            raise InvalidArgument(f"unknown property {key!r}")
    if has_none:
        props = {k: v for k, v in props.items() if v is not None}
    return props or None


# Property dicts other than the message id repeat from message to message (a publisher
# sends the same content type and delivery mode every time), so messages share one
# copy of each: a two-key dict costs 184 bytes, a million queued messages 184 MB.
# Bounded: when it is full the cache starts over (sharing is an optimisation only).
_SHARED_PROPERTIES: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
_SHARED_PROPERTIES_MAX = 4096


def _split_properties(
    properties: dict[str, Any] | None, owned: bool
) -> tuple[str | None, dict[str, Any] | None]:
    """(message id, the other properties as a shared dict or None). ``owned``: the dict
    is fresh (decoded from a record) and may be taken apart in place."""
    if not properties:
        return None, None
    others = properties if owned else properties.copy()  # (a C-level copy: the cheapest)
    message_id = others.pop("message_id", None)
    if not others:
        return message_id, None
    try:
        key = tuple(others.items())
        shared = _SHARED_PROPERTIES.get(key)
    except TypeError:  # an unhashable value (headers): this message keeps its own dict
        return message_id, others
    if shared is None:
        if len(_SHARED_PROPERTIES) >= _SHARED_PROPERTIES_MAX:
            _SHARED_PROPERTIES.clear()
        shared = _SHARED_PROPERTIES[key] = others
    return message_id, shared


class StoredMessage:
    """One published message. Immutable after publish; shared between queues.

    ``properties`` is rebuilt on access from the ``message_id`` and a dict of the other
    properties shared between messages (see ``_shared``): treat it as read-only."""

    __slots__ = (
        "seq", "exchange", "routing_key", "body", "_props", "message_id", "persistent", "expires_at", "lsn",
        "enqueued_at",
    )

    def __init__(
        self,
        seq: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        expires_at: float | None = None,
        *,
        owned: bool = False,
        enqueued_at: float = 0.0,
    ) -> None:
        """``owned``: ``properties`` is a fresh dict (recovery) the message may take
        apart instead of copying. ``enqueued_at``: when it entered its queues (epoch
        seconds; 0 when unknown), shown to operators."""
        self.seq = seq
        self.exchange = exchange
        self.routing_key = routing_key
        self.body = body
        self.message_id, self._props = _split_properties(properties, owned)
        self.persistent = self._props is None or self._props.get("delivery_mode", 2) == 2
        # Wall-clock time after which the message is dead (per-message expiration or
        # the queue's x-message-ttl, whichever is sooner), or None.
        self.expires_at = expires_at
        # LSN of the ENQUEUE record holding the message (0: not logged). Durable queues
        # may drop the body from memory and read it back from there (core/paging.py).
        self.lsn = 0
        self.enqueued_at = enqueued_at

    @property
    def properties(self) -> dict[str, Any] | None:
        """The message's properties (None when it has none)."""
        if self.message_id is None:
            return self._props
        if self._props is None:
            return {"message_id": self.message_id}
        return {**self._props, "message_id": self.message_id}

    @property
    def priority(self) -> int:
        """The ``priority`` property, 0 without one (a priority queue's order)."""
        props = self._props
        value = props.get("priority") if props else None
        return value if type(value) is int else 0

    def __repr__(self) -> str:
        return f"StoredMessage(seq={self.seq}, exchange={self.exchange!r}, routing_key={self.routing_key!r})"


class Entry:
    """A message's place in one queue: the message, how many times this queue has
    delivered it (``deliveries``), and when it expires (wall-clock seconds)."""

    __slots__ = ("message", "deliveries", "expires_at")

    def __init__(self, message: StoredMessage, deliveries: int = 0, expires_at: float | None = None) -> None:
        self.message = message
        self.deliveries = int(deliveries)
        self.expires_at = expires_at

    @property
    def delivered(self) -> bool:
        """Whether the message was delivered before (AMQP's ``redelivered`` flag)."""
        return self.deliveries > 0

    @property
    def seq(self) -> int:
        return self.message.seq

    def __lt__(self, other: "Entry") -> bool:
        return self.message.seq < other.message.seq

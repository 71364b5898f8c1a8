"""What every channel op shares: the fields each op takes, the envelope (its ``id``,
echoed in its reply), the reply event, and the small decoders of the ops' fields.

Every op's fields are listed in :data:`OP_FIELDS`; any other field is refused
(``invalid_argument``, the channel ends), as REST refuses an unknown field of a body,
so ``{"op":"publish","routng_key":"jobs"}`` is an error rather than a publish with an
empty key. The handlers are ``ops.py`` and ``lock_ops.py``; the reader
(``reader.py``) checks each line's fields against this table first.
"""

from __future__ import annotations

from typing import Any

from broker.api.fields import (
    BINDING_FIELDS,
    EXCHANGE_DECLARE_FIELDS,
    LOCK_ACQUIRE_FIELDS,
    LOCK_REFRESH_FIELDS,
    LOCK_RELEASE_FIELDS,
    QUEUE_DECLARE_FIELDS,
    Fields,
    unknown_fields,
)
from broker.core import Broker, InvalidArgument, check_delay, check_json_value

__all__ = [
    "ENVELOPE",
    "OP_FIELDS",
    "PUBLISH_FIELDS",
    "ChannelClosed",
    "ack_each",
    "ack_tags",
    "check_fields",
    "check_id",
    "echo_id",
    "get_field",
    "op_delay",
    "reply",
    "typed_fields",
]

#: The fields every op may carry: its name and a correlation ``id`` (echoed).
ENVELOPE = frozenset({"op", "id"})
#: The fields of a publish (besides the envelope).
PUBLISH_FIELDS = frozenset(
    {"exchange", "routing_key", "body", "body_b64", "properties", "mandatory", "delay_s", "deadline_ms", "dedup"}
)

#: Op name -> the fields it takes (envelope included). Anything else is refused.
OP_FIELDS: dict[str, frozenset[str]] = {
    name: ENVELOPE | fields
    for name, fields in {
        "publish": PUBLISH_FIELDS,
        # ``arguments``: consumer arguments (``x-priority`` is used; others are kept for clients that send them)
        "consume": frozenset({"queue", "consumer_tag", "prefetch", "no_ack", "exclusive", "ack_timeout_ms", "arguments"}),
        "cancel": frozenset({"consumer_tag"}),
        "get": frozenset({"queue", "no_ack"}),
        "qos": frozenset({"prefetch", "global"}),
        "ack": frozenset({"delivery_tag", "multiple", "delivery_tags"}),
        "nack": frozenset({"delivery_tag", "multiple", "requeue", "delay_s"}),
        "reject": frozenset({"delivery_tag", "requeue", "delay_s"}),
        "touch": frozenset({"delivery_tag"}),
        "declare_exchange": EXCHANGE_DECLARE_FIELDS | {"exchange"},
        "delete_exchange": frozenset({"exchange", "if_unused"}),
        "declare_queue": QUEUE_DECLARE_FIELDS | {"queue"},
        "delete_queue": frozenset({"queue", "if_unused", "if_empty"}),
        "purge_queue": frozenset({"queue"}),
        "bind": BINDING_FIELDS,
        "unbind": BINDING_FIELDS,
        "close": frozenset(),
        "tx_select": frozenset(),
        "tx_commit": frozenset(),
        "tx_rollback": frozenset(),
        "lock_acquire": LOCK_ACQUIRE_FIELDS | {"lock"},
        "lock_refresh": LOCK_REFRESH_FIELDS | {"lock"},
        "lock_release": LOCK_RELEASE_FIELDS | {"lock"},
        "lock_info": frozenset({"lock"}),
    }.items()
}


class ChannelClosed(Exception):
    """The channel ends normally (close op or end of input): stop reading."""


def check_fields(op: dict[str, Any], name: str, allowed: frozenset[str]) -> None:
    """Raises InvalidArgument if ``op`` carries a field its op does not take."""
    if not allowed.issuperset(op):
        raise unknown_fields(op, allowed, f"{name} op")


def echo_id(op: dict[str, Any]) -> tuple[bool, Any]:
    """(whether to echo, the id): an op's ``id`` (any JSON value: the client's
    correlation token) is echoed only within the bounds of every JSON value the broker
    keeps (``check_json_value``): one nested too deep could not even be encoded."""
    if "id" not in op:
        return False, None
    try:
        check_json_value(op["id"], "id")
    except InvalidArgument:
        return False, None
    return True, op["id"]


def check_id(op: dict[str, Any]) -> None:
    """Raises InvalidArgument for an ``id`` that cannot be echoed."""
    if "id" in op:
        check_json_value(op["id"], "id")


def reply(request: dict[str, Any], ev: str, /, **fields: Any) -> dict[str, Any]:
    """The reply event ``ev`` to the op ``request`` (echoing its ``id``). Positional-only
    parameters: replies carry a field named ``op``."""
    event: dict[str, Any] = {"ev": ev}
    echo, op_id = echo_id(request)
    if echo:
        event["id"] = op_id
    event.update(fields)
    return event


def get_field(op: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """The op's field ``name`` (``default`` when absent), of type ``kind`` (an int is
    never a bool); raises InvalidArgument otherwise."""
    value = op.get(name, default)
    if value is None and default is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidArgument(f"field {name} has the wrong type")
    return value


def ack_tags(op: dict[str, Any]) -> list[int]:
    """An ``ack`` op's ``delivery_tags`` (many acks in one op, each as ``multiple``
    false), which go without ``delivery_tag`` and ``multiple``."""
    if "delivery_tag" in op or "multiple" in op:
        raise InvalidArgument("an ack op takes delivery_tags or delivery_tag (and multiple), not both")
    tags = op["delivery_tags"]
    if not isinstance(tags, list) or not all(type(tag) is int for tag in tags):
        raise InvalidArgument("field delivery_tags must be a list of integers")
    return tags


def ack_each(core: Broker, channel_id: int, tags: list[int]) -> None:
    """Ack each of ``tags`` in order (an unknown one raises, the ones before it stay
    acked: as many ``ack`` ops would)."""
    ack = core.ack
    for tag in tags:
        ack(channel_id, tag, False)


def op_delay(op: dict[str, Any]) -> float | None:
    """An op's ``delay_s`` (none: no delay)."""
    value = op.get("delay_s")
    return None if value is None else check_delay(value)


def typed_fields(op: dict[str, Any]) -> Fields:
    """The op as typed fields (its field list was checked by the reader)."""
    name = op["op"]
    return Fields(op, OP_FIELDS[name], f"{name} op")

"""JSON shapes of messages and events on the wire (pure).

One place decides how a message travels in JSON (``body`` when the bytes are UTF-8,
``body_b64`` otherwise), how channel events look, and how REST publish headers map
to message properties, so REST, streams and channels agree.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from broker.core import (
    Confirm,
    ConsumerActive,
    ConsumerCancelled,
    Deliver,
    DeliveryExpired,
    InvalidArgument,
    LockGranted,
    LockWaitEnded,
    Return,
    StoredMessage,
    check_properties,
)

__all__ = [
    "message_json",
    "event_json",
    "body_from_json",
    "body_from_b64",
    "properties_from_headers",
    "dumps_line",
    "parse_op_line",
]


def message_json(message: StoredMessage, delivery_count: int | None = None) -> dict[str, Any]:
    """``{"body" | "body_b64": ..., "properties": {...}}`` for a message; for a
    delivery, with ``"delivery_count"``: how many times it was delivered before. A
    redelivered message's headers carry the count as ``x-delivery-count`` too (as
    RabbitMQ's quorum queues do)."""
    body = message.body
    out: dict[str, Any]
    try:
        out = {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        out = {"body_b64": base64.b64encode(body).decode("ascii")}
    properties = message.properties or {}
    if delivery_count:
        properties = dict(properties)
        properties["headers"] = {**(properties.get("headers") or {}), "x-delivery-count": delivery_count}
    out["properties"] = properties
    if delivery_count is not None:
        out["delivery_count"] = delivery_count
    return out


def event_json(effect: Any) -> dict[str, Any]:
    """The channel event for a core effect addressed to a channel."""
    if isinstance(effect, Deliver):
        message = message_json(effect.message, effect.delivery_count)
        ev: dict[str, Any] = {
            "ev": "deliver",
            "consumer_tag": effect.consumer_tag,
            "delivery_tag": effect.delivery_tag,
            "redelivered": effect.redelivered,
            "delivery_count": message.pop("delivery_count"),
            "exchange": effect.message.exchange,
            "routing_key": effect.message.routing_key,
            "message": message,
        }
        if effect.lease_id is not None:
            ev["lease_id"] = effect.lease_id
        return ev
    if isinstance(effect, Confirm):
        if effect.ack:
            return {"ev": "ack", "delivery_tag": effect.delivery_tag, "multiple": effect.multiple}
        return {
            "ev": "nack",
            "delivery_tag": effect.delivery_tag,
            "multiple": effect.multiple,
            "reason": effect.reason or "",
        }
    if isinstance(effect, Return):
        return {
            "ev": "return",
            "delivery_tag": effect.delivery_tag,
            "reply_code": effect.reply_code,
            "reason": effect.reason,
            "exchange": effect.message.exchange,
            "routing_key": effect.message.routing_key,
            "message": message_json(effect.message),
        }
    if isinstance(effect, ConsumerActive):
        return {"ev": "active", "consumer_tag": effect.consumer_tag}
    if isinstance(effect, ConsumerCancelled):
        return {"ev": "cancel", "consumer_tag": effect.consumer_tag, "reason": effect.reason}
    if isinstance(effect, DeliveryExpired):
        return {
            "ev": "expired",
            "consumer_tag": effect.consumer_tag,
            "delivery_tag": effect.delivery_tag,
        }
    if isinstance(effect, LockGranted):  # a lock_acquire that waited in line
        return {"ev": "ok", **effect.ref, "op": "lock_acquire", "lock": effect.info}
    if isinstance(effect, LockWaitEnded):
        return {
            "ev": "refused",
            **effect.ref,
            "op": "lock_acquire",
            "error": "lock_held",
            "message": f"lock {effect.info['name']!r} is still held by {effect.info['owner']!r}",
            "lock": effect.info,
        }
    raise TypeError(f"not a channel effect: {effect!r}")


def dumps_line(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def body_from_json(op: dict[str, Any]) -> bytes:
    """The message body of a publish op: ``body`` (text) or ``body_b64``."""
    if "body_b64" in op:
        value = op["body_b64"]
        if not isinstance(value, str):
            raise InvalidArgument("body_b64 must be a base64 string")
        return body_from_b64(value)
    value = op.get("body", "")
    if not isinstance(value, str):
        raise InvalidArgument("body must be a string (use body_b64 for bytes)")
    return value.encode("utf-8", "surrogatepass")


def body_from_b64(value: str) -> bytes:
    """A ``body_b64`` field's bytes. Raises InvalidArgument for bad base64."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"body_b64 is not valid base64: {exc}") from None


def parse_op_line(line: bytes) -> dict[str, Any]:
    """One NDJSON operation. Raises InvalidArgument for bad JSON or a non-object."""
    try:
        op = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"invalid JSON: {exc}", code="invalid_json") from None
    if not isinstance(op, dict):
        raise InvalidArgument("each line must be a JSON object", code="invalid_json")
    return op


_HEADER_PROPS = {
    "content-type": "content_type",
    "content-encoding": "content_encoding",
    "x-message-id": "message_id",
    "x-correlation-id": "correlation_id",
    "x-reply-to": "reply_to",
    "x-type": "type",
    "x-app-id": "app_id",
    "x-user-id": "user_id",
}
_INT_HEADER_PROPS = {
    "x-priority": "priority",
    "x-expiration": "expiration",
    "x-delivery-mode": "delivery_mode",
    "x-timestamp": "timestamp",
}


def properties_from_headers(headers: list[tuple[str, str]]) -> dict[str, Any] | None:
    """Message properties from a REST publish's HTTP headers (lowercased names).

    ``X-Header-<name>: value`` becomes ``headers[<name>] = value``. Raises
    InvalidArgument naming the header.
    """
    props: dict[str, Any] = {}
    app_headers: dict[str, Any] = {}
    for name, value in headers:
        if name in _HEADER_PROPS:
            if name == "content-type" and value in ("application/octet-stream",):
                continue
            props[_HEADER_PROPS[name]] = value
        elif name in _INT_HEADER_PROPS:
            try:
                props[_INT_HEADER_PROPS[name]] = int(value)
            except ValueError:
                raise InvalidArgument(f"header {name} must be an integer") from None
        elif name.startswith("x-header-") and len(name) > 9:
            app_headers[name[9:]] = value
    if app_headers:
        props["headers"] = app_headers
    return check_properties(props)

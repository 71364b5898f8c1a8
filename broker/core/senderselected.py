"""Sender-selected distribution: RabbitMQ's ``CC`` and ``BCC`` headers.

A publish whose headers carry ``CC`` and/or ``BCC`` (each an array of routing keys) is
routed with its own routing key and every key they name, and reaches each queue once;
``BCC`` is then taken out of the message, so no consumer learns who else was sent it,
while ``CC`` stays. RabbitMQ programs use this to send one publish to several keys.

The rules are RabbitMQ's (checked against 3.10 by
tests/system/test_amqp_differential_ccbcc.py): the header names are case-sensitive; a
``CC`` or ``BCC`` that is not an array refuses the publish (RabbitMQ closes the channel
with ``406``: ``unacceptable_type_in_header``); the entries of the array that are not
strings are ignored.

Kept apart from routing so that every path agrees on one reading: the publish
(``Publishing.publish_tagged``: routes with :meth:`Topology.route_publish`, then
stores the message without ``BCC``), the cluster's forwarding plan (the same route),
and dead-lettering (the ``x-death`` ``routing-keys``, the copy's keys).
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgument

__all__ = [
    "ROUTING_HEADERS",
    "check_routing_headers",
    "header_routes",
    "publish_keys",
    "without_bcc",
]

#: The headers whose arrays name more routing keys, in RabbitMQ's order.
ROUTING_HEADERS = ("CC", "BCC")


def _kind(value: object) -> str:
    """What a header value is, in JSON's words, for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        tag = value.get("$amqp")
        return f"an AMQP {tag}" if isinstance(tag, str) else "an object"
    return type(value).__name__


def check_routing_headers(headers: dict[str, Any]) -> None:
    """Refuse headers whose ``CC`` or ``BCC`` is not an array (RabbitMQ refuses the
    publish; it would otherwise route silently to fewer keys than the sender meant).

    Raises InvalidArgument (over AMQP: ``406 PRECONDITION_FAILED``, as RabbitMQ)."""
    for name in ROUTING_HEADERS:
        if name in headers:
            value = headers[name]
            if type(value) is not list:
                raise InvalidArgument(
                    f"invalid message: header {name} must be an array of routing keys "
                    f"(strings), not {_kind(value)}"
                )


def header_routes(headers: dict[str, Any]) -> list[str]:
    """The routing keys ``CC`` then ``BCC`` name, in order, repeats kept (RabbitMQ's
    ``header_routes``: what an ``x-death`` entry lists after the publish's own key).
    Entries that are not strings are ignored, and so is a header that is not an
    array (refused at the publish, but a message logged before may carry one)."""
    keys: list[str] = []
    for name in ROUTING_HEADERS:
        values = headers.get(name)
        if type(values) is list:
            keys.extend(v for v in values if type(v) is str)
    return keys


def publish_keys(routing_key: str, headers: dict[str, Any]) -> list[str]:
    """Every routing key a publish is routed with: its own first, then those of
    ``CC`` and ``BCC`` (:func:`header_routes`), each once."""
    return list(dict.fromkeys([routing_key, *header_routes(headers)]))


def without_bcc(headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` without ``BCC`` (a copy when it had one): what the message carries
    on, and what a headers exchange matches (RabbitMQ strips it before routing)."""
    if "BCC" not in headers:
        return headers
    return {name: value for name, value in headers.items() if name != "BCC"}


"""AMQP 0-9-1 reply codes, and the mapping from the core's errors to them.

The codes and their names are the spec's, as RabbitMQ writes them at the start of a
reply text (``NOT_FOUND - no queue 'q' in vhost '/'``). Which are channel exceptions
and which connection exceptions is the spec's too: 3xx/4xx close a channel, 5xx the
connection.
"""

from __future__ import annotations

from broker.core import (
    AccessRefused,
    ChannelError,
    ErrorReply,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    ResourceLocked,
    Unavailable,
)

__all__ = [
    "ACCESS_REFUSED",
    "CHANNEL_ERROR",
    "COMMAND_INVALID",
    "CONNECTION_FORCED",
    "FRAME_ERROR",
    "INTERNAL_ERROR",
    "NOT_ALLOWED",
    "NOT_FOUND",
    "NOT_IMPLEMENTED",
    "NO_ROUTE",
    "PRECONDITION_FAILED",
    "REFUSED_TARGETS",
    "REPLY_SUCCESS",
    "RESOURCE_ERROR",
    "RESOURCE_LOCKED",
    "SYNTAX_ERROR",
    "UNEXPECTED_FRAME",
    "is_connection_error",
    "refusal_text",
    "reply_for",
    "reply_text",
]

REPLY_SUCCESS = 200
NO_ROUTE = 312
CONNECTION_FORCED = 320
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

_NAMES = {
    REPLY_SUCCESS: "",
    NO_ROUTE: "NO_ROUTE",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


def reply_text(code: int) -> str:
    """The reply code's name (``NOT_FOUND``), or "" for one the spec does not name."""
    return _NAMES.get(code, "")


def is_connection_error(code: int) -> bool:
    return code >= 500


def reply_for(exc: ErrorReply) -> int:
    """The AMQP reply code of a core error (RabbitMQ's choice for the same refusal)."""
    if isinstance(exc, NotFound):
        return NOT_FOUND
    if isinstance(exc, AccessRefused):
        # RabbitMQ answers a second exclusive consumer, or a consume beside an
        # exclusive one, with 403 as well.
        return ACCESS_REFUSED
    if isinstance(exc, ResourceLocked):
        return RESOURCE_LOCKED
    if isinstance(exc, (PreconditionFailed, InvalidArgument, PayloadTooLarge)):
        return PRECONDITION_FAILED
    if isinstance(exc, ChannelError):
        if exc.code == "not_allowed":
            return NOT_ALLOWED
        return PRECONDITION_FAILED
    if isinstance(exc, Unavailable):
        return RESOURCE_ERROR if exc.code != "shutting_down" else CONNECTION_FORCED
    return INTERNAL_ERROR


#: Nack reasons that refuse the publish's target (the core's wording).
REFUSED_TARGETS = ("not_found: ", "access_refused: ")


def refusal_text(code: str, text: str) -> str:
    """RabbitMQ's text for a publish to a missing or internal exchange."""
    name = text.split("'")[1] if text.count("'") >= 2 else text
    if code == "not_found":
        return f"NOT_FOUND - no exchange '{name}' in vhost '/'"
    return f"ACCESS_REFUSED - cannot publish to internal exchange '{name}' in vhost '/'"

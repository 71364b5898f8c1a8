"""The broker's error hierarchy.

Every error the core raises is a :class:`ErrorReply` carrying a stable machine code
(the ``error`` field of JSON error bodies) and an HTTP status hint. Only the HTTP layer
turns them into responses; the core never knows about HTTP beyond this hint.
"""

from __future__ import annotations

__all__ = [
    "ErrorReply",
    "InvalidArgument",
    "NotFound",
    "AccessRefused",
    "PreconditionFailed",
    "ResourceLocked",
    "PayloadTooLarge",
    "Unavailable",
    "ChannelError",
]


class ErrorReply(Exception):
    """Base of every error the broker reports to a client."""

    code: str = "internal_error"
    status: int = 500

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def to_json(self) -> dict[str, str]:
        return {"error": self.code, "message": self.message}


class InvalidArgument(ErrorReply):
    """Malformed input: a missing field, a wrong type, a bad name (400)."""

    code = "invalid_argument"
    status = 400


class NotFound(ErrorReply):
    """An exchange, queue, binding, lease or delivery tag that does not exist (404)."""

    code = "not_found"
    status = 404


class AccessRefused(ErrorReply):
    """An operation on a reserved entity, such as the default exchange or ``amq.*`` (403)."""

    code = "access_refused"
    status = 403


class PreconditionFailed(ErrorReply):
    """Redeclare with other settings, delete if-unused of a used queue, and the like (409)."""

    code = "precondition_failed"
    status = 409


class ResourceLocked(ErrorReply):
    """An exclusive queue or consumer owned by another channel (AMQP 405 resource-locked; HTTP 409)."""

    code = "resource_locked"
    status = 409


class PayloadTooLarge(ErrorReply):
    """A body or message over the configured maximum (413)."""

    code = "payload_too_large"
    status = 413


class Unavailable(ErrorReply):
    """The broker cannot take this now: storage failing, a limit reached, shutting down (503)."""

    code = "unavailable"
    status = 503


class ChannelError(ErrorReply):
    """A protocol violation on a channel (unknown delivery tag, bad op); closes the channel."""

    code = "channel_error"
    status = 400

"""The HTTP server's errors: every error response it sends is one of these.

An :class:`HTTPError` carries a status, a stable machine ``code`` and a message, and
becomes ``{"error": code, "message": text}`` with that status, plus any extra response
headers it names (``Allow`` for a 405). Handlers raise them directly, or raise their
own exception types and give the server a translator (``HTTPServer(error_translator=)``)
that maps those to an ``HTTPError``; anything else is a 500.
:class:`ClientDisconnected` is deliberately *not* an ``HTTPError``: nobody is left to
answer, it only tells a handler to clean up.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import h11

__all__ = [
    "BadRequest",
    "ClientDisconnected",
    "HTTPError",
    "HeaderFieldsTooLarge",
    "InvalidRequest",
    "MethodNotAllowed",
    "NoSuchEndpoint",
    "NotImplementedByServer",
    "PayloadTooLarge",
    "RequestTimeout",
    "ServiceUnavailable",
    "protocol_error",
]


class ClientDisconnected(Exception):
    """The client went away (or stopped reading) mid-exchange.

    Raised by ``Response.send*`` when the socket is broken or a write stalls past
    ``Limits.send_timeout_s``, and by ``Request`` body reads when the connection ends
    before the body does. Handlers catch it to release what the exchange held (a
    channel returns its unacked deliveries); letting it escape is fine too -- the server
    closes the connection quietly.
    """


class HTTPError(Exception):
    """An error response: ``status``, machine ``code``, ``message``, extra ``headers``.

    Without a more specific class it is a 500 ``internal_error``.
    """

    code: str = "internal_error"
    status: int = 500

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.headers: tuple[tuple[str, str], ...] = tuple(headers)

    def to_json(self) -> dict[str, str]:
        """The response body: ``{"error": code, "message": message}``."""
        return {"error": self.code, "message": self.message}


class BadRequest(HTTPError):
    """Malformed HTTP: bad request line, bad header, bad chunk framing (400)."""

    code = "bad_request"
    status = 400


class InvalidRequest(HTTPError):
    """A well-formed HTTP request whose path, query string or JSON body is not valid
    (400, code ``invalid_argument``, or ``invalid_json`` for a body that does not parse)."""

    code = "invalid_argument"
    status = 400


class NoSuchEndpoint(HTTPError):
    """No route has this path (404)."""

    code = "not_found"
    status = 404


class PayloadTooLarge(HTTPError):
    """The request body exceeds its limit (413)."""

    code = "payload_too_large"
    status = 413


class ServiceUnavailable(HTTPError):
    """The server cannot take the request now, e.g. too many connections (503)."""

    code = "unavailable"
    status = 503


class MethodNotAllowed(HTTPError):
    """The path exists but not for this method (405); carries the ``Allow`` header.

    RFC 9110 section 15.5.6: a 405 response MUST include ``Allow``.
    """

    code = "method_not_allowed"
    status = 405

    def __init__(self, method: str, path: str, allow: Sequence[str]) -> None:
        self.allow: tuple[str, ...] = tuple(allow)
        super().__init__(
            f"method {method} is not allowed on {path}; allowed: {', '.join(self.allow)}",
            headers=[("allow", ", ".join(self.allow))],
        )


class RequestTimeout(HTTPError):
    """The client was too slow sending its request head or body (408)."""

    code = "request_timeout"
    status = 408


class HeaderFieldsTooLarge(HTTPError):
    """The request head is too large or has too many fields (431, RFC 6585 section 5)."""

    code = "header_fields_too_large"
    status = 431


class NotImplementedByServer(HTTPError):
    """A feature the server does not support, such as a transfer coding other than
    chunked (501, RFC 9112 section 6.1)."""

    code = "not_implemented"
    status = 501


_BY_STATUS: dict[int, type[HTTPError]] = {
    400: BadRequest,
    408: RequestTimeout,
    431: HeaderFieldsTooLarge,
    501: NotImplementedByServer,
}


_BYTES_REPR = re.compile(r"""(?:bytearray\()?b(['"])(.*?)\1\)?""")


def _without_reprs(message: str) -> str:
    """h11 quotes the offending bytes as Python reprs (``bytearray(b'GARBAGE')``):
    show them as quoted text (``'GARBAGE'``), escapes kept."""
    return _BYTES_REPR.sub(lambda m: f"'{m.group(2)}'", message)


def protocol_error(exc: h11.RemoteProtocolError) -> HTTPError:
    """Translate an h11 parse error into the matching ``HTTPError``.

    h11 attaches ``error_status_hint``: 400 by default, 431 for an oversized head,
    501 for a transfer coding other than chunked.
    """
    status = exc.error_status_hint
    cls = _BY_STATUS.get(status)
    message = _without_reprs(str(exc)) or "malformed HTTP request"
    if cls is not None:
        return cls(message)
    return BadRequest(message, status=status if 400 <= status < 600 else 400)

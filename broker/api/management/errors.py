"""RabbitMQ's error answers, for the management API's routes.

RabbitMQ's management plugin answers an error as ``{"error": ..., "reason": ...}``
(ackbus's own API says ``{"error": code, "message": text}``): a tool that reads
``reason`` must find it. This module is the one place that turns ackbus's errors
(the core's :class:`~broker.core.ErrorReply`, the HTTP layer's
:class:`~broker.http.HTTPError`) into those answers, with RabbitMQ 3.10's status for
each kind:

* an object named in the path that does not exist (a queue, an exchange, a binding,
  a vhost other than ``/``): ``404 {"error": "Object Not Found", "reason": "Not Found"}``;
* a refused declare, delete or argument (inequivalent, not empty, in use, a bad
  value): ``400 bad_request`` with ackbus's message as the reason;
* a command naming something missing in the body (a binding's queue):
  ``404 not_found``;
* an operation the user may not do: ``401 not_authorised`` (RabbitMQ answers
  "Access refused." with 401, not 403);
* anything else keeps ackbus's status and code (503 ``unavailable`` while the
  broker recovers, 413 for a body over the limit).
"""

from __future__ import annotations

from typing import Any, Final

from broker.core import AccessRefused, ErrorReply, NotFound
from broker.http import HTTPError

__all__ = ["NOT_FOUND_BODY", "ObjectNotFound", "rabbit_error"]

#: RabbitMQ's answer for an object (or vhost) named in the path that does not exist.
NOT_FOUND_BODY: Final = {"error": "Object Not Found", "reason": "Not Found"}


class ObjectNotFound(NotFound):
    """An object named in the request's path does not exist (404 "Object Not Found")."""


def rabbit_error(exc: BaseException) -> tuple[int, dict[str, Any], tuple[tuple[str, str], ...]] | None:
    """(status, body, headers) of RabbitMQ's answer for ``exc``; None for an
    exception that is not an error answer (a bug: the server answers 500)."""
    if isinstance(exc, ObjectNotFound):
        return 404, dict(NOT_FOUND_BODY), ()
    if isinstance(exc, AccessRefused):
        return 401, {"error": "not_authorised", "reason": exc.message}, ()
    if isinstance(exc, ErrorReply):
        if exc.status in (400, 409):
            return 400, {"error": "bad_request", "reason": exc.message}, ()
        return exc.status, {"error": exc.code, "reason": exc.message}, ()
    if isinstance(exc, HTTPError):
        error = "bad_request" if exc.status == 400 else exc.code
        return exc.status, {"error": error, "reason": exc.message}, exc.headers
    return None

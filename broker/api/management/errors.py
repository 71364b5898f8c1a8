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
* a page past the last of a list: ``400 page_out_of_range``;
* anything else keeps ackbus's status and code (503 ``unavailable`` while the
  broker recovers, 413 for a body over the limit).

The answers the HTTP layer gives before any management handler runs — the router's
guard (401), no route for the path (404), a method the path does not serve (405) —
are given RabbitMQ's bodies under ``/api/`` by :func:`api_error_bodies`, which wraps
the broker's whole handler (a tool reading RabbitMQ's API must find ``reason``
whatever refused it); every other path keeps ackbus's ``{"error", "message"}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from broker.core import AccessRefused, ErrorReply, InvalidArgument, NotFound
from broker.http import HTTPError, MethodNotAllowed, NoSuchEndpoint, Request, Response

__all__ = ["NOT_FOUND_BODY", "ObjectNotFound", "PageOutOfRange", "api_error_bodies", "rabbit_error"]

#: RabbitMQ's answer for an object (or vhost) named in the path that does not exist.
NOT_FOUND_BODY: Final = {"error": "Object Not Found", "reason": "Not Found"}


class ObjectNotFound(NotFound):
    """An object named in the request's path does not exist (404 "Object Not Found")."""


class PageOutOfRange(InvalidArgument):
    """A list's ``page`` past the last (400 ``page_out_of_range``, RabbitMQ's code,
    where its other bad queries are ``bad_request``)."""

    code = "page_out_of_range"


def rabbit_error(exc: BaseException) -> tuple[int, dict[str, Any], tuple[tuple[str, str], ...]] | None:
    """(status, body, headers) of RabbitMQ's answer for ``exc``; None for an
    exception that is not an error answer (a bug: the server answers 500)."""
    if isinstance(exc, ObjectNotFound):
        return 404, dict(NOT_FOUND_BODY), ()
    if isinstance(exc, AccessRefused):
        return 401, {"error": "not_authorised", "reason": exc.message}, ()
    if isinstance(exc, PageOutOfRange):
        return 400, {"error": exc.code, "reason": exc.message}, ()
    if isinstance(exc, ErrorReply):
        if exc.status in (400, 409):
            return 400, {"error": "bad_request", "reason": exc.message}, ()
        return exc.status, {"error": exc.code, "reason": exc.message}, ()
    if isinstance(exc, HTTPError):
        error = "bad_request" if exc.status == 400 else exc.code
        return exc.status, {"error": error, "reason": exc.message}, exc.headers
    return None


Handler = Callable[[Request, Response], Awaitable[None]]


def _is_api_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


async def _answer_http_error(response: Response, exc: HTTPError) -> None:
    """RabbitMQ's answer for an HTTP-layer refusal of a ``/api/`` request."""
    if isinstance(exc, MethodNotAllowed):
        # RabbitMQ (cowboy): 405 with ``Allow`` and no body
        await response.send_empty(405, headers=exc.headers)
        return
    if isinstance(exc, NoSuchEndpoint):
        await response.send_json(404, dict(NOT_FOUND_BODY), headers=exc.headers)
        return
    if exc.status == 401:
        # ackbus's reason (it says what to do); the challenge is kept
        await response.send_json(401, {"error": "not_authorized", "reason": exc.message}, headers=exc.headers)
        return
    answer = rabbit_error(exc)
    assert answer is not None  # (an HTTPError always has one)
    status, body, headers = answer
    await response.send_json(status, body, headers=headers)


def api_error_bodies(handler: Handler) -> Handler:
    """``handler`` with RabbitMQ's error bodies for the HTTP layer's refusals (the
    guard's 401, the router's 404 and 405, a path that does not decode) of requests
    under ``/api/``; any other path's, and anything not an ``HTTPError``, pass
    through unchanged (the server answers them as before)."""

    async def answered(request: Request, response: Response) -> None:
        try:
            await handler(request, response)
        except HTTPError as exc:
            if response.started or not _is_api_path(request.path):
                raise
            await _answer_http_error(response, exc)

    return answered

"""How the broker's errors become HTTP error responses.

The core raises :class:`~broker.core.ErrorReply` subclasses that carry a machine code
and a status hint; the HTTP server only knows its own ``HTTPError``. This module is the
one place that maps the first onto the second, handed to the server as its
``error_translator``.
"""

from __future__ import annotations

from broker.core import ErrorReply
from broker.http import HTTPError

__all__ = ["http_error"]


def http_error(exc: BaseException) -> HTTPError | None:
    """The response a ``ErrorReply`` means (same code, status and message); None for
    any other exception (the server answers 500 and logs it)."""
    if isinstance(exc, ErrorReply):
        return HTTPError(exc.message, code=exc.code, status=exc.status)
    return None

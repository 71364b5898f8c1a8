"""How the broker's errors become HTTP error responses.

The core raises :class:`~broker.core.ErrorReply` subclasses that carry a machine code
and a status hint; the HTTP server only knows its own ``HTTPError``. This module is the
one place that maps the first onto the second, handed to the server as its
``error_translator``.

It is also the one place that says when a refusal the cluster mends by itself is worth
trying again (``Retry-After``): a queue whose owner is down or cannot be reached, a
quorum queue without a leader or below its majority, etcd unreachable, this node's
view behind etcd. Every ``503`` of those carries the same header, whichever path
answers it: an error (:func:`http_error`, the relay to a queue's owner) or a publish
nacked for such a reason (:func:`nack_retry_after_s`).
"""

from __future__ import annotations

from typing import Final

from broker.cluster import NO_QUORUM
from broker.core import ErrorReply
from broker.http import HTTPError

__all__ = [
    "CLUSTER_RETRY_AFTER_S",
    "cluster_retry_after_s",
    "http_error",
    "nack_retry_after_s",
    "retry_after",
]

#: Seconds a client is asked to wait before trying again a call the cluster refused
#: for a passing reason (docs/cluster.md, docs/http-api.md): about the time a quorum
#: queue takes to elect a new leader with a short lease, and short enough that a
#: client given one node only is not kept waiting once its queue is served again.
CLUSTER_RETRY_AFTER_S: Final = 2
#: The error codes of those refusals (all ``503``).
CLUSTER_RETRY_CODES: Final = frozenset({"queue_unavailable", "etcd_unavailable", "cluster_lagging"})
#: How the reason of a publish nacked for such a refusal begins: a queue's owner down,
#: unreachable or hung, a quorum queue without a leader (``queue_unavailable: ...``),
#: or below its majority, or whose leader lost its leadership (``no quorum...``).
CLUSTER_NACK_REASONS: Final = ("queue_unavailable", NO_QUORUM)


def retry_after(seconds: int) -> tuple[tuple[str, str], ...]:
    """The ``Retry-After`` header asking a client to wait ``seconds``."""
    return (("retry-after", str(seconds)),)


def cluster_retry_after_s(code: str) -> int | None:
    """Seconds to wait before trying again a call refused with error ``code``; None
    for a refusal waiting does not mend (or not one of the cluster's)."""
    return CLUSTER_RETRY_AFTER_S if code in CLUSTER_RETRY_CODES else None


def nack_retry_after_s(reason: str | None) -> int | None:
    """Seconds to wait before publishing again a message the cluster nacked with
    ``reason``; None for any other nack (a full queue, storage failing)."""
    return CLUSTER_RETRY_AFTER_S if reason and reason.startswith(CLUSTER_NACK_REASONS) else None


def http_error(exc: BaseException) -> HTTPError | None:
    """The response a ``ErrorReply`` means (same code, status and message, and
    ``Retry-After`` for a refusal of the cluster's that waiting mends); None for any
    other exception (the server answers 500 and logs it)."""
    if isinstance(exc, ErrorReply):
        seconds = cluster_retry_after_s(exc.code) if exc.status == 503 else None
        return HTTPError(exc.message, code=exc.code, status=exc.status, headers=retry_after(seconds) if seconds else ())
    return None

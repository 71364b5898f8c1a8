"""Cluster mode: a REST call about one queue, made on a node that does not own it, is
relayed to the owner (docs/cluster.md, "Any node serves any queue").

``/queues/{name}/...`` (get, ack, nack, extend, purge, messages, redrive, stream) and
``GET /queues/{name}``, for a queue another node owns, are authenticated here (the
same users on every node), then sent to the owner as they came (the client's
``Authorization`` with them: the owner checks the same permissions) and its answer
streamed back, status and body unchanged. While the owner is down the answer is
``503 queue_unavailable`` with ``Retry-After``. Declares and deletes of queues go
through etcd (``cluster.py``), never here; a request already relayed by another node
(``X-Ackbus-Forwarded``) is served locally.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from broker.api.errors import cluster_retry_after_s, retry_after
from broker.cluster import FORWARDED_HEADER, PeerUnreachable, relay
from broker.http import HTTPError, Request, Response, split_path

if TYPE_CHECKING:
    from broker.cluster import ClusterNode

__all__ = ["relay_to_owner", "relayed_queue", "unavailable"]

#: The largest request body relayed (acks, gets: small JSON).
MAX_RELAYED_BODY: Final = 1 << 20

Handler = Callable[[Request, Response], Awaitable[None]]


def relayed_queue(node: ClusterNode, request: Request) -> str | None:
    """The name of the queue ``request`` is about when another node owns it and the
    request must go there; None otherwise."""
    if not request.path.startswith("/queues/") or FORWARDED_HEADER in request.headers:
        return None
    try:
        segments = split_path(request.path)
    except HTTPError:
        return None
    if len(segments) < 2 or segments[0] != "queues" or not segments[1]:
        return None
    if len(segments) == 2 and request.method not in ("GET", "HEAD"):
        return None  # declares and deletes: through etcd
    if len(segments) == 3 and segments[2] == "replicas":
        return None  # a change of a quorum queue's replicas: through etcd, on any node
    located = node.owner_of(segments[1])
    if located is None or located[0] == node.name:
        return None
    return segments[1]


def _answer_timeout(node: ClusterNode, request: Request) -> float:
    """How long the owner may take to begin its answer: a long-poll's own ``wait`` plus
    the time a node is given to answer at all (then it is counted hung: 503)."""
    try:
        wait_s = request.query.get_float("wait", 0.0, min_value=0.0)
    except HTTPError:
        wait_s = 0.0  # the owner refuses it, at once
    return wait_s + node.forwarder.answer_timeout_s


def unavailable(queue: str, owner: str, reason: str = "which is down") -> HTTPError:
    """``503 queue_unavailable``, with the ``Retry-After`` of every such refusal
    (``broker.api.errors``)."""
    code = "queue_unavailable"
    return HTTPError(
        f"queue {queue!r} is on node {owner!r}, {reason}; retry later",
        code=code,
        status=503,
        headers=retry_after(cluster_retry_after_s(code) or 0),
    )


async def relay_to_owner(node: ClusterNode, auth: Any, queue: str, request: Request, response: Response) -> None:
    """Authenticate ``request`` here, then relay it to ``queue``'s owner and stream the
    answer back."""
    release = await auth.guard(request) if auth is not None else None
    try:
        located = node.owner_of(queue)
        if located is None:
            raise HTTPError(f"no queue {queue!r}", code="not_found", status=404)
        owner, url = located
        if url is None:
            raise unavailable(queue, owner)
        body = await request.read_body(max_bytes=MAX_RELAYED_BODY)
        headers = [(k, v) for k, v in request.headers.items()]
        try:
            async with relay(
                url, request.method, request.target, headers, bytes(body), origin=node.name,
                ssl_context=node.config.peer_ssl, answer_timeout_s=_answer_timeout(node, request),
            ) as answer:
                content_type = next((v for k, v in answer.headers if k.lower() == "content-type"), None)
                extra = [(k, v) for k, v in answer.headers if k.lower() != "content-type"]
                await response.start(answer.status, content_type=content_type, headers=extra)
                async for chunk in answer.chunks():
                    await response.send(chunk)
                await response.end()
        except PeerUnreachable as exc:
            if response.started:
                raise
            raise unavailable(queue, owner, f"which cannot be reached ({exc})") from exc
    finally:
        if release is not None:
            release()

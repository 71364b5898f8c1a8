"""Cluster mode's ``POST /get``: one get over several queues, wherever their owners
are (docs/cluster.md).

When every queue is this node's, it is the single node's long poll. When some are
other nodes', the queues are grouped by owner, in the order the request lists them,
and each group is asked in turn without waiting (this core for its own, a relayed
``POST /get`` with ``wait: 0`` for the others, with the client's credentials): the
first group with messages answers. When none has any, the round is repeated every
:data:`ROUND_S` until ``wait`` runs out, so a message is found at most that late; no
get is ever left waiting on a node (a lease nobody would see). Preference holds
between the groups and within each; ``weights`` apply within each group only. Queues
whose owner is down are skipped (``503 queue_unavailable`` when all are).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson
import trio

from broker.api.rest.cluster_relay import unavailable
from broker.api.rest.fields import body_fields
from broker.api.rest.leases import GET_ANY_FIELDS, get_any_fields, poll_any
from broker.cluster import PeerUnreachable, relay
from broker.http import HTTPError, Request, Response
from broker.runtime import BrokerRuntime, CommandGateway

if TYPE_CHECKING:
    from broker.cluster import ClusterNode

__all__ = ["cluster_get_any"]

#: How often a get over several nodes' queues looks again while it may wait.
ROUND_S: Final = 0.2


async def cluster_get_any(node: ClusterNode, runtime: BrokerRuntime, request: Request, response: Response) -> None:
    runtime.check_ready()
    opts = runtime.options
    gateway = CommandGateway(runtime)
    f = await body_fields(request, GET_ANY_FIELDS)
    names, max_count, wait_s, lease, weights = get_any_fields(request, f, opts.max_wait_s, opts.default_lease_s)
    groups: dict[str, list[int]] = {}  # owner -> indexes into names, in order
    urls: dict[str, str | None] = {}
    for index, name in enumerate(names):
        located = node.owner_of(name) if isinstance(name, str) else None
        owner = located[0] if located is not None else node.name
        groups.setdefault(owner, []).append(index)
        urls[owner] = located[1] if located is not None else None
    if list(groups) == [node.name]:
        await response.send_json(200, await poll_any(gateway, request, names, max_count, wait_s, lease, weights))
        return
    live = {owner: ix for owner, ix in groups.items() if owner == node.name or urls[owner] is not None}
    if not live:
        first = names[0]
        raise unavailable(str(first), next(iter(groups)))
    deadline = trio.current_time() + wait_s
    while True:
        for owner, indexes in live.items():
            sub = [names[i] for i in indexes]
            sub_weights = [weights[i] for i in indexes] if isinstance(weights, list) and len(weights) == len(names) else weights
            body: dict[str, Any] | None
            if owner == node.name:
                body = await poll_any(gateway, request, sub, max_count, 0.0, lease, sub_weights)
            else:
                body = await _remote_get(node, urls[owner], request, sub, max_count, lease, sub_weights)
            if body is not None and body.get("messages"):
                await response.send_json(200, body)
                return
        if trio.current_time() >= deadline:
            await response.send_json(200, {"messages": []})
            return
        await trio.sleep(min(ROUND_S, max(0.0, deadline - trio.current_time())))


async def _remote_get(
    node: ClusterNode, url: str | None, request: Request, names: list[Any], max_count: int, lease: float, weights: Any
) -> dict[str, Any] | None:
    """An immediate ``POST /get`` on the owner of ``names``; None when it cannot be
    asked (down, unreachable, refused for want of its node). A refusal of the
    request itself (no such queue, no permission) is raised as the owner's error."""
    if url is None:
        return None
    payload: dict[str, Any] = {"queues": names, "max": max_count, "wait": 0, "lease": lease}
    if weights is not None:
        payload["weights"] = weights
    headers = [(k, v) for k, v in request.headers.items() if k == "authorization"]
    headers.append(("content-type", "application/json"))
    try:
        async with relay(
            url, "POST", "/get", headers, orjson.dumps(payload), origin=node.name, ssl_context=node.config.peer_ssl,
            answer_timeout_s=node.forwarder.answer_timeout_s,
        ) as answer:
            raw = b"".join([chunk async for chunk in answer.chunks()])
            status = answer.status
    except PeerUnreachable:
        return None
    body = orjson.loads(raw) if raw else {}
    if status == 200:
        return dict(body)
    if status >= 500:
        return None
    raise HTTPError(str(body.get("message", "refused by the queue's owner")), code=str(body.get("error", "error")), status=status)

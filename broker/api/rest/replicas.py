"""Replication between nodes (cluster mode, docs/cluster.md): the leader's answers to
its followers.

- ``POST /cluster/replicas/{name}/fetch`` ``{"node", "epoch", "offset", "wait_s"}``:
  the entries of quorum queue ``name``'s replicated log from ``offset`` (long-polled
  up to ``wait_s`` when there are none yet); the offset acknowledges every entry
  before it. ``409 stale_epoch`` when this node does not lead that epoch.
- ``POST /cluster/replicas/{name}/epoch-end`` ``{"epoch", "leader_epoch"}``: where the
  follower's last epoch ends in this leader's log (truncation by epoch).

And ``GET /queues/{name}`` in cluster mode: the queue as this node's core has it (or,
for a quorum queue this node does not lead, its definition), with ``replication``
for a quorum queue: leader, followers, in-sync set, epoch and each follower's lag.

Both are node-to-node calls, authenticated like every other route (the node's guard).
"""

from __future__ import annotations

from typing import Any

from broker.api.rest.fields import body_fields, check_query
from broker.cluster import ClusterNode, StaleEpoch, is_quorum
from broker.core import BrokerViews, NotFound, PreconditionFailed, Unavailable
from broker.http import Request, Response, Router

__all__ = ["add_replica_routes"]


def add_replica_routes(router: Router, node: ClusterNode, views: BrokerViews) -> None:
    """The routes above, on the cluster's router."""

    def replication() -> Any:
        if node.replication is None:
            raise Unavailable("this node has no data directory: it keeps no replicas", code="no_replicas")
        return node.replication

    async def fetch(request: Request, response: Response) -> None:
        check_query(request, frozenset())
        f = await body_fields(request, {"node", "epoch", "offset", "wait_s"})
        try:
            answer = await replication().fetch(request.path_params["name"], f.obj)
        except StaleEpoch as exc:
            raise PreconditionFailed(str(exc), code="stale_epoch") from None
        await response.send_json(200, answer)

    async def epoch_end(request: Request, response: Response) -> None:
        check_query(request, frozenset())
        f = await body_fields(request, {"epoch", "leader_epoch"})
        try:
            answer = replication().epoch_end(request.path_params["name"], f.obj)
        except StaleEpoch as exc:
            raise PreconditionFailed(str(exc), code="stale_epoch") from None
        await response.send_json(200, answer)

    async def get_queue(request: Request, response: Response) -> None:
        check_query(request, frozenset())
        name = request.path_params["name"]
        info = views.queue_info(name)
        d = node.view.get("queues", name)
        if d is not None and is_quorum(d):
            if info is None:
                info = {"name": name, "durable": d["durable"], "exclusive": False, "auto_delete": d["auto_delete"], "arguments": d["arguments"]}
            info["replication"] = node.replicated_queues().get(name)
        if info is None:
            raise NotFound(f"no queue {name!r}")
        await response.send_json(200, info)

    router.add("GET", "/queues/{name}", get_queue)
    router.add("POST", "/cluster/replicas/{name}/fetch", fetch)
    router.add("POST", "/cluster/replicas/{name}/epoch-end", epoch_end)

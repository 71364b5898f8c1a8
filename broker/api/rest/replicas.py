"""Replication between nodes (cluster mode, docs/cluster.md): the leader's answers to
its followers.

- ``POST /cluster/replicas/{name}/fetch`` ``{"node", "epoch", "offset", "wait_s"}``:
  the entries of quorum queue ``name``'s replicated log from ``offset`` (long-polled
  up to ``wait_s`` when there are none yet); the offset acknowledges every entry
  before it. ``409 stale_epoch`` when this node does not lead that epoch.
- ``POST /cluster/replicas/{name}/epoch-end`` ``{"epoch", "leader_epoch"}``: where the
  follower's last epoch ends in this leader's log (truncation by epoch).

And, for operators, ``POST /queues/{name}/replicas`` ``{"add": node}`` or ``{"remove":
node}`` (an administrator's call, on any node): a quorum queue's replica set changed
by one etcd transaction (``broker.cluster.replica_set``).

And ``GET /queues/{name}`` in cluster mode: the queue as this node's core has it (or,
for a quorum queue this node does not lead, its definition), with ``replication``
for a quorum queue: leader, followers, in-sync set, epoch and each follower's lag.

The two ``/cluster/replicas`` calls are node-to-node: only another node may make them. With a cluster secret
(``--cluster-secret``) that is a request carrying it (the guard checked it: a wrong
one is ``401``); a request authenticated as a user, administrator or not, is ``403
node_only``: replicas hand out every message of a queue and take no permission
check. Without a secret, only while the cluster has no users (the open loopback
broker, where every caller is let in).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.api.permissions import access_for
from broker.api.rest.cluster_etcd import etcd_errors
from broker.api.rest.fields import body_fields, check_query
from broker.cluster import SECRET_HEADER
from broker.core import (
    AccessRefused,
    BrokerViews,
    NotFound,
    PreconditionFailed,
    Unavailable,
)
from broker.http import Request, Response, Router

if TYPE_CHECKING:
    from broker.cluster import ClusterNode

__all__ = ["add_replica_routes"]


def add_replica_routes(router: Router, node: ClusterNode, views: BrokerViews) -> None:
    """The routes above, on the cluster's router."""
    # here: cluster mode's, not loaded on a single node
    from broker.cluster import StaleEpoch, is_replicated

    def replication() -> Any:
        if node.replication is None:
            raise Unavailable("this node has no data directory: it keeps no replicas", code="no_replicas")
        return node.replication

    def require_node(request: Request) -> None:
        """Only another node (see the module docstring); raises ``AccessRefused``."""
        if node.config.secret is not None:
            if request.headers.get(SECRET_HEADER) is not None:
                return  # the guard compared it with the secret
            raise AccessRefused(
                "only another node of the cluster may call the replica endpoints (with the cluster secret)",
                code="node_only",
            )
        if getattr(request, "principal", None) is not None:
            raise AccessRefused(
                "only another node of the cluster may call the replica endpoints: set --cluster-secret on every node",
                code="node_only",
            )

    async def fetch(request: Request, response: Response) -> None:
        require_node(request)
        check_query(request, frozenset())
        f = await body_fields(request, {"node", "epoch", "offset", "wait_s"})
        try:
            answer = await replication().fetch(request.path_params["name"], f.obj)
        except StaleEpoch as exc:
            raise PreconditionFailed(str(exc), code="stale_epoch") from None
        await response.send_json(200, answer)

    async def epoch_end(request: Request, response: Response) -> None:
        require_node(request)
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
        if d is not None and is_replicated(d):
            if info is None:
                info = {"name": name, "durable": d["durable"], "exclusive": False, "auto_delete": d["auto_delete"], "arguments": d["arguments"]}
            info["replication"] = node.replicated_queues().get(name)
        if info is None:
            raise NotFound(f"no queue {name!r}")
        await response.send_json(200, info)

    async def change_replicas(request: Request, response: Response) -> None:
        check_query(request, frozenset())
        access_for(request).require("administer")
        f = await body_fields(request, {"add", "remove"})
        answer = await node.change_replicas(request.path_params["name"], add=f.opt_str("add"), remove=f.opt_str("remove"))
        await response.send_json(200, answer)

    router.add("GET", "/queues/{name}", get_queue)
    router.add("POST", "/queues/{name}/replicas", etcd_errors(node, change_replicas, "replicas"))
    router.add("POST", "/cluster/replicas/{name}/fetch", fetch)
    router.add("POST", "/cluster/replicas/{name}/epoch-end", epoch_end)

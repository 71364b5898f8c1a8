"""This node's part in one quorum queue (:class:`QueueReplica`: its log, and its
leader's or follower's side), and how a quorum queue is shown (``GET /cluster``,
``GET /queues/{name}``: :func:`replica_status`)."""

from __future__ import annotations

from typing import Any

import trio

from broker.cluster.leader import in_sync_set, leader_of
from broker.cluster.replica_follower import FollowerState
from broker.cluster.replica_leader import LeaderSide
from broker.cluster.replica_log import ReplicaLog
from broker.cluster.replica_ops import LedQueue
from broker.cluster.view import ClusterView

__all__ = ["QueueReplica", "replica_status"]


class QueueReplica:
    """This node's part in one quorum queue."""

    def __init__(self, name: str, log_: ReplicaLog) -> None:
        self.name = name
        self.log = log_
        #: the create revision of the queue's definition key when this replica was
        #: opened: a later one is another queue of the same name (0: unknown)
        self.incarnation = 0
        self.leading: LeaderSide | None = None
        self.led: LedQueue | None = None
        self.follow_target: tuple[str, int] | None = None
        self.follow_scope: trio.CancelScope | None = None
        self.follower = FollowerState()
        self.refused = False
        #: the revision of this leader's in-sync set change (-1: in flight; 0: none)
        self.isr_change_pending = 0
        #: members being added: counted in the majority before etcd has them
        self.isr_adding: set[str] = set()


def replica_status(
    view: ClusterView, queue: str, d: dict[str, Any], replica: QueueReplica | None, me: str | None = None
) -> dict[str, Any]:
    """Quorum queue ``queue`` (definition ``d``) as this node (``me``) sees it: etcd's
    word (leader, epoch, in-sync set) and, with ``replica``, this node's copy. A
    leader key naming this node while it does not lead is shown as no leader (it is
    stale: ``ClusterNode.serving_node``)."""
    leader = leader_of(view, queue)
    if leader is not None and leader.node == me and (replica is None or replica.leading is None):
        leader = None
    isr, _rev = in_sync_set(view, queue)
    replicas = list(d.get("replicas", []))
    side = replica.leading if replica is not None else None
    info: dict[str, Any] = {
        "replicas": replicas,
        "leader": leader.node if leader else None,
        "epoch": leader.epoch if leader else None,
        "followers": [n for n in replicas if not leader or n != leader.node],
        "in_sync": sorted(isr),
        "lag": side.lag() if side is not None else None,
        "commit_offset": side.commit if side is not None else None,
        "refusing": bool(replica and replica.refused),
    }
    if replica is not None:
        info["local"] = {
            "role": "leader" if side is not None else ("follower" if replica.follow_target else "none"),
            "log_start": replica.log.first_offset,
            "log_end": replica.log.end_offset,
            "log_epoch": replica.log.last_epoch,
            "synced": replica.log.synced,
            "error": replica.follower.error,
            "truncated_entries": replica.follower.truncated,
        }
    return info

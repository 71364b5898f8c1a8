"""Who leads a quorum queue, in which epoch, with which in-sync set: decided in etcd by
transactions only.

Keys (``ClusterKeys.replica``):

- ``replicas/leaders/<queue>``: ``{"node", "url", "incarnation", "lease"}``, put **once** by the
  winner of an election, with the winner's membership lease: it vanishes when that
  lease lapses (the node died, hung or lost etcd). It is never modified, so its
  revision is its create revision: the leader's **epoch**, the etcd revision at which
  leadership was won. Epochs only grow, and every append, confirm and delivery of the
  queue is fenced by one.
- ``replicas/isr/<queue>``: ``{"isr": [node, ...]}``, the in-sync set: the replicas
  holding every confirmed entry. Written at declare (every replica), then only by the
  leader, in a transaction that also checks it still leads (the leader key's revision
  is its epoch) and that nobody changed the set since it read it.

An election (:func:`campaign`) succeeds only if there is no leader key and the
in-sync set is the one the candidate read, with the candidate in it; the epoch is the
revision of that transaction. A node whose lease is counted lost stops leading (the
lease is etcd's clock: ``Membership.alive_until``).
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

import orjson

from broker.cluster.etcd import EtcdClient
from broker.cluster.etcdproto import CompareCreate, CompareMod, OpPut
from broker.cluster.view import ClusterKeys, ClusterView, canonical

__all__ = [
    "NO_LEADER", "LeaderInfo", "campaign", "change_isr", "ever_led", "holds_majority", "in_sync_set", "leader_of",
    "majority",
]


#: the owner a node names for a quorum queue it knows no serving leader of (never a
#: node's name: the queue is not served here either)
NO_LEADER = "(no leader)"


@dataclass(frozen=True)
class LeaderInfo:
    node: str
    url: str
    incarnation: str
    #: the membership lease leadership was won with (it ends with that lease)
    lease: int
    epoch: int


def majority(replicas: int) -> int:
    return replicas // 2 + 1


def holds_majority(members: Sized, replicas: Sized) -> bool:
    """Whether ``members`` (a quorum queue's in-sync set, or the replicas answering its
    leader) are at least a majority of its ``replicas``: the one test of whether a
    leader may confirm, a change of the replica set is safe, publishes are taken."""
    return len(members) >= majority(len(replicas))


def leader_of(view: ClusterView, queue: str) -> LeaderInfo | None:
    """The queue's leader as this node's view has it (None: none)."""
    value = view.get("leaders", queue)
    if value is None:
        return None
    return LeaderInfo(
        str(value.get("node")),
        str(value.get("url")),
        str(value.get("incarnation")),
        int(value.get("lease") or 0),
        view.revision_of("leaders", queue),
    )


def in_sync_set(view: ClusterView, queue: str) -> tuple[list[str], int]:
    """(the in-sync set, the revision it was written at; 0: no key)."""
    value = view.get("isr", queue)
    if value is None:
        return [], 0
    return [str(n) for n in value.get("isr", [])], view.revision_of("isr", queue)


def ever_led(view: ClusterView, queue: str) -> bool:
    """Whether the queue ever had a leader (its log has entries somewhere)."""
    return bool((view.get("isr", queue) or {}).get("led"))


async def campaign(
    client: EtcdClient, keys: ClusterKeys, queue: str, record: dict[str, Any], lease: int, isr: list[str], isr_revision: int
) -> int | None:
    """Try to become the queue's leader: its epoch, or None when someone else leads or
    the in-sync set changed since it was read (``isr`` at ``isr_revision``). The same
    transaction marks the set as led once: from then on an empty replica log (a
    wiped data directory) is never a candidate."""
    leader_key = keys.replica("leaders", queue)
    isr_key = keys.replica("isr", queue)
    result = await client.txn(
        [CompareCreate(leader_key), CompareMod(isr_key, isr_revision)],
        [OpPut(leader_key, orjson.dumps(record), lease=lease), OpPut(isr_key, canonical({"isr": sorted(isr), "led": True}))],
    )
    return result.revision if result.succeeded else None


async def change_isr(
    client: EtcdClient, keys: ClusterKeys, queue: str, epoch: int, isr_revision: int, isr: list[str]
) -> int | None:
    """The leader of ``epoch`` sets the in-sync set; the revision written, or None when
    it no longer leads or the set changed meanwhile."""
    result = await client.txn(
        [CompareMod(keys.replica("leaders", queue), epoch), CompareMod(keys.replica("isr", queue), isr_revision)],
        [OpPut(keys.replica("isr", queue), canonical({"isr": sorted(isr), "led": True}))],
    )
    return result.revision if result.succeeded else None

"""Changing a quorum queue's replica set: ``POST /queues/{q}/replicas`` with ``{"add":
node}`` or ``{"remove": node}``, and a forgotten node leaving the sets it was in.

The replica set is the ``replicas`` list of the queue's definition
(``meta/queues/<queue>``), the in-sync set is ``replicas/isr/<queue>``
(``leader.py``). A change rewrites both in **one etcd transaction** that compares
both keys' revisions (and, when the leader is removed, the leader key's) with what
this node's view read: a change racing another, or the leader's own change of the
in-sync set, fails and is tried again from the fresh view.

- **Adding** a node puts it in the replica set only: it starts as a follower *out*
  of the in-sync set (its log is empty), fetches the leader's log from the start, and
  the leader adds it to the in-sync set once it has caught up (``Replication._tend``).
  Refused when the node is unknown (404), is not alive or already a replica (409).
  When the in-sync set is then smaller than a majority of the larger set (a second
  replica added to a one-replica queue), the leader holds confirms until the new
  member has caught up and joined it (``LeaderSide.advance``).
- **Removing** a node takes it out of both sets. Removing the leader also deletes the
  leader key in the same transaction: the leader steps down (its held confirms are
  nacked, publishers resend) and an in-sync member wins the next election at once.
  Refused for a node that is not a replica (404), for the last replica or the last
  in-sync member (409), and when the in-sync set would be left below a majority of
  the smaller set (409).

Every confirmed entry is on every in-sync member, and the new in-sync set is a subset
of the old one, so no change loses a confirmed message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from broker.cluster.etcd import EtcdClient
from broker.cluster.etcdproto import Compare, CompareMod, Op, OpDelete, OpPut
from broker.cluster.leader import holds_majority
from broker.cluster.view import ClusterKeys, ClusterView, canonical, is_replicated
from broker.core import InvalidArgument, NotFound, PreconditionFailed

__all__ = ["ATTEMPTS", "ReplicaChange", "change_replicas", "plan_change"]

#: How many times a change racing another is tried again from the fresh view.
ATTEMPTS = 5


@dataclass(frozen=True)
class ReplicaChange:
    """One change decided from one view: what to compare and what to write."""

    queue: str
    replicas: list[str]
    in_sync: list[str]
    removes_leader: bool
    compares: list[Compare]
    ops: list[Op]


def plan_change(
    keys: ClusterKeys, view: ClusterView, queue: str, *, add: str | None = None, remove: str | None = None, force: bool = False
) -> ReplicaChange:
    """The transaction that adds ``add`` or removes ``remove`` (exactly one) as
    ``view`` stands. ``force`` (a forgotten node leaving): no majority check, the
    node need not be alive. Raises InvalidArgument, NotFound, PreconditionFailed."""
    if (add is None) == (remove is None):
        raise InvalidArgument('give exactly one of "add" and "remove", a node name')
    node = add if add is not None else remove
    if not isinstance(node, str) or not node:
        raise InvalidArgument("the node must be a non-empty string (a node's name)")
    found = view.entries["queues"].get(queue)
    if found is None:
        raise NotFound(f"no queue {queue!r}")
    d, d_rev = found
    if not is_replicated(d):
        raise PreconditionFailed(
            f"queue {queue!r} is not a quorum queue: only x-queue-type quorum has replicas", code="not_replicated"
        )
    replicas = [str(n) for n in d.get("replicas", [])]
    isr_value = view.get("isr", queue) or {}
    isr = [str(n) for n in isr_value.get("isr", [])]
    isr_rev = view.revision_of("isr", queue)
    leader = view.get("leaders", queue)
    leader_node = str(leader.get("node")) if leader is not None else None
    if add is not None:
        if add not in view.entries["known"] and add not in view.live_nodes():
            raise NotFound(f"no node {add!r} in the cluster")
        if add in replicas:
            raise PreconditionFailed(f"node {add!r} is a replica of queue {queue!r} already", code="already_replica")
        if add not in view.live_nodes() and not force:
            raise PreconditionFailed(f"node {add!r} is down: add a live node", code="node_down")
        new_replicas = [*replicas, add]
        new_isr = list(isr)
    else:
        assert remove is not None
        if remove not in replicas:
            raise NotFound(f"node {remove!r} is not a replica of queue {queue!r}")
        if len(replicas) == 1:
            raise PreconditionFailed(
                f"node {remove!r} is the last replica of queue {queue!r}: delete the queue instead", code="last_replica"
            )
        new_replicas = [n for n in replicas if n != remove]
        new_isr = [n for n in isr if n != remove]
        if not new_isr:
            raise PreconditionFailed(
                f"node {remove!r} is the last in-sync replica of queue {queue!r}: only it holds every confirmed "
                "message; wait for another replica to catch up",
                code="last_in_sync",
            )
    if remove is not None and not force and not holds_majority(new_isr, new_replicas):
        raise PreconditionFailed(
            f"queue {queue!r} would have {len(new_isr)} in-sync replicas of {len(new_replicas)}, fewer than a "
            f"majority: wait until its lagging replicas ({', '.join(sorted(set(replicas) - set(isr))) or 'none'}) "
            "have caught up",
            code="not_enough_in_sync",
        )
    removes_leader = remove is not None and remove == leader_node
    definition = {**d, "replicas": new_replicas}
    if definition.get("owner") not in new_replicas:
        definition["owner"] = new_replicas[0]
    compares: list[Compare] = [CompareMod(keys.meta("queues", queue), d_rev), CompareMod(keys.replica("isr", queue), isr_rev)]
    ops: list[Op] = [
        OpPut(keys.meta("queues", queue), canonical(definition)),
        OpPut(keys.replica("isr", queue), canonical({**isr_value, "isr": sorted(new_isr)})),
    ]
    if removes_leader:
        compares.append(CompareMod(keys.replica("leaders", queue), view.revision_of("leaders", queue)))
        ops.append(OpDelete(keys.replica("leaders", queue)))
    return ReplicaChange(queue, new_replicas, sorted(new_isr), removes_leader, compares, ops)


async def change_replicas(
    client: EtcdClient,
    keys: ClusterKeys,
    view: ClusterView,
    queue: str,
    *,
    add: str | None = None,
    remove: str | None = None,
    wait_seen: Callable[[int], Awaitable[None]],
) -> dict[str, Any]:
    """Carry out one change (see the module docstring); the answer. A transaction
    that lost a race is planned again once the view has seen etcd's revision of that
    moment, at most :data:`ATTEMPTS` times (then 409 ``conflict``)."""
    for _attempt in range(ATTEMPTS):
        change = plan_change(keys, view, queue, add=add, remove=remove)
        result = await client.txn(change.compares, change.ops)
        await wait_seen(result.revision)  # read-your-writes, or the change that won
        if result.succeeded:
            return {
                "queue": queue,
                **({"added": add} if add is not None else {"removed": remove}),
                "replicas": change.replicas,
                "in_sync": change.in_sync,
                "leader_stepped_down": change.removes_leader,
                "revision": result.revision,
            }
    raise PreconditionFailed(
        f"the replicas of queue {queue!r} kept changing meanwhile: try again", code="conflict"
    )

"""A node gone for good: ``DELETE /cluster/nodes/{name}`` forgets it, and what each
node reports of its queues' depths so that the answer can say what was lost.

Every node puts ``/<cluster>/stats/<name>`` (no lease: it outlives the node) with the
ready and unacked messages of each queue it owns, at most every
:data:`REPORT_INTERVAL_S` and only when they changed. :func:`forget_node` refuses a
live node (``409 node_alive``); otherwise, in one etcd transaction that compares
every key it touches, it deletes the node's ``known`` record and its report and
either deletes each queue it owned with the bindings to it, or (``rehome``) puts it
back owned by a live node (balanced placement), empty: its messages were on the dead
node's disk. Quorum queues live on their other replicas: the same transaction takes
the node out of their replica and in-sync sets (``replica_set.plan_change``), except
where it is the last replica or the last in-sync member (only it held every confirmed
message: such a queue is left as it is and listed). The answer lists the queues and
the messages lost with them according to the node's last report (and when that was),
which is all anyone can know of a node that is gone.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import quote

import orjson
import trio

from broker.cluster.etcd import EtcdClient
from broker.cluster.etcdproto import Compare, CompareMod, EtcdError, Op, OpDelete, OpPut
from broker.cluster.replica_set import plan_change
from broker.cluster.view import ClusterKeys, ClusterView, canonical, is_replicated
from broker.core import BrokerViews, NotFound, PreconditionFailed

__all__ = ["REPORT_INTERVAL_S", "forget_node", "report_depths", "stats_key"]

#: How often a node may report its queues' depths.
REPORT_INTERVAL_S: Final = 5.0


def stats_key(keys: ClusterKeys, name: str) -> bytes:
    return keys.root + b"stats/" + quote(name, safe="").encode()


async def report_depths(client: EtcdClient, keys: ClusterKeys, node_name: str, views: BrokerViews) -> None:
    """Put this node's queue depths every :data:`REPORT_INTERVAL_S` when they changed
    (until cancelled; etcd failures are skipped: the next round tries again)."""
    last: dict[str, Any] | None = None
    while True:
        depths = {
            q["name"]: int(q.get("messages_ready", 0)) + int(q.get("messages_unacked", 0))
            for q in views.queue_infos()
            if not q.get("exclusive")
        }
        if depths != last:
            try:
                await client.put(stats_key(keys, node_name), canonical({"at": time.time(), "queues": depths}))
                last = depths
            except EtcdError:
                pass
        await trio.sleep(REPORT_INTERVAL_S)


async def forget_node(
    client: EtcdClient,
    keys: ClusterKeys,
    view: ClusterView,
    name: str,
    *,
    rehome: bool,
    wait_seen: Callable[[int], Awaitable[None]],
) -> dict[str, Any]:
    """Forget the dead node ``name`` (see the module docstring); the answer."""
    if name in view.live_nodes():
        raise PreconditionFailed(f"node {name!r} is alive: stop it first (only a node gone for good is forgotten)", code="node_alive")
    owned = {
        q: d
        for q, d in ((q, d) for q, (d, _r) in view.entries["queues"].items())
        if d.get("owner") == name and not is_replicated(d)  # a quorum queue lives on its other replicas
    }
    replicated = sorted(
        q for q, (d, _r) in view.entries["queues"].items() if is_replicated(d) and name in d.get("replicas", [])
    )
    known_rev = view.entries["known"].get(name)
    if known_rev is None and not owned and not replicated:
        raise NotFound(f"no node {name!r} in the cluster")
    _rev, report = await client.get(stats_key(keys, name))
    depths: dict[str, int] = {}
    reported_at = None
    if report is not None:
        data = orjson.loads(report.value)
        depths, reported_at = dict(data.get("queues", {})), data.get("at")
    compares: list[Compare] = []
    ops: list[Op] = []
    if known_rev is not None:
        compares.append(CompareMod(keys.known(name), known_rev[1]))
        ops.append(OpDelete(keys.known(name)))
    if report is not None:
        ops.append(OpDelete(report.key))
    counts = view.queue_counts()
    live = sorted(view.live_nodes())
    if rehome and owned and not live:
        raise PreconditionFailed("no live node to rehome the queues on")
    rehomed: dict[str, str] = {}
    for queue, d in sorted(owned.items()):
        key = keys.meta("queues", queue)
        compares.append(CompareMod(key, view.entries["queues"][queue][1]))
        if rehome:
            owner = min(live, key=lambda node: (counts.get(node, 0), node))
            counts[owner] = counts.get(owner, 0) + 1
            rehomed[queue] = owner
            ops.append(OpPut(key, canonical({**d, "owner": owner})))
        else:
            ops.append(OpDelete(key))
            ops.extend(OpDelete(keys.meta("bindings", digest)) for digest in view.bindings_touching("queues", queue))
    replica_sets: dict[str, list[str]] = {}
    kept: dict[str, str] = {}
    for queue in replicated:
        try:
            change = plan_change(keys, view, queue, remove=name, force=True)
        except PreconditionFailed as exc:
            kept[queue] = exc.message
            continue
        compares.extend(change.compares)
        ops.extend(change.ops)
        replica_sets[queue] = change.replicas
    result = await client.txn(list(compares), ops, [])
    if not result.succeeded:
        raise PreconditionFailed(f"node {name!r}'s queues changed meanwhile: try again")
    await wait_seen(result.revision)
    lost = {queue: depths.get(queue) for queue in sorted(owned)}
    return {
        "forgotten": name,
        "queues": sorted(owned),
        "rehomed": rehomed,
        "deleted": [] if rehome else sorted(owned),
        "messages_lost": sum(v for v in lost.values() if v is not None),
        "messages_lost_by_queue": lost,
        "reported_at": reported_at,
        "replica_sets": replica_sets,
        "replicas_kept": kept,
    }

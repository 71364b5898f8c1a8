"""A node's own part of the management API's lists, in a cluster (``--etcd``).

In a cluster every node's core may hold queues it does not serve: a quorum queue's
follower holds a replica, whose counts are not the queue's (its leader's are). The
node asked for a list (``cluster.py``) asks every live member for its part and
merges them, each queue once; so each member answers for the queues it serves only
(their owner's; a quorum queue's, its leader's), and the totals over those. On a
single node (no cluster port) every queue of the core is its own and these are the
core's views unchanged.
"""

from __future__ import annotations

from typing import Any

from broker.api.management.rates import queue_rates

__all__ = ["own_queue_names", "own_queue_totals", "serves_queue"]


def serves_queue(runtime: Any, name: str) -> bool:
    """Whether this node answers for queue ``name`` (always, on a single node): it
    owns or leads it, or the cluster does not know it (a queue only this core has)."""
    port = runtime.cluster
    if port is None:
        return True
    located = port.owner_of(name)
    return located is None or located[0] == port.node_name


def own_queue_names(ctx: Any) -> list[str]:
    """The names of the queues this node answers for, in declaration order
    (``ctx``: a ``ManagementContext``)."""
    names: list[str] = ctx.views.queue_names()
    if ctx.runtime.cluster is None:
        return names
    return [name for name in names if serves_queue(ctx.runtime, name)]


def own_queue_totals(ctx: Any) -> tuple[dict[str, int], dict[str, float]] | None:
    """In a cluster: (``messages``, ``messages_ready``, ``messages_unacked``,
    ``queues``) summed over the queues this node answers for, and the rates of the
    depths summed likewise; None on a single node (the core's totals are its own)."""
    if ctx.runtime.cluster is None:
        return None
    totals = {"messages": 0, "messages_ready": 0, "messages_unacked": 0, "queues": 0}
    rates = {"messages": 0.0, "messages_ready": 0.0, "messages_unacked": 0.0}
    history = ctx.runtime.history
    for name in own_queue_names(ctx):
        info = ctx.views.queue_info(name)
        if info is None:
            continue
        totals["queues"] += 1
        for key in ("messages", "messages_ready", "messages_unacked"):
            totals[key] += int(info[key])
        for key, value in queue_rates(history, name).items():
            if key in rates:
                rates[key] += value
    return totals, rates

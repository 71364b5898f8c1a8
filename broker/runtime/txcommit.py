"""A transaction's commit in cluster mode: :func:`commit_across_nodes`.

A transactional channel's publishes are held by the core until the commit
(``broker.core.transactions``). On a single node the commit applies them in one step.
In a cluster some of them may reach queues other nodes own; they are routed at the
commit, with this node's view of the cluster, and forwarded to those owners then.

What a commit guarantees (docs/cluster.md, "Transactions"):

- When a publish reaches a queue whose owner is down (or a quorum queue without a
  leader), the commit is refused (``queue_unavailable``) and **nothing** of the
  transaction is applied, here or elsewhere.
- Otherwise this node's part (its publishes and settles) is applied in one step, as on
  a single node, and each other owner is sent its publishes; once this node's part is
  durable and every publish is confirmed, each owner is sent the transaction's
  settles of deliveries relayed from its queues (held by the channel's relays,
  :class:`RelayedSettles`, and committed in one step there: a consumed message is
  never acked before what was published in its stead is kept); the commit answers
  once every owner has answered.
- A settle of a relayed delivery whose relay has ended (the owner was lost, or the
  consumer cancelled: the owner requeued it) refuses the commit likewise
  (``queue_unavailable``), nothing applied.
- An owner that refuses or fails between the routing and its answer leaves the commit
  **partial**: its publishes are nacked, the rest stays applied, and the commit answers
  ``tx_incomplete`` naming them. The relayed settles are then not sent at all (the
  channel ends with the error, and the owners requeue those deliveries); an owner
  lost while committing them may or may not have applied them. RabbitMQ's
  transactions are not atomic across queues either; ackbus says when it happened.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from broker.core import ChannelError
from broker.runtime.ports import ClusterPort
from broker.runtime.runtime import BrokerRuntime

__all__ = ["COMMIT_ANSWERS_WAIT_S", "RelayedSettles", "commit_across_nodes"]

#: The longest a commit waits for the owners' answers to its forwarded publishes
#: (the forwarding channel itself nacks one unanswered for the lease TTL, so this is
#: only a backstop).
COMMIT_ANSWERS_WAIT_S = 60.0


class RelayedSettles(Protocol):
    """A channel's settles of deliveries relayed from other nodes' queues that its
    transaction holds (``broker.api.channel.relayed.RelayedConsumers``)."""

    def held_count(self) -> int:
        """How many the transaction holds."""
        ...

    def check_held(self) -> None:
        """Raises ChannelError (``queue_unavailable``) when one can no longer be
        applied; called before anything of the commit is applied."""
        ...

    def rollback_held(self) -> int:
        """Forget them (the deliveries stay unacked on their owners); how many."""
        ...

    async def commit_held(self) -> list[str]:
        """Send them to their owners and wait for their commits: what failed (empty:
        all taken)."""
        ...


@dataclass(frozen=True)
class _Forward:
    """One transactional publish that reaches queues of other nodes: what each of its
    ``owners`` is sent at the commit, and the ``tag`` its confirm answers."""

    tag: int
    owners: list[str]
    exchange: str
    routing_key: str
    body: bytes
    properties: dict[str, Any] | None
    delay_s: float | None
    dedup: bool


def _plan(cluster: ClusterPort, channel_id: int, publishes: list[Any]) -> list[_Forward]:
    """The publishes that reach other nodes, with their owners. Raises ChannelError
    (``queue_unavailable``) when one reaches a queue no node can take now."""
    forwards: list[_Forward] = []
    for tag, exchange, routing_key, body, properties, _mandatory, delay_s, dedup in publishes:
        headers = properties.get("headers") if properties else None
        plan = cluster.plan(channel_id, exchange, routing_key, headers)
        if plan is None:
            continue
        if plan.refused:
            why = plan.refused.partition(": ")[2] or plan.refused
            raise ChannelError(f"transaction not committed, nothing of it applied: {why}", code="queue_unavailable")
        if plan.owners:
            forwards.append(_Forward(tag, list(plan.owners), exchange, routing_key, body, properties, delay_s, dedup))
    return forwards


async def commit_across_nodes(
    runtime: BrokerRuntime, cluster: ClusterPort, channel_id: int, relayed: RelayedSettles | None = None,
) -> int:
    """Commit ``channel_id``'s transaction, forwarding its publishes that reach other
    nodes and sending its ``relayed`` settles to their owners (see the module
    docstring); the number of operations."""
    core = runtime.core
    forwards = _plan(cluster, channel_id, core.tx_publishes(channel_id))
    relayed_count = relayed.held_count() if relayed is not None else 0
    if relayed is not None and relayed_count:
        relayed.check_held()
    before = core.last_lsn
    try:
        count = core.tx_commit(channel_id, {f.tag: len(f.owners) for f in forwards})
    finally:
        runtime.pump()
    waiting = sum(len(f.owners) for f in forwards)
    all_answered = trio.Event()
    failed: list[str] = []

    def answer(tag: int, owner: str) -> Callable[[bool, str | None], None]:
        def settle(ack: bool, reason: str | None) -> None:
            nonlocal waiting
            if not ack:
                failed.append(f"publish {tag} to node {owner!r}: {reason or 'nacked'}")
            waiting -= 1
            if waiting == 0:
                all_answered.set()
            try:
                core.settle_held_confirm(channel_id, tag, ack, reason)
            finally:
                runtime.pump()

        return settle

    for f in forwards:
        for owner in f.owners:
            cluster.send(
                owner, f.exchange, f.routing_key, f.body, f.properties, f.delay_s, answer(f.tag, owner), dedup=f.dedup
            )
    runtime.pump()
    if core.last_lsn > before:  # this node's part, durable
        await runtime.wait_durable(core.last_lsn)
    if waiting:
        with trio.move_on_after(COMMIT_ANSWERS_WAIT_S):
            await all_answered.wait()
        if waiting:
            failed.append(f"{waiting} forwarded publish(es) not answered within {COMMIT_ANSWERS_WAIT_S:g} s")
    if relayed is not None and relayed_count:
        # last, once every publish is durable where it went: a consumed message is
        # never acked before what the transaction published in its stead is kept
        if failed:
            relayed.rollback_held()
            failed.append(f"{relayed_count} settle(s) of relayed deliveries not sent (their owners requeue them)")
        else:
            failed.extend(await relayed.commit_held())
    if failed:
        raise ChannelError(
            "transaction committed only in part: this node's part is applied, but not all of its shares for "
            f"other nodes were taken: {'; '.join(failed[:5])}",
            code="tx_incomplete",
        )
    return count + relayed_count

"""Taps on the effect table: a layer above the runtime sees a kind of effect before
the runtime carries it out, at no cost to anyone while no tap is set.

Cluster mode's replicated queues tap ``AppendRecords``: the records of a replicated
queue are copied into its own replicated log (``broker.cluster``'s replica log) before
the node's WAL writes them, and the confirms of their publishes are held by the core
(``Broker.hold_confirms``) until a majority of the queue's replicas has them on disk.

Cluster mode also takes the dead letters the cluster must deliver
(``DeadLetterHeld``, :func:`take_held_dead_letters`): those that reach other nodes'
queues, or a quorum queue this node leads; they stay in their source queues (or, a
publish refused by a full ``reject-publish-dlx`` queue, in its unsent nack) until
taken, by the other node or by the quorum queue's majority; and the queues the broker deletes by itself
(``QueueAutoDeleted``, :func:`tap_auto_deleted_queues`), whose definitions etcd keeps.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.core import (
    AppendRecords,
    DeadLetterHeld,
    DeadLetterRoutes,
    QueueAutoDeleted,
)
from broker.runtime.runtime import BrokerRuntime

__all__ = ["tap_auto_deleted_queues", "tap_records", "take_held_dead_letters"]


def tap_records(runtime: BrokerRuntime, tap: Callable[[AppendRecords], None]) -> None:
    """``tap`` sees each batch of records the core produces before the log takes it."""
    append = runtime.effect_handlers[AppendRecords]

    def tapped(effect: AppendRecords) -> None:
        tap(effect)
        append(effect)

    runtime.effect_handlers[AppendRecords] = tapped


def take_held_dead_letters(
    runtime: BrokerRuntime,
    channel_id: int | None,
    handler: Callable[[DeadLetterHeld], None],
    routes: DeadLetterRoutes | None = None,
) -> None:
    """From now on a dead letter that routes to no queue of this node is held in its
    source queue, as a delivery of core channel ``channel_id``, and handed to
    ``handler``, which settles it (``Broker.settle_held_dead_letter``) once another
    node has taken it; so is one that reaches queues here and, ``routes`` says,
    other nodes' too (enqueued here at once), or a quorum queue this node leads
    (``routes.needs_majority``: its copy made once the cluster has it kept by a
    majority, ``Broker.copy_held_dead_letter``). None: such dead letters are dropped
    again (a single node's rule)."""
    runtime.effect_handlers[DeadLetterHeld] = handler
    runtime.core.hold_dead_letters(channel_id, routes)


def tap_auto_deleted_queues(runtime: BrokerRuntime, tap: Callable[[QueueAutoDeleted], None]) -> None:
    """``tap`` sees each queue the broker deleted by itself (auto-delete, x-expires)."""
    carry_out = runtime.effect_handlers[QueueAutoDeleted]

    def tapped(effect: QueueAutoDeleted) -> None:
        carry_out(effect)
        tap(effect)

    runtime.effect_handlers[QueueAutoDeleted] = tapped

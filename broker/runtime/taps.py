"""Taps on the effect table: a layer above the runtime sees a kind of effect before
the runtime carries it out, at no cost to anyone while no tap is set.

Cluster mode's replicated queues tap ``AppendRecords``: the records of a replicated
queue are copied into its own replicated log (``broker.cluster``'s replica log) before
the node's WAL writes them, and the confirms of their publishes are held by the core
(``Broker.hold_confirms``) until a majority of the queue's replicas has them on disk.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.core import AppendRecords
from broker.runtime.runtime import BrokerRuntime

__all__ = ["tap_records"]


def tap_records(runtime: BrokerRuntime, tap: Callable[[AppendRecords], None]) -> None:
    """``tap`` sees each batch of records the core produces before the log takes it."""
    append = runtime.effect_handlers[AppendRecords]

    def tapped(effect: AppendRecords) -> None:
        tap(effect)
        append(effect)

    runtime.effect_handlers[AppendRecords] = tapped

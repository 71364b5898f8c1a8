"""The broker-wide counts ``Broker.totals()`` reports, kept as they change.

``GET /overview`` (polled every 2 s by the management UI) and the metrics read these
counts; summing them over every queue and channel on each call cost ~30 ms at 10,000
queues. So the components that change a count change it here too, and a call costs
O(1): ready messages (a queue's lanes: whatever :meth:`~broker.core.entities.Queue.ready_count`
counts), those of them paged out (counted by each lane's index of paged-out messages,
``PagedRefs``, as it changes), unacked deliveries of live queues, and consumers.
Recovery, which builds queues in bulk, counts once at its end (:meth:`Totals.recount`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

__all__ = ["Totals"]


class _Counted(Protocol):
    unacked: int

    def ready_count(self) -> int: ...

    def paged_count(self) -> int: ...


class Totals:
    """Running counts (see the module docstring): ``ready``, ``paged`` (of them),
    ``unacked``, ``consumers``. Plain integers, changed in place by the queues
    (``Queue.totals``) and their lanes' paged-out indexes, the queue store and the
    deliveries."""

    __slots__ = ("ready", "paged", "unacked", "consumers")

    def __init__(self) -> None:
        self.ready = 0
        self.paged = 0
        self.unacked = 0
        self.consumers = 0

    def recount(self, queues: Iterable[_Counted]) -> None:
        """Count the messages of ``queues`` anew (after recovery built them in bulk)."""
        ready = paged = unacked = 0
        for queue in queues:
            ready += queue.ready_count()
            paged += queue.paged_count()
            unacked += queue.unacked
        self.ready = ready
        self.paged = paged
        self.unacked = unacked

"""The little mutable state the core's components truly share, as objects each is
handed in its constructor (not attributes everyone pokes on one broker object).

* :class:`Outbox`: the effects every component emits, collected by
  ``Broker.take_effects()``;
* :class:`Wakeups`: queues that may have work for consumers or parked long-polls,
  marked by whoever changed them (a publish, a settle, a timer) and drained once per
  ``take_effects()``;
* ``new_stats()``: the broker-wide message counters (``Broker.stats``), one dict
  shared by the components that count.
"""

from __future__ import annotations

from .effects import Effect
from .entities import Queue

__all__ = ["Outbox", "Wakeups", "new_stats"]


class Outbox:
    """The effects emitted since the last :meth:`take`, in order.

    ``emit`` and ``extend`` are the list's own methods: a component binds them once
    and calls them per message without another layer. :meth:`take` empties the same
    list (it is never replaced), so a bound ``emit`` stays valid."""

    __slots__ = ("_items", "emit", "extend")

    def __init__(self) -> None:
        self._items: list[Effect] = []
        self.emit = self._items.append
        self.extend = self._items.extend

    def __len__(self) -> int:
        return len(self._items)

    def take(self) -> list[Effect]:
        """Everything emitted so far, in order; the outbox is empty afterwards."""
        items = self._items
        out = items.copy()
        items.clear()
        return out


class Wakeups:
    """Queues to look at before effects leave: ``dispatch`` holds queues whose
    consumers may take messages now (a publish, a settle, credit or a consumer
    arrived); ``getters`` holds queues with parked long-polls that received
    messages. Both by name; the queue store and the deliveries add to them, the
    deliveries drain ``dispatch`` and the broker drains ``getters``."""

    __slots__ = ("dispatch", "getters")

    def __init__(self) -> None:
        self.dispatch: dict[str, Queue] = {}
        self.getters: dict[str, Queue] = {}


def new_stats() -> dict[str, int]:
    """The broker-wide message counters (``Broker.stats``), all zero."""
    return {
        "published": 0,
        "delivered": 0,
        "acked": 0,
        "confirmed": 0,
        "nacked": 0,
        "returned": 0,
        "deduplicated": 0,
    }

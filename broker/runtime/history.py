"""A short history of the broker's rates and depths, for the management UI's charts.

RabbitMQ's management plugin keeps the last minutes of message rates and queue
lengths, so a chart opened now already shows what happened before. :class:`RateHistory`
does the same, cheaply: every ``interval_s`` (5 s) it records the broker-wide counters
(published, delivered, acked, confirmed, nacked: the UI turns two samples into a rate),
the queued totals and the memory in use, and the depths and arrivals of each queue
(of at most ``max_queues`` of them, 500, to bound its memory: about 2 MiB then);
``size`` samples are kept (120: ten minutes). Read by ``GET /overview/history`` and ``GET /queues/{name}/history``.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import Any

import trio

from broker.core import BrokerViews
from broker.runtime.memory import MemoryMonitor

__all__ = ["BROKER_FIELDS", "QUEUE_FIELDS", "RateHistory"]

#: Broker-wide counters recorded in each sample (totals since start).
_STAT_FIELDS = ("published", "delivered", "acked", "confirmed", "nacked")
#: Every field of a broker-wide sample, besides its time ``t``.
BROKER_FIELDS = (*_STAT_FIELDS, "messages_ready", "messages_unacked", "memory_bytes")
#: Every field of a queue's sample (the names of ``QUEUE_COUNTERS``), besides ``t``.
QUEUE_FIELDS = ("messages_ready", "messages_unacked", "messages_delayed", "published")


class RateHistory:
    """The last ``size`` samples, one every ``interval_s`` seconds, in ring buffers of
    machine integers (a queue's ten minutes take ``size * 4 * 8`` bytes, 3.75 KiB):
    sample number ``n`` lives at ``n % size`` in every ring."""

    def __init__(
        self,
        views: BrokerViews,
        memory: MemoryMonitor,
        *,
        interval_s: float = 5.0,
        size: int = 120,
        max_queues: int = 500,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._views = views
        self._memory = memory
        self.interval_s = interval_s
        self.size = size
        self.max_queues = max_queues
        self._wall = wall_clock
        #: Samples taken since start (the next one's number).
        self.taken = 0
        self._times = array("d", bytes(8 * size))
        self._broker = array("q", bytes(8 * size * len(BROKER_FIELDS)))
        #: queue name -> (its ring, the number of its first sample)
        self._queues: dict[str, tuple[array[int], int]] = {}

    def sample(self) -> None:
        """Record one sample of the broker and of its queues."""
        views = self._views
        n = self.taken
        slot = n % self.size
        self._times[slot] = self._wall()
        stats = views.stats()
        totals = views.totals()
        values = (
            *(stats.get(name, 0) for name in _STAT_FIELDS),
            totals.get("messages_ready", 0),
            totals.get("messages_unacked", 0),
            self._memory.used,
        )
        width = len(BROKER_FIELDS)
        self._broker[slot * width : (slot + 1) * width] = array("q", values)
        columns = [views.queue_counters(name) for name in QUEUE_FIELDS]
        queues = self._queues
        for name in [name for name in queues if name not in columns[0]]:
            del queues[name]  # deleted
        width = len(QUEUE_FIELDS)
        for name in columns[0]:
            kept = queues.get(name)
            if kept is None:
                if len(queues) >= self.max_queues:
                    continue
                kept = queues[name] = (array("q", bytes(8 * self.size * width)), n)
            kept[0][slot * width : (slot + 1) * width] = array("q", [column.get(name, 0) for column in columns])
        self.taken = n + 1

    async def serve(self) -> None:
        """Sample every ``interval_s`` until cancelled."""
        while True:
            self.sample()
            await trio.sleep(self.interval_s)

    def broker_json(self) -> dict[str, Any]:
        """``GET /overview/history``."""
        return self._json(self._broker, 0, BROKER_FIELDS)

    def queue_json(self, name: str) -> dict[str, Any]:
        """``GET /queues/{name}/history`` (no samples: a queue past ``max_queues``, or
        declared since the last sample)."""
        kept = self._queues.get(name)
        if kept is None:
            return self._json(array("q"), self.taken, QUEUE_FIELDS)
        return self._json(kept[0], kept[1], QUEUE_FIELDS)

    def queue_samples(self, name: str) -> int:
        """How many samples of queue ``name`` are kept."""
        kept = self._queues.get(name)
        return 0 if kept is None else self.taken - max(kept[1], self.taken - self.size)

    def _json(self, ring: array[int], first: int, fields: tuple[str, ...]) -> dict[str, Any]:
        width = len(fields)
        samples = []
        for n in range(max(first, self.taken - self.size), self.taken):
            slot = n % self.size
            values = ring[slot * width : (slot + 1) * width]
            samples.append({"t": round(self._times[slot], 3), **dict(zip(fields, values))})
        return {"interval_s": self.interval_s, "now": round(self._wall(), 3), "samples": samples}

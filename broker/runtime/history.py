"""A short history of the broker's rates and depths, for the management UI's charts.

RabbitMQ's management plugin keeps the last minutes of message rates and queue
lengths, so a chart opened now already shows what happened before. :class:`RateHistory`
does the same, cheaply: every ``interval_s`` (5 s) it records the broker-wide counters
(published, delivered, acked, confirmed, nacked: the UI turns two samples into a rate),
the queued totals and the memory in use, and the depths and counters of each queue
(of at most ``max_queues`` of them, to bound its memory); ``size`` samples are kept
(120: ten minutes). Read by ``GET /overview/history`` and ``GET /queues/{name}/history``.
"""

from __future__ import annotations

import time
from collections import deque
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
QUEUE_FIELDS = ("messages_ready", "messages_unacked", "messages_delayed", "published", "delivered", "acked")


class RateHistory:
    """The last ``size`` samples, one every ``interval_s`` seconds."""

    def __init__(
        self,
        views: BrokerViews,
        memory: MemoryMonitor,
        *,
        interval_s: float = 5.0,
        size: int = 120,
        max_queues: int = 1000,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._views = views
        self._memory = memory
        self.interval_s = interval_s
        self.size = size
        self.max_queues = max_queues
        self._wall = wall_clock
        self.broker: deque[tuple[float, tuple[int, ...]]] = deque(maxlen=size)
        self.queues: dict[str, deque[tuple[float, tuple[int, ...]]]] = {}

    def sample(self) -> None:
        """Record one sample of the broker and of its queues."""
        views = self._views
        now = self._wall()
        stats = views.stats()
        totals = views.totals()
        self.broker.append(
            (
                now,
                (
                    *(stats.get(name, 0) for name in _STAT_FIELDS),
                    totals.get("messages_ready", 0),
                    totals.get("messages_unacked", 0),
                    self._memory.used,
                ),
            )
        )
        columns = [views.queue_counters(name) for name in QUEUE_FIELDS]
        queues = self.queues
        for name in list(queues):
            if name not in columns[0]:
                del queues[name]  # deleted
        for name in columns[0]:
            series = queues.get(name)
            if series is None:
                if len(queues) >= self.max_queues:
                    continue
                series = queues[name] = deque(maxlen=self.size)
            series.append((now, tuple(column.get(name, 0) for column in columns)))

    async def serve(self) -> None:
        """Sample every ``interval_s`` until cancelled."""
        while True:
            self.sample()
            await trio.sleep(self.interval_s)

    def broker_json(self) -> dict[str, Any]:
        """``GET /overview/history``."""
        return self._json(self.broker, BROKER_FIELDS)

    def queue_json(self, name: str) -> dict[str, Any]:
        """``GET /queues/{name}/history`` (no samples: a queue past ``max_queues``, or
        declared since the last sample)."""
        return self._json(self.queues.get(name, ()), QUEUE_FIELDS)

    def _json(self, series: Any, fields: tuple[str, ...]) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "now": round(self._wall(), 3),
            "samples": [{"t": round(t, 3), **dict(zip(fields, values))} for t, values in series],
        }

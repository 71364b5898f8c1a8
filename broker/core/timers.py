"""Time and confirms: deadlines, advancing the clock, and releasing publisher confirms.

``advance()`` expires ack timeouts and leases whose deadline passed and wakes queues
whose timer is due (delays.py); confirms wait
for the LSN of their message's record and are released, coalesced per channel, once
``durable()`` reports it on disk.

The methods here belong to :class:`~broker.core.broker.Broker`; they share its state
(:class:`~broker.core.state.BrokerState`).
"""

from __future__ import annotations

import heapq

from .coordstate import COORD_TIMER
from .delays import QUEUE_TIMER
from .effects import (
    Confirm,
    DeliveryExpired,
)
from .state import (
    _EXPIRED_MEMORY,
    BrokerState,
)

__all__ = ["TimersMixin"]




class TimersMixin(BrokerState):
    """Time and confirms (see the module docstring)."""

    def next_deadline(self) -> float | None:
        """When :meth:`advance` next has work to do (None: no timer pending)."""
        timers = self._timers
        while timers:
            deadline, channel_id, tag = timers[0]
            if channel_id == QUEUE_TIMER:
                queue = self._queues_by_id.get(tag)
                if queue is None or queue.wake_at != deadline:
                    heapq.heappop(timers)
                    continue
                return deadline
            if channel_id == COORD_TIMER:
                if self.coord.wake_at != deadline:
                    heapq.heappop(timers)
                    continue
                return deadline
            ch = self.channels.get(channel_id)
            d = ch.deliveries.get(tag) if ch is not None else None
            if d is None or d.deadline != deadline:
                heapq.heappop(timers)
                continue
            return deadline
        return None

    def earliest_timer(self) -> float | None:
        """The earliest scheduled deadline, possibly stale (cheap; for wake-ups)."""
        return self._timers[0][0] if self._timers else None

    def advance(self) -> None:
        """Time passed: deliveries and leases past their deadline go back to their queue."""
        now = self.clock()
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, channel_id, tag = heapq.heappop(timers)
            if channel_id == QUEUE_TIMER:
                # a queue's delays, expiries or read retry (see delays.py)
                queue = self._queues_by_id.get(tag)
                if queue is not None and queue.wake_at == deadline and not queue.deleted:
                    self._wake_queue(queue, now)
                continue
            if channel_id == COORD_TIMER:
                # locks expiring, lock waits running out, schedules due (locks.py)
                if self.coord.wake_at == deadline:
                    self._wake_coordination(now)
                continue
            ch = self.channels.get(channel_id)
            d = ch.deliveries.get(tag) if ch is not None else None
            if ch is None or d is None or d.deadline != deadline:
                continue
            self._requeue_deliveries(ch, [d])
            consumer = d.consumer
            if consumer is not None:
                ch.expired[tag] = None
                if len(ch.expired) > _EXPIRED_MEMORY:
                    del ch.expired[next(iter(ch.expired))]
                if consumer.lease_s is None:
                    self._effects.append(DeliveryExpired(ch.id, consumer.tag, tag))

    def _release_confirms(self) -> None:
        durable = self.durable_lsn
        for ch in self._confirm_dirty.values():
            stats = self.stats
            for tag, multiple, ack, reason in ch.confirms.release(durable):
                held = ch.confirms.take_returns(tag)
                if held:
                    self._effects.extend(held)  # type: ignore[arg-type]
                self._effects.append(Confirm(ch.id, tag, multiple, ack, reason))
                answered = tag - ch.last_released_tag if multiple else 1
                ch.last_released_tag = tag
                stats["confirmed" if ack else "nacked"] += answered
        self._confirm_dirty.clear()


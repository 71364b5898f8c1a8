"""Settling deliveries: ack, nack, reject, touch, requeue, and ack-timeout deadlines.

A delivery is settled by tag (or every tag up to one with ``multiple``); a requeued
message returns to its original place in its queue, marked redelivered. Each unacked
delivery has a deadline on the timer heap (its ack timeout or lease).

The methods here belong to :class:`~broker.core.broker.Broker`; they share its state
(:class:`~broker.core.state.BrokerState`).
"""

from __future__ import annotations

import heapq

from .entities import Channel, Delivery
from .errors import (
    ChannelError,
    InvalidArgument,
)
from .state import (
    _TIMERS_COMPACT_MIN,
    REST_CHANNEL,
    BrokerState,
)

__all__ = ["SettlingMixin"]


class SettlingMixin(BrokerState):
    """Settling deliveries (see the module docstring)."""

    def ack(self, channel_id: int, delivery_tag: int, multiple: bool = False) -> int:
        """Acknowledge one delivery (or every one up to the tag); return how many.
        Raises ChannelError for an unknown or expired tag (the channel must close)."""
        ch = self._channel(channel_id)
        if ch.tx is not None:
            self._tx_settle(ch, "ack", delivery_tag, multiple, False, None)
            return 0
        deliveries = self._take_deliveries(ch, delivery_tag, multiple)
        for d in deliveries:
            self._finish_delivery(ch, d)
            d.queue.acked += 1
            self._settle_entry(d.queue, d.entry)
        self.stats["acked"] += len(deliveries)
        return len(deliveries)

    def nack(
        self,
        channel_id: int,
        delivery_tag: int,
        multiple: bool = False,
        requeue: bool = True,
        *,
        delay_s: float | None = None,
    ) -> int:
        """Reject one delivery (or every one up to the tag): requeue it in its original
        position (after ``delay_s``, if given: validated with ``check_delay``), or
        dead-letter it (reason ``rejected``; dropped without a dead-letter exchange).
        A requeued message past its queue's ``x-delivery-limit`` is dead-lettered
        instead. Raises ChannelError for an unknown or expired tag, InvalidArgument for
        a delay without requeue (nothing is settled then)."""
        ch = self._channel(channel_id)
        if delay_s is not None and not requeue:
            raise InvalidArgument("a delay needs requeue: a message not requeued does not come back")
        if ch.tx is not None:
            self._tx_settle(ch, "nack", delivery_tag, multiple, requeue, delay_s)
            return 0
        deliveries = self._take_deliveries(ch, delivery_tag, multiple)
        if requeue:
            self._requeue_deliveries(ch, deliveries, taken=True, delay_s=delay_s)
        else:
            for d in deliveries:
                self._finish_delivery(ch, d)
                self._dead_letter(d.queue, d.entry, "rejected")
        return len(deliveries)

    def reject(self, channel_id: int, delivery_tag: int, requeue: bool = True, *, delay_s: float | None = None) -> int:
        return self.nack(channel_id, delivery_tag, False, requeue, delay_s=delay_s)

    def touch(self, channel_id: int, delivery_tag: int) -> None:
        """Reset the ack timeout of a delivery still being worked on.
        Raises ChannelError for an unknown or expired tag."""
        ch = self._channel(channel_id)
        d = self._lookup_delivery(ch, delivery_tag)
        assert d.consumer is not None or ch.id == REST_CHANNEL
        timeout = d.consumer.ack_timeout_s if d.consumer is not None else self.default_lease_s
        self._reset_deadline(ch, d, self.clock() + timeout)

    def _reset_deadline(self, ch: Channel, d: Delivery, deadline: float) -> None:
        d.deadline = deadline
        self._push_timer(deadline, ch.id, d.tag)

    def _push_timer(self, deadline: float, channel_id: int, tag: int) -> None:
        """Schedule a deadline. Settled or touched deliveries leave stale entries
        behind (skipped when popped); once stale ones could dominate, the heap is
        rebuilt from the live deliveries, so its size follows the unacked count
        rather than delivery rate x ack timeout (amortised O(1) per push)."""
        timers = self._timers
        heapq.heappush(timers, (deadline, channel_id, tag))
        if len(timers) >= self._timers_compact_at:
            live = [
                (d.deadline, ch.id, d.tag)
                for ch in self.channels.values()
                for d in ch.deliveries.values()
                if d.deadline is not None
            ]
            heapq.heapify(live)
            self._timers = live
            self._timers_compact_at = max(_TIMERS_COMPACT_MIN, 2 * len(live))

    def _lookup_delivery(self, ch: Channel, tag: int) -> Delivery:
        if not isinstance(tag, int) or isinstance(tag, bool):
            raise ChannelError("delivery_tag must be an integer", code="invalid_argument")
        d = ch.deliveries.get(tag)
        if d is None:
            if tag in ch.expired:
                raise ChannelError(
                    f"delivery tag {tag} expired (not acked within its ack timeout) and went back to its queue",
                    code="delivery_expired",
                )
            raise ChannelError(f"unknown delivery tag {tag}", code="unknown_delivery_tag")
        return d

    def _take_deliveries(self, ch: Channel, tag: int, multiple: bool) -> list[Delivery]:
        """Remove and return the deliveries an ack/nack names (validated first, so a bad
        tag changes nothing)."""
        if multiple:
            if not isinstance(tag, int) or isinstance(tag, bool):
                raise ChannelError("delivery_tag must be an integer", code="invalid_argument")
            if tag != 0:
                self._lookup_delivery(ch, tag)
            taken = []
            for t in ch.deliveries:
                if tag and t > tag:
                    break
                taken.append(t)
            return [ch.deliveries.pop(t) for t in taken]
        d = self._lookup_delivery(ch, tag)
        del ch.deliveries[tag]
        return [d]

    def _finish_delivery(self, ch: Channel, d: Delivery) -> None:
        """Bookkeeping common to every end of a delivery (already removed from ch)."""
        ch.unacked -= 1
        queue = d.queue
        if not queue.deleted:
            queue.unacked -= 1
        consumer = d.consumer
        if consumer is not None:
            consumer.unacked -= 1
            if consumer is queue.handing_over and not consumer.unacked:
                self._hand_over(queue)
            if not queue.deleted and consumer.channel.consumers.get(consumer.tag) is consumer:
                self._dirty_queues[queue.name] = queue
        if ch.prefetch:
            for c in ch.consumers.values():
                self._dirty_queues[c.queue.name] = c.queue

    def _requeue_deliveries(
        self, ch: Channel, deliveries: list[Delivery], *, taken: bool = False, delay_s: float | None = None
    ) -> None:
        """Deliveries that failed (nack, expiry, their channel ended) go back to their
        queue's original place, after ``delay_s`` if given; a message delivered more
        often than its queue's ``x-delivery-limit`` is dead-lettered instead."""
        due = self.wall_clock() + delay_s if delay_s else None
        for d in deliveries:
            if not taken:
                ch.deliveries.pop(d.tag, None)
            self._finish_delivery(ch, d)
            queue = d.queue
            if queue.deleted:
                continue
            entry = d.entry
            if queue.delivery_limit is not None and entry.deliveries > queue.delivery_limit:
                self._dead_letter(queue, entry, "delivery_limit")
                continue
            if due is not None:
                self._delay_return(queue, entry, due)
                continue
            queue.requeue(entry)
            if queue.consumers:
                self._dirty_queues[queue.name] = queue
            if queue.getters:
                self._getter_checks[queue.name] = queue


"""Delivery: channels, consumers, prefetch and credit, and handing messages out.

Opens and closes channels (a closed channel's unacked deliveries return to their
queues), registers and cancels consumers, and dispatches ready messages to consumers
within their prefetch and the channel's byte credit.

The methods here belong to :class:`~broker.core.broker.Broker`; they share its state
(:class:`~broker.core.state.BrokerState`).
"""

from __future__ import annotations

from .effects import (
    ConsumerActive,
    Deliver,
)
from .entities import Channel, Consumer, Delivery, Queue
from .errors import (
    AccessRefused,
    ChannelError,
    InvalidArgument,
    NotFound,
)
from .message import Entry
from .state import (
    REST_CHANNEL,
    BrokerState,
    delivery_cost,
)

__all__ = ["DeliveryMixin"]


#: Longest ack timeout a consume may ask for (RabbitMQ's consumer_timeout is a
#: 32-bit ms value: about 24.8 days).
MAX_ACK_TIMEOUT_S = ((1 << 31) - 1) / 1000.0


def check_prefetch(prefetch: object, maximum: int) -> None:
    """The one prefetch rule (a consume's and a ``qos``'s): an integer 0..``maximum``
    (0: no limit). Raises InvalidArgument."""
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 0 <= prefetch <= maximum:
        raise InvalidArgument(f"prefetch must be an integer 0..{maximum}")


class DeliveryMixin(BrokerState):
    """Delivery (see the module docstring)."""

    def open_channel(self) -> int:
        """Open a channel; return its id."""
        channel_id = self._next_channel
        self._next_channel += 1
        self.channels[channel_id] = Channel(channel_id, self.channel_credit_bytes)
        return channel_id

    def close_channel(self, channel_id: int, reason: str = "channel closed") -> None:
        """End a channel, however it ended: requeue its unacked deliveries (marked
        redelivered), cancel its consumers, delete its exclusive queues, and drop the
        confirms still pending (nobody is left to receive them; messages already
        routed stay, and a client resend is caught by deduplication). Idempotent."""
        ch = self.channels.get(channel_id)
        if ch is None or channel_id == REST_CHANNEL:
            return
        ch.closed = True
        for consumer in list(ch.consumers.values()):
            self._remove_consumer(consumer)
        self._requeue_deliveries(ch, list(ch.deliveries.values()))
        for qname in list(ch.exclusive_queues):
            queue = self.queues.get(qname)
            if queue is not None:
                self._delete_queue(queue, "exclusive queue owner closed")
        del self.channels[channel_id]
        self._confirm_dirty.pop(channel_id, None)

    def grant_credit(self, channel_id: int, nbytes: int) -> None:
        """The IO layer drained ``nbytes`` of this channel's output: deliveries may resume."""
        ch = self.channels.get(channel_id)
        if ch is None:
            return
        was_blocked = ch.credit <= 0
        ch.credit = min(ch.credit + nbytes, self.channel_credit_bytes)
        if was_blocked and ch.credit > 0:
            for consumer in ch.consumers.values():
                self._dirty_queues[consumer.queue.name] = consumer.queue

    def _channel(self, channel_id: int) -> Channel:
        ch = self.channels.get(channel_id)
        if ch is None:
            raise ChannelError(f"channel {channel_id} is not open")
        return ch

    def consume(
        self,
        channel_id: int,
        queue_name: str,
        *,
        consumer_tag: str = "",
        prefetch: int | None = None,
        no_ack: bool = False,
        exclusive: bool = False,
        ack_timeout_s: float | None = None,
        lease_s: float | None = None,
    ) -> str:
        """Start a consumer; return its tag.

        ``lease_s`` makes a lease-mode consumer (the streaming endpoint with
        ``ack=lease``): each delivery carries a lease id settled through the REST
        lease calls and returns to the queue after ``lease_s``.
        Raises NotFound, ResourceLocked, AccessRefused (exclusivity), ChannelError
        (tag in use), InvalidArgument.
        """
        ch = self._channel(channel_id)
        queue = self._queue(queue_name, channel_id)
        if prefetch is None:
            prefetch = ch.default_prefetch
        check_prefetch(prefetch, self.max_prefetch)
        if not consumer_tag:
            consumer_tag = f"ctag-{self.boot_id}-{self._next_consumer}"
            self._next_consumer += 1
        if consumer_tag in ch.consumers:
            raise ChannelError(f"consumer tag {consumer_tag!r} is already in use on this channel", code="not_allowed")
        if queue.exclusive_consumer:
            raise AccessRefused(f"queue {queue_name!r} has an exclusive consumer")
        if exclusive and queue.consumers:
            raise AccessRefused(f"queue {queue_name!r} already has consumers; cannot consume exclusively")
        if ack_timeout_s is not None and not 0 < ack_timeout_s <= MAX_ACK_TIMEOUT_S:
            # 0 or less expired every delivery at once: a storm of redeliveries
            raise InvalidArgument(
                f"ack timeout must be more than 0 and at most {MAX_ACK_TIMEOUT_S:g} s"
            )
        if ack_timeout_s is None:
            ack_timeout_s = queue.consumer_timeout_s or self.consumer_timeout_s
        if lease_s is not None:
            ack_timeout_s = lease_s
        consumer = Consumer(consumer_tag, ch, queue, no_ack, prefetch, exclusive, ack_timeout_s, lease_s)
        ch.consumers[consumer_tag] = consumer
        queue.consumers.append(consumer)
        queue.had_consumer = True
        queue.exclusive_consumer = exclusive
        self._dirty_queues[queue.name] = queue
        self._touch_queue(queue)
        return consumer_tag

    def cancel(self, channel_id: int, consumer_tag: str) -> None:
        """Stop a consumer. Its unacked deliveries stay with the channel until settled.
        Raises NotFound if the tag is unknown, ChannelError if the channel is not open."""
        ch = self._channel(channel_id)
        consumer = ch.consumers.get(consumer_tag)
        if consumer is None:
            raise NotFound(f"no consumer {consumer_tag!r} on this channel")
        self._remove_consumer(consumer)

    def consumer_active(self, channel_id: int, consumer_tag: str) -> bool:
        """Whether this consumer receives deliveries (false: a standby of a
        single-active-consumer queue). Raises ChannelError, NotFound."""
        consumer = self._channel(channel_id).consumers.get(consumer_tag)
        if consumer is None:
            raise NotFound(f"no consumer {consumer_tag!r} on this channel")
        queue = consumer.queue
        return not queue.single_active or (queue.consumers[0] is consumer and queue.handing_over is None)

    def _remove_consumer(self, consumer: Consumer, *, auto_delete: bool = True) -> None:
        ch = consumer.channel
        ch.consumers.pop(consumer.tag, None)
        queue = consumer.queue
        if consumer in queue.consumers:
            was_active = queue.single_active and queue.consumers[0] is consumer and queue.handing_over is None
            queue.consumers.remove(consumer)
            if was_active and not queue.deleted:
                if consumer.unacked:
                    queue.handing_over = consumer  # the next takes over once they are back
                else:
                    self._hand_over(queue)
            if consumer.exclusive:
                queue.exclusive_consumer = False
            if queue.rr >= len(queue.consumers):
                queue.rr = 0
        if auto_delete and queue.auto_delete and queue.had_consumer and not queue.consumers and not queue.deleted:
            self._delete_queue(queue, "auto-delete queue lost its last consumer")
        elif queue.consumers:
            self._dirty_queues[queue.name] = queue
        elif not queue.deleted:
            self._touch_queue(queue)  # unused from now on

    def _hand_over(self, queue: Queue) -> None:
        """A single-active-consumer queue's active consumer is gone and its deliveries
        settled: the next consumer, if any, becomes the active one."""
        queue.handing_over = None
        if queue.consumers:
            successor = queue.consumers[0]
            self._effects.append(ConsumerActive(successor.channel.id, successor.tag))
            self._dirty_queues[queue.name] = queue

    def qos(self, channel_id: int, prefetch: int, global_: bool = False) -> None:
        """basic.qos: a channel-wide limit (``global_``) or the default per-consumer one."""
        ch = self._channel(channel_id)
        check_prefetch(prefetch, self.max_prefetch)
        if global_:
            ch.prefetch = prefetch
            for consumer in ch.consumers.values():
                self._dirty_queues[consumer.queue.name] = consumer.queue
        else:
            ch.default_prefetch = prefetch

    def _dispatch_dirty(self) -> None:
        dirty = self._dirty_queues
        while dirty:
            _name, queue = dirty.popitem()
            self._dispatch(queue)

    def _dispatch(self, queue: Queue) -> None:
        if not self.delivering:
            return
        consumers = queue.consumers
        while consumers and queue.has_ready():
            chosen = None
            if queue.single_active:  # only the first registered consumer receives
                if queue.handing_over is None and consumers[0].can_take():
                    chosen = consumers[0]
            else:
                n = len(consumers)
                start = queue.rr
                for k in range(n):
                    idx = (start + k) % n
                    c = consumers[idx]
                    if c.can_take():
                        chosen = c
                        queue.rr = (idx + 1) % n
                        break
            if chosen is None:
                return
            entry = self._pop_live(queue)
            if entry is None:
                return
            self._deliver(chosen, queue, entry)

    def _deliver(self, consumer: Consumer, queue: Queue, entry: Entry) -> None:
        ch = consumer.channel
        tag = ch.next_tag
        ch.next_tag += 1
        message = entry.message
        count = entry.deliveries
        queue.delivered += 1
        self.stats["delivered"] += 1
        if count:
            queue.redelivered += 1
        ch.credit -= delivery_cost(message.body)
        lease_id = None
        if consumer.no_ack:
            queue.acked += 1
            self._settle_entry(queue, entry)
        else:
            self._count_delivery(queue, entry)
            deadline = self.clock() + consumer.ack_timeout_s
            ch.deliveries[tag] = Delivery(tag, entry, queue, consumer, deadline)
            self._push_timer(deadline, ch.id, tag)
            consumer.unacked += 1
            ch.unacked += 1
            queue.unacked += 1
            if consumer.lease_s is not None:
                lease_id = self._lease_id(ch.id, tag)
        self._effects.append(Deliver(ch.id, consumer.tag, tag, count > 0, message, lease_id, count))

    def _count_delivery(self, queue: Queue, entry: Entry) -> None:
        """One more delivery of ``entry`` that may come back: count it, and log the
        count (lazily: a delivery does not wait for its mark to be written). The first
        delivery is a DELIVERED mark; later ones, rarer, log the count itself."""
        entry.deliveries += 1
        message = entry.message
        if queue.persistent_log and message.persistent:
            if entry.deliveries == 1:
                self._delivered_marks.setdefault(queue.qid, []).append(message.seq)
            else:
                self._count_marks.setdefault(queue.qid, []).append((message.seq, entry.deliveries))


"""Deliveries: channels, consumers, handing messages out, and settling them.

Opens and closes channels (a closed channel's unacked deliveries return to their
queues), registers and cancels consumers, and dispatches ready messages to consumers
within their prefetch and the channel's byte credit. A delivery is settled by tag (or
every tag up to one with ``multiple``): acked, or nacked back to its original place in
its queue (marked redelivered) or to the dead letters. Each unacked delivery has a
deadline on the broker's timer heap (its ack timeout or lease); a transactional
channel's settles are held until its commit (transactions.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from .config import CoreConfig
from .connections import Connections, remove_exclusive
from .constants import _EXPIRED_MEMORY, REST_CHANNEL, delivery_cost
from .consumerorder import add_consumer, check_consumer_priority, choose_by_priority
from .consumertags import ConsumerTags
from .deadletter import DeadLetters
from .delays import Delays
from .effects import ConsumerActive, ConsumerCancelled, Deliver, DeliveryExpired
from .entities import MAX_TX_OPS, ChannelState, Consumer, Delivery, Queue
from .errors import AccessRefused, ChannelError, InvalidArgument, NotFound
from .log import MessageLog
from .message import Entry
from .queues import QueueStore
from .shared import Outbox, Wakeups
from .timers import TimerHeap

__all__ = ["Deliveries", "lease_id", "MAX_ACK_TIMEOUT_S"]


#: Longest ack timeout a consume may ask for (RabbitMQ's consumer_timeout is a
#: 32-bit ms value: about 24.8 days).
MAX_ACK_TIMEOUT_S = ((1 << 31) - 1) / 1000.0


def check_prefetch(prefetch: object, maximum: int) -> int:
    """The one prefetch rule (a consume's and a ``qos``'s): an integer 0..``maximum``
    (0: no limit). Raises InvalidArgument."""
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 0 <= prefetch <= maximum:
        raise InvalidArgument(f"prefetch must be an integer 0..{maximum}")
    return prefetch


def lease_id(boot_id: str, channel_id: int, tag: int) -> str:
    """The id of the lease that delivery ``tag`` of ``channel_id`` is (see leases.py)."""
    return f"{boot_id}-{channel_id}-{tag}"


class Deliveries:
    """Channels, consumers, unacked deliveries and their deadlines (see the module
    docstring). Owns ``channels`` (channel 0 is the REST API's, always open)."""

    def __init__(
        self,
        queues: QueueStore,
        delays: Delays,
        dead_letters: DeadLetters,
        log: MessageLog,
        timers: TimerHeap,
        outbox: Outbox,
        wakeups: Wakeups,
        stats: dict[str, int],
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        boot_id: str,
        config: CoreConfig,
        connections: Connections,
    ) -> None:
        self._store = queues
        self._connections = connections
        self._delays = delays
        self._dead_letter = dead_letters.dead_letter
        self._log = log
        self._settle_entry = log.settle_entry
        self._timers = timers
        self._heap = timers.heap
        self._emit = outbox.emit
        self._dispatch_due = wakeups.dispatch
        self._getters = wakeups.getters
        self._stats = stats
        self._clock = clock
        self._wall_clock = wall_clock
        self._boot_id = boot_id
        self._credit_bytes = config.channel_buffer_bytes
        self._max_prefetch = config.max_prefetch
        self._consumer_timeout_s = config.consumer_timeout_s
        self._default_lease_s = config.default_lease_s
        self.channels: dict[int, ChannelState] = {REST_CHANNEL: ChannelState(REST_CHANNEL, credit=1 << 62)}
        self.tags = ConsumerTags(self.channels)  # every consumer tag of each channel, of any kind
        self._next_channel = 1
        self._next_consumer = 1
        #: False while the broker shuts down: nothing more is handed to consumers.
        self.delivering = True

    def open_channel(self) -> int:
        """Open a channel; return its id."""
        channel_id = self._next_channel
        self._next_channel += 1
        self.channels[channel_id] = ChannelState(channel_id, self._credit_bytes)
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
            self.remove_consumer(consumer)
        self.requeue_deliveries(ch, list(ch.deliveries.values()))
        if ch.owner == channel_id:  # (a connection's queues outlive its channels)
            remove_exclusive(self._store, ch.exclusive_queues)
        del self.channels[channel_id]
        self.tags.forget_channel(channel_id)
        self._log.forget_channel(channel_id)

    def join_connection(self, channel_id: int, connection_id: int) -> None:
        """From now on ``channel_id`` declares and uses the exclusive queues of the
        connection ``connection_id`` (connections.py); called before it declares any.
        Raises ChannelError (either is not open, or the channel owns queues already)."""
        ch = self.channel(channel_id)
        owned = self._connections.queues_of(connection_id)
        if owned is None:
            raise ChannelError(f"connection {connection_id} is not open")
        if ch.owner != ch.id or ch.exclusive_queues:
            raise ChannelError(f"channel {channel_id} already owns exclusive queues")
        ch.owner = connection_id
        ch.exclusive_queues = owned

    def owner_of(self, channel_id: int) -> int:
        """Whose exclusive queues ``channel_id`` may use: its connection's, or its own."""
        ch = self.channels.get(channel_id)
        return ch.owner if ch is not None else channel_id

    def grant_credit(self, channel_id: int, nbytes: int) -> None:
        """The IO layer drained ``nbytes`` of this channel's output: deliveries may resume."""
        ch = self.channels.get(channel_id)
        if ch is None:
            return
        was_blocked = ch.credit <= 0
        ch.credit = min(ch.credit + nbytes, self._credit_bytes)
        if was_blocked and ch.credit > 0:
            for consumer in ch.consumers.values():
                self._dispatch_due[consumer.queue.name] = consumer.queue

    def channel(self, channel_id: int) -> ChannelState:
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
        prefetch: object = None,
        no_ack: bool = False,
        exclusive: bool = False,
        ack_timeout_s: float | None = None,
        lease_s: float | None = None,
        priority: object = None,
    ) -> str:
        """Start a consumer; return its tag.

        ``lease_s`` makes a lease-mode consumer (the streaming endpoint with
        ``ack=lease``): each delivery carries a lease id settled through the REST
        lease calls and returns to the queue after ``lease_s``. ``priority``:
        ``x-priority`` (consumerorder.py).
        Raises NotFound, ResourceLocked, AccessRefused (exclusivity), ConsumerTagInUse,
        InvalidArgument.
        """
        ch = self.channel(channel_id)
        queue = self._store.queue(queue_name, channel_id)
        prefetch = check_prefetch(ch.default_prefetch if prefetch is None else prefetch, self._max_prefetch)
        priority = check_consumer_priority(priority)
        generated = not consumer_tag  # (one a client chose already is passed over)
        while not consumer_tag or (generated and self.tags.taken(ch, consumer_tag)):
            consumer_tag = f"ctag-{self._boot_id}-{self._next_consumer}"
            self._next_consumer += 1
        self.tags.check_free(ch, consumer_tag)  # (every kind's: consumertags.py)
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
            ack_timeout_s = self.ack_timeout_s(queue)
        if lease_s is not None:
            ack_timeout_s = lease_s
        consumer = Consumer(consumer_tag, ch, queue, no_ack, prefetch, exclusive, ack_timeout_s, lease_s, priority)
        ch.consumers[consumer_tag] = consumer
        queue.totals.consumers += 1
        add_consumer(queue, consumer)
        queue.had_consumer = True
        queue.exclusive_consumer = exclusive
        self._dispatch_due[queue.name] = queue
        self._delays.touch_queue(queue)
        return consumer_tag

    def cancel(self, channel_id: int, consumer_tag: str) -> None:
        """Stop a consumer. Its unacked deliveries stay with the channel until settled.
        Raises NotFound if the tag is unknown, ChannelError if the channel is not open."""
        ch = self.channel(channel_id)
        consumer = ch.consumers.get(consumer_tag)
        if consumer is None:
            raise NotFound(f"no consumer {consumer_tag!r} on this channel")
        self.remove_consumer(consumer)

    def consumer_active(self, channel_id: int, consumer_tag: str) -> bool:
        """Whether this consumer receives deliveries (false: a standby of a
        single-active-consumer queue). Raises ChannelError, NotFound."""
        consumer = self.channel(channel_id).consumers.get(consumer_tag)
        if consumer is None:
            raise NotFound(f"no consumer {consumer_tag!r} on this channel")
        queue = consumer.queue
        return not queue.single_active or (queue.consumers[0] is consumer and queue.handing_over is None)

    def remove_consumer(self, consumer: Consumer, *, auto_delete: bool = True) -> None:
        ch = consumer.channel
        queue = consumer.queue
        if ch.consumers.pop(consumer.tag, None) is not None:
            queue.totals.consumers -= 1
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
        if (
            auto_delete
            and queue.auto_delete
            and queue.had_consumer
            and not queue.consumers
            and not queue.getters  # (a long-poll still reads it: see Delays.rest_read)
            and not queue.deleted
        ):
            self._store.remove_queue(queue, "auto-delete queue lost its last consumer", by_itself=True)
        elif queue.consumers:
            self._dispatch_due[queue.name] = queue
        elif not queue.deleted:
            self._delays.touch_queue(queue)  # unused from now on

    def _hand_over(self, queue: Queue) -> None:
        """A single-active-consumer queue's active consumer is gone and its deliveries
        settled: the next consumer, if any, becomes the active one."""
        queue.handing_over = None
        if queue.consumers:
            successor = queue.consumers[0]
            self._emit(ConsumerActive(successor.channel.id, successor.tag))
            self._dispatch_due[queue.name] = queue

    def qos(self, channel_id: int, prefetch: object, global_: bool = False) -> None:
        """basic.qos: a channel-wide limit (``global_``) or the default per-consumer one."""
        ch = self.channel(channel_id)
        prefetch = check_prefetch(prefetch, self._max_prefetch)
        if global_:
            ch.prefetch = prefetch
            for consumer in ch.consumers.values():
                self._dispatch_due[consumer.queue.name] = consumer.queue
        else:
            ch.default_prefetch = prefetch

    def dispatch_due(self) -> None:
        """Hand ready messages to the consumers of every queue marked for dispatch."""
        dirty = self._dispatch_due
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
            elif consumers[0].priority != consumers[-1].priority:  # (ordered by priority)
                chosen = choose_by_priority(queue)
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
            entry = self._store.pop_live(queue)
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
        self._stats["delivered"] += 1
        if count:
            queue.redelivered += 1
        ch.credit -= delivery_cost(message.body)
        lease = None
        if consumer.no_ack:
            queue.acked += 1
            self._settle_entry(queue, entry)
        else:
            self.count_delivery(queue, entry)
            deadline = self._clock() + consumer.ack_timeout_s
            ch.deliveries[tag] = Delivery(tag, entry, queue, consumer, deadline)
            self.push_deadline(deadline, ch.id, tag)
            consumer.unacked += 1
            ch.unacked += 1
            queue.unacked += 1
            queue.totals.unacked += 1
            if consumer.lease_s is not None:
                lease = lease_id(self._boot_id, ch.id, tag)
        self._emit(Deliver(ch.id, consumer.tag, tag, count > 0, message, lease, count))

    def count_delivery(self, queue: Queue, entry: Entry) -> None:
        """One more delivery of ``entry`` that may come back: count it, and log the
        count (lazily: a delivery does not wait for its mark to be written). The first
        delivery is a DELIVERED mark; later ones, rarer, log the count itself."""
        entry.deliveries += 1
        message = entry.message
        if queue.persistent_log and message.persistent:
            if entry.deliveries == 1:
                self._log.mark_delivered(queue.qid, message.seq)
            else:
                self._log.mark_count(queue.qid, message.seq, entry.deliveries)

    def queue_deleted(self, queue: Queue, reason: str) -> None:
        """``queue`` is being deleted: its consumers are cancelled (``ConsumerCancelled``
        with ``reason``) and its exclusive owner forgets it. Its unacked deliveries
        stay with their channels and are simply forgotten when settled."""
        for consumer in list(queue.consumers):
            self.remove_consumer(consumer, auto_delete=False)
            self._emit(ConsumerCancelled(consumer.channel.id, consumer.tag, reason))
        owner = queue.exclusive_owner
        if owner is not None:
            ch = self.channels.get(owner)
            owned = ch.exclusive_queues if ch is not None else self._connections.queues_of(owner)
            if owned is not None:
                owned.discard(queue.name)

    # ------------------------------------------------------------- deadlines

    def deadline_live(self, channel_id: int, tag: int, deadline: float) -> bool:
        """Whether a timer entry still is the deadline of delivery ``tag``."""
        ch = self.channels.get(channel_id)
        d = ch.deliveries.get(tag) if ch is not None else None
        return d is not None and d.deadline == deadline

    def deadline_passed(self, channel_id: int, tag: int, deadline: float) -> None:
        """A timer entry came due: if it still is delivery ``tag``'s deadline, the
        delivery (or lease) expired and goes back to its queue."""
        ch = self.channels.get(channel_id)
        d = ch.deliveries.get(tag) if ch is not None else None
        if ch is None or d is None or d.deadline != deadline:
            return
        if d.queue.deleted and ch.id != REST_CHANNEL:
            # Its queue went (deleted, or left this core when a cluster node stopped
            # leading it): nothing goes back, and the channel holding it is not at
            # fault. Kept, without a deadline, so that settling it still does nothing
            # (until the channel ends; a REST lease of it just lapses, as before).
            d.deadline = None
            return
        self.requeue_deliveries(ch, [d])
        consumer = d.consumer
        if consumer is not None or ch.id != REST_CHANNEL:  # (or a channel's get: leases.py)
            ch.expired[tag] = None
            if len(ch.expired) > _EXPIRED_MEMORY:
                del ch.expired[next(iter(ch.expired))]
            if consumer is None or consumer.lease_s is None:
                self._emit(DeliveryExpired(ch.id, consumer.tag if consumer is not None else "", tag))

    def reserve_tag(self, channel_id: int) -> int:
        """A delivery tag of ``channel_id`` for a delivery made elsewhere (a cluster
        relays another node's consumer through this channel): numbered with the
        channel's own deliveries, settled by whoever relays it, never by this core."""
        ch = self.channel(channel_id)
        tag = ch.next_tag
        ch.next_tag += 1
        return tag

    # ------------------------------------------------------------- settling

    def ack(self, channel_id: int, delivery_tag: object, multiple: bool = False) -> int:
        """Acknowledge one delivery (or every one up to the tag); return how many.
        Raises ChannelError for an unknown or expired tag (the channel must close)."""
        ch = self.channel(channel_id)
        if ch.tx is not None:
            self._hold_settle(ch, "ack", delivery_tag, multiple, False, None)
            return 0
        deliveries = self._take_deliveries(ch, delivery_tag, multiple)
        for d in deliveries:
            self.finish_delivery(ch, d)
            d.queue.acked += 1
            self._settle_entry(d.queue, d.entry)
        self._stats["acked"] += len(deliveries)
        return len(deliveries)

    def nack(
        self,
        channel_id: int,
        delivery_tag: object,
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
        ch = self.channel(channel_id)
        if delay_s is not None and not requeue:
            raise InvalidArgument("a delay needs requeue: a message not requeued does not come back")
        if ch.tx is not None:
            self._hold_settle(ch, "nack", delivery_tag, multiple, requeue, delay_s)
            return 0
        deliveries = self._take_deliveries(ch, delivery_tag, multiple)
        if requeue:
            self.requeue_deliveries(ch, deliveries, taken=True, delay_s=delay_s)
        else:
            for d in deliveries:
                self.finish_delivery(ch, d)
                self._dead_letter(d.queue, d.entry, "rejected")
        return len(deliveries)

    def reject(
        self, channel_id: int, delivery_tag: object, requeue: bool = True, *, delay_s: float | None = None
    ) -> int:
        return self.nack(channel_id, delivery_tag, False, requeue, delay_s=delay_s)

    def touch(self, channel_id: int, delivery_tag: object) -> None:
        """Reset the ack timeout of a delivery still being worked on.
        Raises ChannelError for an unknown or expired tag."""
        ch = self.channel(channel_id)
        d = self.lookup_delivery(ch, delivery_tag)
        if d.consumer is not None:
            timeout = d.consumer.ack_timeout_s
        elif ch.id == REST_CHANNEL:
            timeout = self._default_lease_s
        else:  # a channel's get
            timeout = self.ack_timeout_s(d.queue)
        self.reset_deadline(ch, d, self._clock() + timeout)

    def ack_timeout_s(self, queue: Queue) -> float:
        """How long a delivery from ``queue`` may stay unacked (without a consume's own)."""
        return queue.consumer_timeout_s or self._consumer_timeout_s

    def reset_deadline(self, ch: ChannelState, d: Delivery, deadline: float) -> None:
        d.deadline = deadline
        self.push_deadline(deadline, ch.id, d.tag)

    def push_deadline(self, deadline: float, channel_id: int, tag: int) -> None:
        """Schedule a deadline. Settled or touched deliveries leave stale entries
        behind (skipped when popped); once stale ones could dominate, the heap is
        rebuilt from the live deliveries, so its size follows the unacked count
        rather than delivery rate x ack timeout (amortised O(1) per push)."""
        heap = self._heap
        heapq.heappush(heap, (deadline, channel_id, tag))
        if len(heap) >= self._timers.compact_at:
            self._timers.rebuild(
                (d.deadline, ch.id, d.tag)
                for ch in self.channels.values()
                for d in ch.deliveries.values()
                if d.deadline is not None
            )

    def lookup_delivery(self, ch: ChannelState, tag: object) -> Delivery:
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

    def _take_deliveries(self, ch: ChannelState, tag: object, multiple: bool) -> list[Delivery]:
        """Remove and return the deliveries an ack/nack names (validated first, so a bad
        tag changes nothing)."""
        if multiple:
            if not isinstance(tag, int) or isinstance(tag, bool):
                raise ChannelError("delivery_tag must be an integer", code="invalid_argument")
            if tag != 0:
                self.lookup_delivery(ch, tag)
            taken = []
            for t in ch.deliveries:
                if tag and t > tag:
                    break
                taken.append(t)
            return [ch.deliveries.pop(t) for t in taken]
        d = self.lookup_delivery(ch, tag)
        del ch.deliveries[d.tag]
        return [d]

    def finish_delivery(self, ch: ChannelState, d: Delivery) -> None:
        """Bookkeeping common to every end of a delivery (already removed from ch)."""
        ch.unacked -= 1
        queue = d.queue
        if not queue.deleted:
            queue.unacked -= 1
            queue.totals.unacked -= 1
            if queue.auto_delete and not queue.unacked and queue.read_at is not None:
                self._delays.rest_read(queue)  # its last lease settled: the grace starts
        consumer = d.consumer
        if consumer is not None:
            consumer.unacked -= 1
            if consumer is queue.handing_over and not consumer.unacked:
                self._hand_over(queue)
            if not queue.deleted and consumer.channel.consumers.get(consumer.tag) is consumer:
                self._dispatch_due[queue.name] = queue
        if ch.prefetch:
            for c in ch.consumers.values():
                self._dispatch_due[c.queue.name] = c.queue

    def requeue_deliveries(
        self, ch: ChannelState, deliveries: list[Delivery], *, taken: bool = False, delay_s: float | None = None
    ) -> None:
        """Deliveries that failed (nack, expiry, their channel ended) go back to their
        queue's original place, after ``delay_s`` if given; a message delivered more
        often than its queue's ``x-delivery-limit`` is dead-lettered instead."""
        due = self._wall_clock() + delay_s if delay_s else None
        for d in deliveries:
            if not taken:
                ch.deliveries.pop(d.tag, None)
            self.finish_delivery(ch, d)
            queue = d.queue
            if queue.deleted:
                continue
            entry = d.entry
            if queue.delivery_limit is not None and entry.deliveries > queue.delivery_limit:
                self._dead_letter(queue, entry, "delivery_limit")
                continue
            if due is not None:
                self._delays.delay_return(queue, entry, due)
                continue
            queue.requeue(entry)
            if entry.expires_at is not None:
                self._delays.wake_by(queue, entry.expires_at)  # (it may expire before anyone reads)
            if queue.max_length is not None or queue.max_length_bytes is not None:
                self._store.drop_over_limit(queue)
            if queue.consumers:
                self._dispatch_due[queue.name] = queue
            if queue.getters:
                self._getters[queue.name] = queue

    def _hold_settle(
        self, ch: ChannelState, kind: str, tag: object, multiple: bool, requeue: bool, delay_s: float | None
    ) -> None:
        """Hold an ack or nack for the commit (its tag is checked now, and again then)."""
        tx = ch.tx
        assert tx is not None
        if not isinstance(tag, int) or isinstance(tag, bool):
            raise ChannelError("delivery_tag must be an integer", code="invalid_argument")
        if not (multiple and tag == 0):
            self.lookup_delivery(ch, tag)
        if len(tx.publishes) + len(tx.settles) >= MAX_TX_OPS:
            raise InvalidArgument(f"transaction too large (at most {MAX_TX_OPS} operations)", code="payload_too_large")
        tx.settles.append((kind, tag, multiple, requeue, delay_s))

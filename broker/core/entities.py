"""The broker's nouns: exchanges, queues, consumers, channels, deliveries.

These are plain data holders with the small invariants that belong to each thing (a
queue's FIFO order, a channel's delivery tags); every rule that involves more than one
of them lives in :mod:`broker.core.broker`.
"""

from __future__ import annotations

import copy

from typing import Any

from .confirms import ConfirmTracker
from .delayed import DelayedMessages
from .expiring import ExpiringMessages
from .lanes import Lane
from .message import Entry, StoredMessage
from .routing import ConsistentHashTable, RoutingTable, make_table
from .totals import Totals

__all__ = ["Exchange", "Queue", "Consumer", "ChannelState", "Delivery", "Transaction", "MAX_TX_BYTES", "MAX_TX_OPS"]


class Exchange:
    __slots__ = (
        "name", "type", "durable", "auto_delete", "internal", "arguments", "table", "bound_from", "builtin",
        "messages_in", "messages_out",
    )

    def __init__(
        self,
        name: str,
        type: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
        builtin: bool = False,
    ) -> None:
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments
        self.table: RoutingTable = make_table(type, arguments)
        if isinstance(self.table, ConsistentHashTable):
            self.table.hash_header = arguments.get("hash-header")
        # names of exchanges holding a binding whose destination is this exchange
        self.bound_from: set[str] = set()
        self.builtin = builtin
        #: messages published to it (dead letters included), and those of them it
        #: routed to at least one queue; since the start (counters, not state)
        self.messages_in = 0
        self.messages_out = 0

    def settings(self) -> tuple[Any, ...]:
        return (self.type, self.durable, self.auto_delete, self.internal, self.arguments)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "durable": self.durable,
            "auto_delete": self.auto_delete,
            "internal": self.internal,
            "arguments": copy.deepcopy(self.arguments),  # the caller's to change
        }


class Queue:
    """A queue: its settings, its ready messages in one lane per priority level
    (:mod:`broker.core.lanes`; a plain queue has one), its delayed messages, its
    consumers and counters.
    """

    __slots__ = (
        "qid",
        "name",
        "durable",
        "exclusive_owner",
        "auto_delete",
        "arguments",
        "lanes",
        "max_priority",
        "unacked",
        "consumers",
        "rr",
        "getters",
        "bound_from",
        "had_consumer",
        "deleted",
        "max_length",
        "overflow",
        "message_ttl_s",
        "consumer_timeout_s",
        "published",
        "delivered",
        "acked",
        "redelivered",
        "exclusive_consumer",
        "read_blocked_until",
        "read_failure",
        "read_attempts",
        "dead_letter_exchange",
        "dead_letter_routing_key",
        "delivery_limit",
        "delayed",
        "paged_counts",
        "wake_at",
        "dead_lettered",
        "expires_s",
        "unused_since",
        "max_length_bytes",
        "ready_bytes",
        "single_active",
        "handing_over",
        "refusal",
        "hold_after",
        "persist_all",
        "totals",
        "expiring",
        "read_at",
    )

    def __init__(
        self,
        qid: int,
        name: str,
        durable: bool,
        exclusive_owner: int | None,
        auto_delete: bool,
        arguments: dict[str, Any],
    ) -> None:
        self.qid = qid
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        #: ``x-max-priority``: messages are served highest priority first, FIFO
        #: within a priority; ``lanes[p]`` holds priority ``p`` (one lane without it)
        self.max_priority: int | None = arguments.get("x-max-priority")
        self.lanes = [Lane() for _ in range((self.max_priority or 0) + 1)]
        #: While reading the next paged-out message back fails: when to try again
        #: (clock time), why it failed, and how many tries in a row failed.
        self.read_blocked_until: float | None = None
        self.read_failure: str | None = None
        self.read_attempts = 0
        self.unacked = 0
        self.consumers: list[Consumer] = []
        self.rr = 0
        self.getters = 0
        self.bound_from: set[str] = set()
        self.had_consumer = False
        self.deleted = False
        self.max_length: int | None = arguments.get("x-max-length")
        #: ``x-max-length-bytes``: a bound on the body bytes of the ready messages, and
        #: those bytes (kept only for such a queue, whose messages all stay in memory:
        #: their total is bounded by the setting, and a paged-out body's size is not
        #: known without reading it)
        self.max_length_bytes: int | None = arguments.get("x-max-length-bytes")
        #: ``x-single-active-consumer``: only the first registered consumer receives;
        #: the others wait, in registration order, and take over when it goes
        self.single_active: bool = arguments.get("x-single-active-consumer", False)
        #: the active consumer that went with messages still unacked: the next one
        #: takes over only once they are settled or back (so order holds)
        self.handing_over: Consumer | None = None
        self.ready_bytes = 0
        #: why publishes to this queue are nacked for now (``Broker.refuse_queue``: a
        #: replicated queue below its majority), or None
        self.refusal: str | None = None
        #: messages with a higher seq are not handed out yet (``Broker.hold_deliveries``:
        #: a replicated queue delivers only what a majority holds), or None
        self.hold_after: int | None = None
        #: every message entering this queue is made persistent, transient ones too
        #: (``Broker.persist_messages``: a replicated queue replicates every message)
        self.persist_all = False
        self.overflow: str = arguments.get("x-overflow", "drop-head")
        ttl = arguments.get("x-message-ttl")
        self.message_ttl_s: float | None = ttl / 1000.0 if ttl is not None else None
        ct = arguments.get("x-consumer-timeout")
        self.consumer_timeout_s: float | None = ct / 1000.0 if ct is not None else None
        self.published = 0
        self.delivered = 0
        self.acked = 0
        self.redelivered = 0
        self.exclusive_consumer = False
        self.dead_letter_exchange: str | None = arguments.get("x-dead-letter-exchange")
        self.dead_letter_routing_key: str | None = arguments.get("x-dead-letter-routing-key")
        self.delivery_limit: int | None = arguments.get("x-delivery-limit")
        #: Messages held back until a wall-clock time (a nack or publish with a
        #: delay): not ready until due.
        self.delayed = DelayedMessages()
        #: The ready messages that carry their own ``expiration``, by when they expire
        #: (they may expire out of queue order: see expiring.py and expiry.py).
        self.expiring = ExpiringMessages()
        #: Delivery counts above one of paged-out messages (the index keeps only
        #: whether a message was delivered): ``seq -> count``. Rare: recovery only.
        self.paged_counts: dict[int, int] = {}
        #: When a timer wakes this queue next (monotonic clock; see delays.py).
        self.wake_at: float | None = None
        #: Messages dead-lettered from this queue, by reason.
        self.dead_lettered: dict[str, int] = {}
        #: ``x-expires``: the queue is deleted once unused this long (seconds), and
        #: since when (monotonic) it has been unused (see Delays.touch_queue).
        exp = arguments.get("x-expires")
        self.expires_s: float | None = exp / 1000.0 if exp is not None else None
        self.unused_since = 0.0
        #: the broker's running counts, which this queue's messages are part of (its
        #: own until the queue store adopts it: see :meth:`adopt`)
        self.totals = Totals()
        #: An auto-delete queue read over REST (a get, a long-poll): when it was last
        #: read (monotonic; None: never). See ``Delays.rest_read``.
        self.read_at: float | None = None

    def adopt(self, totals: Totals) -> None:
        """Count this queue's messages in ``totals`` (the broker's, see totals.py)
        from now on: its ready ones, and those of them its lanes page out."""
        self.totals = totals
        for lane in self.lanes:
            lane.paged.totals = totals

    @property
    def persistent_log(self) -> bool:
        """Whether this queue's contents go to the log (durable and not exclusive)."""
        return self.durable and self.exclusive_owner is None

    def lane_for(self, message: StoredMessage) -> Lane:
        """The lane ``message`` belongs in: its priority's (at most the maximum)."""
        top = self.max_priority
        if top is None:
            return self.lanes[0]
        return self.lanes[min(message.priority, top)]

    def next_lane(self) -> Lane | None:
        """The lane the next ready message comes from: the highest non-empty one."""
        lanes = self.lanes
        if len(lanes) == 1:
            return lanes[0] if lanes[0] else None
        for lane in reversed(lanes):
            if lane:
                return lane
        return None

    def held_entries(self) -> list[Entry]:
        """Every entry held in memory that is not out with a consumer: requeued,
        ready, tail and delayed (a checkpoint or compaction must see them all)."""
        entries: list[Entry] = []
        for lane in self.lanes:
            entries.extend(lane.held())
        entries.extend(self.delayed.whole())
        return entries

    def ready_count(self) -> int:
        return sum(len(lane) for lane in self.lanes)

    def has_ready(self) -> bool:
        for lane in self.lanes:
            if lane.ready or lane.requeued or lane.paged or lane.tail:
                return True
        return False

    def paged_count(self) -> int:
        """How many ready messages have their bodies only in the log."""
        return sum(len(lane.paged) for lane in self.lanes)

    def requeue(self, entry: Entry) -> None:
        """Put ``entry`` back in its original place (by sequence, in its lane)."""
        self.lane_for(entry.message).requeue(entry)
        self.totals.ready += 1
        expires = entry.expires_at
        if expires is not None and entry.message.expires_at is not None:
            self.expiring.add(entry.message.seq, expires)
        if self.max_length_bytes is not None:
            self.ready_bytes += len(entry.message.body)

    def pop(self) -> Entry | None:
        """The next entry held in memory; None when there is none or the next message
        is paged out (the broker pages it in first)."""
        lanes = self.lanes
        lane = lanes[0] if len(lanes) == 1 else self.next_lane()
        return None if lane is None else self.pop_lane(lane)

    def lane_at_most(self, bound: int) -> Lane | None:
        """The highest lane whose next message (in memory or paged out) has a seq at
        or below ``bound``: where a priority queue's next message waits while its head
        is held back (``hold_after``). Seqs number a queue's messages across its lanes
        but only grow within one, so each lane's next message decides."""
        for lane in reversed(self.lanes):
            head = lane.head()
            seq = head.message.seq if head is not None else lane.paged.first_seq()
            if seq is not None and seq <= bound:
                return lane
        return None

    def pop_lane(self, lane: Lane) -> Entry | None:
        """:meth:`pop` from ``lane`` rather than the highest non-empty one."""
        entry = lane.pop()
        if entry is not None:
            self.totals.ready -= 1
            if self.max_length_bytes is not None:
                self.ready_bytes -= len(entry.message.body)
        return entry

    def memory_head(self) -> Entry | None:
        """The entry :meth:`pop` would return, without taking it (None: none in memory)."""
        lane = self.next_lane()
        return None if lane is None else lane.head()

    def take_seq(self, seq: int) -> Entry | int | None:
        """Remove ready message ``seq`` from wherever it waits (an expiry out of queue
        order): its entry when held in memory, its locator when paged out, None when it
        is not ready here (delivered, delayed, gone)."""
        for lane in self.lanes:
            if not lane:
                continue
            found = lane.take(seq)
            if found is not None:
                self.totals.ready -= 1
                if self.max_length_bytes is not None and isinstance(found, Entry):
                    self.ready_bytes -= len(found.message.body)
                return found
        return None

    def count_ready_bytes(self) -> int:
        """The body bytes of the ready messages held in memory (counted anew)."""
        return sum(len(e.message.body) for lane in self.lanes for e in lane.held())

    def is_full(self, body_bytes: int) -> bool:
        """Whether one more message of ``body_bytes`` would pass ``x-max-length`` or
        ``x-max-length-bytes`` (for the ``reject-publish`` overflows)."""
        if self.max_length is not None and self.ready_count() >= self.max_length:
            return True
        return self.max_length_bytes is not None and self.ready_bytes + body_bytes > self.max_length_bytes

    def over_limit(self) -> bool:
        """Whether the ready messages pass a length limit (``drop-head`` drops then)."""
        if self.max_length is not None and self.ready_count() > self.max_length:
            return True
        return self.max_length_bytes is not None and self.ready_bytes > self.max_length_bytes

    def clear_ready(self) -> tuple[list[Entry], list[int]]:
        """Remove every ready or delayed message: (entries held in memory, seqs of
        paged-out ones)."""
        entries: list[Entry] = []
        seqs: list[int] = []
        for lane in self.lanes:
            held, paged = lane.clear()
            entries.extend(held)
            seqs.extend(paged)
        self.totals.ready -= len(entries) + len(seqs)
        self.expiring.clear()
        delayed_entries, delayed_seqs = self.delayed.clear()
        entries.extend(delayed_entries)
        self.paged_counts.clear()
        self.ready_bytes = 0
        return entries, seqs + delayed_seqs

    def remove_entries(self, seqs: set[int]) -> list[Entry]:
        """Remove in-memory ready entries with these sequence numbers (rare: storage
        failure, whose messages are never paged out: their records were not written)."""
        removed: list[Entry] = []
        for lane in self.lanes:
            removed.extend(lane.remove_entries(seqs))
        self.totals.ready -= len(removed)
        if self.max_length_bytes is not None:
            self.ready_bytes -= sum(len(e.message.body) for e in removed)
        removed.extend(self.delayed.remove_whole(seqs))
        return removed

    def settings(self) -> tuple[Any, ...]:
        return (self.durable, self.exclusive_owner is not None, self.auto_delete, self.arguments)


class Consumer:
    __slots__ = (
        "tag",
        "channel",
        "queue",
        "no_ack",
        "prefetch",
        "unacked",
        "exclusive",
        "ack_timeout_s",
        "lease_s",
        "priority",
    )

    def __init__(
        self,
        tag: str,
        channel: ChannelState,
        queue: Queue,
        no_ack: bool,
        prefetch: int,
        exclusive: bool,
        ack_timeout_s: float,
        lease_s: float | None,
        priority: int = 0,
    ) -> None:
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.prefetch = prefetch
        self.unacked = 0
        self.exclusive = exclusive
        self.ack_timeout_s = ack_timeout_s
        self.lease_s = lease_s
        #: ``x-priority``: a queue's consumers of the highest priority get its messages
        #: while they have room; equal priorities take turns (consumerorder.py).
        self.priority = priority

    def can_take(self) -> bool:
        ch = self.channel
        if ch.credit <= 0:
            return False
        if self.no_ack:
            # Prefetch bounds unacked deliveries; a no-ack consumer has none, and
            # the channel-wide limit must not starve it (RabbitMQ ignores prefetch
            # for automatic-acknowledgement consumers). Credit still applies.
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        if ch.prefetch and ch.unacked >= ch.prefetch:
            return False
        return True


class Delivery:
    """A message handed out and not yet settled: by a consumer, or as a lease."""

    __slots__ = ("tag", "entry", "queue", "consumer", "deadline")

    def __init__(
        self, tag: int, entry: Entry, queue: Queue, consumer: Consumer | None, deadline: float | None
    ) -> None:
        self.tag = tag
        self.entry = entry
        self.queue = queue
        self.consumer = consumer
        self.deadline = deadline


#: Most message bytes and operations one transaction may hold (a commit is one write).
MAX_TX_BYTES = 8 * 1024 * 1024
MAX_TX_OPS = 100_000


class Transaction:
    """The publishes and settles a transactional channel holds until its commit (at
    most ``MAX_TX_OPS`` operations and ``MAX_TX_BYTES`` of messages)."""

    __slots__ = ("publishes", "settles", "bytes")

    def __init__(self) -> None:
        #: (publish tag, (exchange, routing key, body, properties, mandatory, delay_s))
        self.publishes: list[tuple[int, tuple[Any, ...]]] = []
        #: ("ack" | "nack", delivery tag, multiple, requeue, delay_s)
        self.settles: list[tuple[str, int, bool, bool, float | None]] = []
        self.bytes = 0


class ChannelState:
    """One channel's state: publish numbering and confirms, consumers, unacked deliveries."""

    __slots__ = (
        "id",
        "publish_seq",
        "confirms",
        "last_released_tag",
        "next_tag",
        "deliveries",
        "consumers",
        "prefetch",
        "default_prefetch",
        "unacked",
        "credit",
        "exclusive_queues",
        "owner",
        "expired",
        "closed",
        "tx",
        "reply_consumer",
    )

    def __init__(self, channel_id: int, credit: int) -> None:
        self.id = channel_id
        self.publish_seq = 0
        self.confirms = ConfirmTracker()
        #: The highest publish tag answered so far (confirms are released in tag order).
        self.last_released_tag = 0
        self.next_tag = 1
        # delivery tag -> Delivery, in increasing tag order (dicts keep insertion order)
        self.deliveries: dict[int, Delivery] = {}
        self.consumers: dict[str, Consumer] = {}
        self.prefetch = 0  # channel-wide limit (basic.qos global=true); 0 = none
        self.default_prefetch = 0  # per-consumer default (basic.qos global=false)
        self.unacked = 0
        # Bytes of deliveries the IO layer is still willing to buffer (credit flow).
        self.credit = credit
        #: The exclusive queues this channel may use: its own, or, once it joined a
        #: connection (``Deliveries.join_connection``), that connection's (one set, shared).
        self.exclusive_queues: set[str] = set()
        #: Who owns the exclusive queues it declares: itself, or its connection.
        self.owner = channel_id
        # tags that expired (ack timeout); remembered so a late ack is a clear error
        self.expired: dict[int, None] = {}
        self.closed = False
        #: the transaction being built, when the channel is transactional (tx_select)
        self.tx: Transaction | None = None
        #: (consumer tag, secret, whether each reply takes a delivery tag) of its
        #: direct reply-to consumer (directreply.py)
        self.reply_consumer: tuple[str, str, bool] | None = None

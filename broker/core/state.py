"""The state every part of the core shares, and the constants they share.

:class:`Broker` (broker.py) is one object whose methods live in several modules, one
job each (topology, publishing, delivery, settling, leases, timers, replay, snapshot,
compaction), as mixin classes over :class:`BrokerState`. One object, because these
parts change the same few structures together on every message (a publish touches
queues, channels, the log and the confirms in one step) and the hot paths must not pay
for indirection; separate modules, so that each part can be read and changed alone.
``BrokerState.__init__`` holds every attribute; the methods one part calls on another
are declared here (for the type checker only), so each module's dependencies on the
others are visible in one place.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import records as rec
from .config import CoreConfig
from .coordstate import CoordState
from .dedup import DedupWindow
from .effects import (
    Effect,
)
from .entities import Channel, Consumer, Delivery, Exchange, Queue
from .message import Entry, Message
from .paging import PagedRefs, ReplayIndex
from .userstore import UserStore

__all__ = [
    "BUILTIN_EXCHANGES",
    "BrokerState",
    "DEDUP_BATCH_ENTRIES",
    "DEFAULT_EXCHANGE",
    "DELIVERY_OVERHEAD_BYTES",
    "delivery_cost",
    "NO_ROUTE",
    "PAGE_IN_BATCH",
    "PublishResult",
    "QUEUE_ARGUMENTS",
    "EXCHANGE_ARGUMENTS",
    "REST_CHANNEL",
    "ReadLog",
    "_ENQUEUE",
    "_EXPIRED_MEMORY",
    "_TIMERS_COMPACT_MIN",
]

REST_CHANNEL = 0
DEFAULT_EXCHANGE = ""
BUILTIN_EXCHANGES = {
    "": "direct",
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}
# Per-delivery overhead charged against a channel's credit besides the body (JSON
# framing, properties): keeps tiny messages from being unbounded in count.
DELIVERY_OVERHEAD_BYTES = 200


def delivery_cost(body: bytes) -> int:
    """What a message of this body costs against a channel's byte credit (and its
    outbox and unconfirmed-publish bounds): the body plus DELIVERY_OVERHEAD_BYTES.
    One formula, used by the core and the API layer alike."""
    return len(body) + DELIVERY_OVERHEAD_BYTES


# Deduplication window entries per DEDUP_DIGESTS record of a checkpoint (16 bytes each).
DEDUP_BATCH_ENTRIES = 4096
NO_ROUTE = 312
_EXPIRED_MEMORY = 4096  # how many expired tags a channel remembers for late-ack errors
_TIMERS_COMPACT_MIN = 1024  # timer heap size below which stale entries are not worth a rebuild

def _int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _name(v: Any) -> bool:
    return isinstance(v, str) and len(v.encode("utf-8", "replace")) <= 255


_MAX_MS = (1 << 32) - 1  # RabbitMQ's bound for TTLs and timeouts in ms (49.7 days)
_INT63 = (1 << 63) - 1

#: The queue arguments the broker knows, each with its check. Any other ``x-``
#: argument is refused (see ``_check_entity_arguments`` in topology.py).
QUEUE_ARGUMENTS: dict[str, Callable[[Any], bool]] = {
    "x-max-length": _int_in(0, _INT63),
    "x-max-length-bytes": _int_in(0, _INT63),
    "x-overflow": lambda v: v in ("drop-head", "reject-publish", "reject-publish-dlx"),
    "x-message-ttl": _int_in(0, _MAX_MS),
    "x-consumer-timeout": _int_in(1, _MAX_MS),
    "x-dead-letter-exchange": _name,
    "x-dead-letter-routing-key": _name,
    "x-delivery-limit": _int_in(0, _INT63),
    "x-expires": _int_in(1, _MAX_MS),
    "x-single-active-consumer": lambda v: isinstance(v, bool),
    "x-max-priority": _int_in(1, 255),
    # accepted from RabbitMQ clients that ask for a queue type: ackbus has one kind
    "x-queue-type": lambda v: v in ("classic", "quorum"),
}
#: The exchange arguments the broker knows.
EXCHANGE_ARGUMENTS: dict[str, Callable[[Any], bool]] = {
    "alternate-exchange": _name,
    "hash-header": _name,  # x-consistent-hash: hash this header, not the routing key
}

PublishResult = tuple[int, int]  # (publish tag, number of queues routed to)

#: Reads log records back by LSN: ``(rtype, payload)`` each, or why it could not.
ReadLog = Callable[[Sequence[int]], list[tuple[int, bytes] | str]]
_ENQUEUE = int(rec.RecordType.ENQUEUE)  # (a plain int: compared once per replayed record)
# Paged-out messages are read back from the log this many at once.
PAGE_IN_BATCH = 1024


class BrokerState:
    """Every exchange, queue, binding, channel and delivery of one broker, and the log
    and timer bookkeeping around them."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        boot_id: str = "0",
        config: CoreConfig = CoreConfig(),
        read_log: ReadLog | None = None,
    ) -> None:
        """``clock``: monotonic seconds (ack timeouts, leases); ``wall_clock``: epoch
        seconds (timestamps, TTLs, the deduplication window); ``boot_id`` makes lease
        ids and generated names unique across restarts; ``read_log``: how to read
        logged records back (without it nothing is paged out and every message stays
        in memory)."""
        self.clock = clock
        self.wall_clock = wall_clock
        self.boot_id = boot_id
        self.config = config
        self.consumer_timeout_s = config.consumer_timeout_s
        self.default_lease_s = config.default_lease_s
        self.max_lease_s = config.max_lease_s
        self.channel_credit_bytes = config.channel_buffer_bytes
        self.max_queues = config.max_queues
        self.max_exchanges = config.max_exchanges
        self.max_prefetch = config.max_prefetch
        self.read_log = read_log
        self.memory_messages_per_queue = config.queue_memory_messages
        # queues whose tail may hold messages to page out once their records are written
        self._page_out_due: dict[str, Queue] = {}
        # compaction: (new LSN, seq, [(queue, in-memory entry or None if paged out)]) of
        # records logged again, applied to the queues once the new copy is written
        self._relocations: list[tuple[int, int, list[tuple[Queue, Entry | PagedRefs]]]] = []

        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self._queues_by_id: dict[int, Queue] = {}
        self.channels: dict[int, Channel] = {}
        self.dedup = DedupWindow(config.dedup_window_s)
        self.users = UserStore()

        self._next_seq = 1
        self._next_qid = 1
        self._next_channel = 1
        self._next_name = 1
        self._next_consumer = 1

        # log
        self.last_lsn = 0  # LSN of the last record produced
        self.durable_lsn = 0  # every record up to this LSN is on disk
        self._records: list[tuple[int, bytes]] = []
        self._first_pending_lsn = 1
        self._settles: dict[int, list[int]] = {}
        self._delivered_marks: dict[int, list[int]] = {}
        # (seq, delivery count) of messages delivered more than once, by qid
        self._count_marks: dict[int, list[tuple[int, int]]] = {}
        # (seq, due in ms since the epoch) of messages held back by a delay, by qid
        self._delay_marks: dict[int, list[tuple[int, int]]] = {}
        # queues holding delayed messages to page out once their records are written
        self._delays_to_page_out: dict[str, Queue] = {}
        # smooth weighted round-robin state of weighted multi-queue gets, by (names, weights)
        self._get_weights: dict[tuple[tuple[str, ...], tuple[int, ...]], list[int]] = {}
        # a transaction was committed since the last take_effects(): its records must
        # stay in one write group (AppendRecords.together)
        self._keep_together = False
        # recovered queues whose timers (delays, expiries, x-expires) are not yet set
        self._queues_to_schedule: list[Queue] = []
        # messages dead-lettered, by (queue, reason); dropped dead letters by reason
        self.dead_letter_drops: dict[str, int] = {}
        # (lsn, message, queues routed to) of ENQUEUE records not yet durable
        self._unsynced: list[tuple[int, Message, list[Queue]]] = []
        self.storage_ok = True
        self.storage_reason = ""
        # why persistent publishes are refused although the log takes writes (the disk
        # is nearly full: its space reserve is used up), or None
        self.publish_refusal: str | None = None
        # False while the broker shuts down: nothing more is handed to consumers.
        self.delivering = True

        # locks and schedules (coordstate.py); _coord_pending: take_effects() has
        # coordination work (grants waiting for the log, timers to start after recovery)
        self.coord = CoordState()
        self._coord_pending = False

        self._effects: list[Effect] = []
        self._dirty_queues: dict[str, Queue] = {}
        # queues with parked long-polls that received messages: after dispatch, those
        # still holding ready messages wake their getters (consumers may be full)
        self._getter_checks: dict[str, Queue] = {}
        self._confirm_dirty: dict[int, Channel] = {}
        self._timers: list[tuple[float, int, int]] = []  # (deadline, channel id, tag)
        self._timers_compact_at = _TIMERS_COMPACT_MIN

        # recovery state: the messages of each queue by qid; None once recovery finished
        self._replay: dict[int, ReplayIndex] | None = None
        # deduplication entries of the logged publishes replayed, in log order
        self._replay_dedup_digests: array[int] = array("Q")
        #: LSN ranges of the records on disk while ``finish_recovery`` runs
        self._log_spans: Sequence[tuple[int, int]] | None = None
        #: ``(queue, count, lowest LSN)`` of queued-message references recovery dropped
        #: because their records are not on disk (see ``finish_recovery``)
        self.dropped_references: list[tuple[str, int, int]] = []
        self._replay_dedup_ms: array[int] = array("q")
        self._replay_dedup_from = 0.0
        self._replay_messages: dict[int, Message] = {}

        self.stats = {
            "published": 0,
            "delivered": 0,
            "acked": 0,
            "confirmed": 0,
            "nacked": 0,
            "returned": 0,
            "deduplicated": 0,
        }

        for name, etype in BUILTIN_EXCHANGES.items():
            self.exchanges[name] = Exchange(name, etype, True, False, False, {}, builtin=True)
        self.channels[REST_CHANNEL] = Channel(REST_CHANNEL, credit=1 << 62)

    if TYPE_CHECKING:
        # Methods one part of the core calls on another (defined in the modules named
        # by the section each belongs to; see broker.py for the whole class).
        def _append(self, rtype: int, payload: bytes) -> int: ...

        def _apply_relocations(self, durable: int) -> None: ...

        # coordination (locks.py, schedules.py, coordlog.py)
        def _coord_take_effects(self) -> None: ...

        def _wake_coordination(self, now: float) -> None: ...

        def _schedule_due(self, name: str, stamp: int | None) -> None: ...

        def _coordination_records(self) -> list[tuple[int, bytes]]: ...

        def _replay_coordination(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None: ...

        def _replay_logged_enqueue(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None: ...

        def _binding_durable(self, src: Exchange, key: tuple[str, str]) -> bool: ...

        def _channel(self, channel_id: int) -> Channel: ...

        def _count_delivery(self, queue: Queue, entry: Entry) -> None: ...

        def _dead_letter(self, queue: Queue, entry: Entry, reason: str) -> None: ...

        def _hold_back(self, queue: Queue, entry: Entry, due: float) -> None: ...

        def _schedule_queue(self, queue: Queue) -> None: ...

        def _touch_queue(self, queue: Queue) -> None: ...

        def _hand_over(self, queue: Queue) -> None: ...

        def _page_out_delays(self) -> None: ...

        def _enqueue(self, queue: Queue, message: Message, wall: float, *, due: float | None = None) -> None: ...

        def _delete_exchange(self, exchange: Exchange) -> None: ...

        def _delete_queue(self, queue: Queue, reason: str) -> int: ...

        def _dispatch_dirty(self) -> None: ...

        def _finish_delivery(self, ch: Channel, d: Delivery) -> None: ...

        def _forget_binding_dest(self, source: str, dest: Any) -> None: ...

        def _lease_id(self, channel_id: int, tag: int) -> str: ...

        def _page_out(self) -> None: ...

        def _pop_live(self, queue: Queue) -> Entry | None: ...

        def _check_settles_writable(self, queue: Queue, what: str) -> None: ...

        def _wake_queue(self, queue: Queue, now: float) -> None: ...

        def _entry_of(self, queue: Queue, loc: int, r: Any) -> Entry: ...

        def _delay_return(self, queue: Queue, entry: Entry, due: float) -> None: ...

        def _expire_head(self, queue: Queue) -> None: ...

        def _move(
            self,
            origin: Queue | None,
            entry: Entry | None,
            exchange_name: str,
            routing_key: str,
            properties: dict[str, Any] | None,
            body: bytes,
            targets: list[Queue],
            wall: float,
            *,
            due: float | None = None,
            dedup_id: str | None = None,
        ) -> int: ...

        def _pop(self, queue: Queue) -> Entry | None: ...

        def _page_in(self, queue: Queue) -> None: ...

        def _publish_tagged(
            self,
            ch: Channel,
            tag: int,
            exchange_name: str,
            routing_key: str,
            body: bytes,
            properties: dict[str, Any] | None,
            mandatory: bool,
            delay_s: float | None,
        ) -> int: ...

        def _tx_publish(
            self,
            ch: Channel,
            exchange_name: str,
            routing_key: str,
            body: bytes,
            properties: dict[str, Any] | None,
            mandatory: bool,
            delay_s: float | None,
        ) -> int: ...

        def _tx_settle(
            self, ch: Channel, kind: str, tag: int, multiple: bool, requeue: bool, delay_s: float | None
        ) -> None: ...

        def _lookup_delivery(self, ch: Channel, tag: int) -> Delivery: ...

        def ack(self, channel_id: int, delivery_tag: int, multiple: bool = False) -> int: ...

        def nack(
            self,
            channel_id: int,
            delivery_tag: int,
            multiple: bool = False,
            requeue: bool = True,
            *,
            delay_s: float | None = None,
        ) -> int: ...

        def _load_paged(self, queue: Queue) -> None: ...

        def _push_timer(self, deadline: float, channel_id: int, tag: int) -> None: ...

        def _queue(self, name: str, channel_id: int = REST_CHANNEL) -> Queue: ...

        def _read_entries(self, queue: Queue, pairs: list[tuple[int, int]]) -> list[Entry]: ...

        def _release_confirms(self) -> None: ...

        def _remove_consumer(self, consumer: Consumer, *, auto_delete: bool = True) -> None: ...

        def _requeue_deliveries(
            self, ch: Channel, deliveries: list[Delivery], *, taken: bool = False, delay_s: float | None = None
        ) -> None: ...

        def _reset_deadline(self, ch: Channel, d: Delivery, deadline: float) -> None: ...

        def _settle_entry(self, queue: Queue, entry: Entry) -> None: ...

        def route(self, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None) -> list[Queue]: ...

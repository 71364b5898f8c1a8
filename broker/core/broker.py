"""The broker state machine.

Theory of operation
-------------------

:class:`Broker` holds every exchange, queue, binding, channel, consumer and unsettled
delivery, and changes them only in response to commands: method calls such as
:meth:`Broker.publish`, :meth:`Broker.ack` or :meth:`Broker.advance` (time passed).
It performs no IO. What the outside world must do as a consequence accumulates as
effects (:mod:`broker.core.effects`) that the IO layer collects with
:meth:`Broker.take_effects`:

* events for channels (``Deliver``, ``Confirm``, ``Return``, ``ConsumerCancelled``,
  ``DeliveryExpired``);
* records for the log (``AppendRecords``), numbered by LSN in the order the core
  produced them; the IO layer reports back with :meth:`Broker.durable` once records
  up to an LSN are on disk, or :meth:`Broker.storage_failed` when they could not be
  written;
* wake-ups for parked long-polls (``QueueReady``).

A publisher confirm waits inside the core for the LSN of its message's ``ENQUEUE``
record (LSN 0 when nothing needed writing), so the channel code never knows whether
storage exists. Deliveries to consumers go out before the record is durable, as in
RabbitMQ; a consumer may therefore see a message whose publish is later nacked.

Time and identity arrive from outside: ``clock()`` is a monotonic clock for ack
timeouts and leases, ``wall_clock()`` the epoch clock for message timestamps, TTLs
and the deduplication window; ``boot_id`` makes lease ids and server-generated names
unique across restarts.

Flow control: each channel holds a byte *credit* granted by the IO layer as it
drains the channel's outgoing buffer; deliveries stop while the credit is spent and
resume when more is granted, so a consumer that stops reading never makes the broker
buffer without bound.

Channel 0 always exists: it is the REST API's channel, owner of the leases handed out
by ``POST /queues/{name}/get`` and of one-shot REST publishes.

Components
----------

``Broker`` is the facade over a few components, each owning its data and taking its
collaborators in its constructor (built here, in dependency order):

* ``log`` (:class:`MessageLog`, log.py): records and LSNs, lazy marks, storage state,
  the deduplication window, confirm release;
* ``store`` (:class:`QueueStore`, queues.py): queues, their lanes, paging (``pager``,
  pager.py), delays and queue timers (``delays``, delays.py), expiry (``expiry``,
  expiry.py); a queue's timer firing (``queue_timers``, queuetimers.py) and parked
  long-polls (``long_polls``, longpolls.py) work through it;
* ``topology`` (:class:`Topology`, topology.py): exchanges, bindings, routing;
* ``dead_letters`` (deadletter.py): dead letters and redrive;
* ``deliveries`` (:class:`Deliveries`, delivery.py): channels, consumers, unacked
  deliveries, settling and ack deadlines; ``leases`` (leases.py) and ``publishing``
  (publishing.py) and ``transactions`` (transactions.py) work through it, and
  ``held_dead_letters`` (heldletters.py: a cluster's dead letters for other nodes),
  ``replies`` (directreply.py: direct reply-to's reply consumers and replies);
* ``coordination`` (coordlog.py): locks (locks.py) and schedules (schedules.py);
* ``accounts`` (:class:`Users`, users.py): users and tokens (``Broker.users`` is
  their store, read by the API to authenticate);
* ``recovery`` (replay.py) and ``snapshots`` (snapshot.py), which work through the
  others; ``compaction`` (compaction.py) and ``browser`` (browsing.py);
* ``durability`` (durability.py): the log's feedback (``durable``,
  ``storage_failed``) and confirms held from outside; ``queue_controls``
  (queuecontrols.py): a replicated queue's bounds, set from outside; ``deadlines``
  (deadlines.py): the timer heap read and fired (``next_deadline``, ``advance``).

What they truly share is passed in as small objects (shared.py): the ``Outbox`` of
effects, the ``Wakeups`` (queues to dispatch, long-polls to wake), the counters
(``stats``), the ``TimerHeap`` (timers.py), and the two clocks. The queue store calls
back three components built after it (dead letters, deliveries, topology), named once
with ``QueueStore.connect``.

The commands are the components' own methods, bound here once (``self.publish =
publishing.publish``): a command costs no extra call through the facade. What stays
here is what needs them all: ``take_effects``, the views and the totals.
"""

from __future__ import annotations

from collections.abc import Callable

from .browsing import Browser
from .compaction import Compaction
from .config import CoreConfig
from .connections import Connections
from .constants import (
    BUILTIN_EXCHANGES,
    DELIVERY_OVERHEAD_BYTES,
    REST_CHANNEL,
    PublishResult,
)
from .coordlog import Coordination
from .coordstate import CoordState
from .deadletter import DeadLetters
from .deadlines import Deadlines
from .dedup import DedupWindow
from .delays import Delays
from .delivery import Deliveries
from .directreply import DirectReplies
from .durability import Durability
from .effects import Effect
from .entities import ChannelState, Exchange, Queue
from .expiry import Expiry
from .heldletters import HeldDeadLetters
from .leases import Leases
from .locks import CoordTimer, Locks
from .log import MessageLog, ReadLog
from .longpolls import LongPolls
from .pager import Pager
from .publishing import Publishing
from .queuecontrols import QueueControls
from .queueinfo import queue_info
from .queues import QueueStore
from .queuetimers import QueueTimers
from .replay import Recovery
from .schedules import Schedules
from .shared import Outbox, Wakeups, new_stats
from .snapshot import Snapshots
from .timers import TimerHeap
from .topology import Topology
from .totals import Totals
from .transactions import Transactions
from .users import Users
from .userstore import UserStore
from .views import BrokerViews

__all__ = [
    "Broker",
    "REST_CHANNEL",
    "BUILTIN_EXCHANGES",
    "PublishResult",
    "DELIVERY_OVERHEAD_BYTES",
]


class Broker:
    """Every entity of one broker and the rules that tie them together: the one
    facade over the core's components (see the module docstring)."""

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
        clocks = {"clock": clock, "wall_clock": wall_clock}
        self._outbox = outbox = Outbox()
        self._wakeups = wakeups = Wakeups()
        #: broker-wide message counters (published, delivered, acked, confirmed, ...)
        self.stats = stats = new_stats()
        self._timers = timers = TimerHeap()
        #: running counts behind totals() (ready, unacked, consumers), kept as they change
        self.counts = counts = Totals()

        self.log = log = MessageLog(outbox, stats, dedup_window_s=config.dedup_window_s, read_log=read_log)
        self.delays = delays = Delays(log, timers, **clocks, auto_delete_grace_s=config.auto_delete_grace_s)
        self.pager = pager = Pager(log, delays, outbox, **clocks, repair=config.repair)
        self.expiry = expiry = Expiry(log, pager, outbox, wall_clock=wall_clock)
        self.store = store = QueueStore(
            log, delays, pager, expiry, outbox, wakeups, counts, **clocks, boot_id=boot_id,
            max_queues=config.max_queues, memory_messages_per_queue=config.queue_memory_messages,
        )
        self.queue_timers = queue_timers = QueueTimers(
            store, log, delays, pager, expiry, outbox, wakeups, wall_clock=wall_clock
        )
        self.long_polls = long_polls = LongPolls(store, delays, outbox, wakeups)
        self.topology = topology = Topology(store, log, max_exchanges=config.max_exchanges)
        self.dead_letters = dead_letters = DeadLetters(store, topology, log, outbox, wakeups, wall_clock=wall_clock)
        self.connections = connections = Connections(store)
        self.deliveries = deliveries = Deliveries(
            store, delays, dead_letters, log, timers, outbox, wakeups, stats, **clocks, boot_id=boot_id, config=config,
            connections=connections,
        )
        store.connect(
            dead_letter=dead_letters.dead_letter,
            cancel_consumers=deliveries.queue_deleted,
            drop_bindings=topology.queue_deleted,
            channel=deliveries.channel,
            owner_of=deliveries.owner_of,
        )
        expiry.connect(dead_letter=dead_letters.dead_letter)
        self.held_dead_letters = held = HeldDeadLetters(deliveries, log)
        dead_letters.connect(
            hold=held.hold, elsewhere=held.reaches_other_nodes, majority=held.needs_majority, hold_confirm=held.hold_confirm
        )
        self.replies = replies = DirectReplies(deliveries, outbox, backlog_bytes=16 * config.channel_buffer_bytes)
        self.publishing = publishing = Publishing(
            deliveries, topology, store, dead_letters, log, outbox, stats, wall_clock=wall_clock, replies=replies
        )
        self.queue_controls = queue_controls = QueueControls(store, publishing, wakeups)
        self.transactions = transactions = Transactions(deliveries, publishing, log)
        self.leases = leases = Leases(
            deliveries, store, delays, dead_letters, log, stats, clock=clock, boot_id=boot_id, config=config
        )
        self.accounts = users = Users(append=log.append, wall_clock=wall_clock)
        coord = CoordState()
        coord_timer = CoordTimer(coord, timers)
        locks = Locks(coord, coord_timer, deliveries, outbox, append=log.append, **clocks)
        schedules = Schedules(coord, coord_timer, log, topology, store, outbox, stats, **clocks)
        self.coordination = coordination = Coordination(
            coord, coord_timer, locks, schedules, outbox, log, wall_clock=wall_clock
        )
        self.compaction = compaction = Compaction(store, deliveries, log)
        self.durability = durability = Durability(log, deliveries, store, delays, compaction)
        self.deadlines = deadlines = Deadlines(timers, store, queue_timers, coordination, deliveries, clock=clock)
        self.browser = browser = Browser(store, deliveries, pager, log)
        self.recovery = recovery = Recovery(
            log, store, topology, pager, delays, coordination, users, wall_clock=wall_clock
        )
        self.snapshots = snapshots = Snapshots(
            log, store, topology, deliveries, users.store, coordination, wall_clock=wall_clock
        )

        # ---- the commands: the components' methods, bound once
        # topology
        self.declare_exchange = topology.declare_exchange
        self.delete_exchange = topology.delete_exchange
        self.bind = topology.bind
        self.unbind = topology.unbind
        self.list_bindings = topology.list_bindings
        self.route = topology.route
        self.route_publish = topology.route_publish
        self.auto_delete_exchanges_here = topology.auto_delete_exchanges_here
        # queues
        self.declare_queue = store.declare_queue
        self.delete_queue = store.delete_queue
        self.purge_queue = store.purge_queue
        self.queue_info = queue_info
        self.park_getter = long_polls.park_getter
        self.unpark_getter = long_polls.unpark_getter
        self.browse = browser.browse
        self.redrive = dead_letters.redrive
        self.hold_dead_letters = held.hold_on
        self.settle_held_dead_letter = held.settle
        self.copy_held_dead_letter = dead_letters.copy_held
        # publishing and deliveries
        self.publish = publishing.publish
        self.hold_confirm = publishing.hold_confirm
        self.settle_held_confirm = publishing.settle_held_confirm
        self.remember_message_id = publishing.remember_message_id
        self.refuse_publish = publishing.refuse_publish
        self.open_channel = deliveries.open_channel
        self.close_channel = deliveries.close_channel
        self.grant_credit = deliveries.grant_credit
        self.consume = deliveries.consume
        self.cancel = deliveries.cancel
        self.consumer_active = deliveries.consumer_active
        self.qos = deliveries.qos
        self.ack = deliveries.ack
        self.nack = deliveries.nack
        self.reject = deliveries.reject
        self.touch = deliveries.touch
        self.reserve_delivery_tag = deliveries.reserve_tag
        self.reply_consume, self.reply_cancel = replies.reply_consume, replies.reply_cancel
        self.hold_consumer_tag, self.release_consumer_tag = deliveries.tags.hold, deliveries.tags.release
        self.open_connection = connections.open_connection
        self.join_connection = deliveries.join_connection
        self.close_connection = connections.close_connection
        self.tx_select = transactions.tx_select
        self.tx_commit = transactions.tx_commit
        self.tx_publishes = transactions.tx_publishes
        self.tx_rollback = transactions.tx_rollback
        # leases (REST gets)
        self.get = leases.get
        self.channel_get = leases.channel_get
        self.get_any = leases.get_any
        self.ack_leases = leases.ack_leases
        self.nack_leases = leases.nack_leases
        self.extend_leases = leases.extend_leases
        # users
        self.put_user = users.put_user
        self.set_permissions = users.set_permissions
        self.delete_user = users.delete_user
        self.add_token = users.add_token
        self.revoke_token = users.revoke_token
        # locks and schedules
        self.lock_acquire = locks.lock_acquire
        self.lock_cancel_wait = locks.lock_cancel_wait
        self.lock_forget_channel = locks.lock_forget_channel
        self.lock_refresh = locks.lock_refresh
        self.lock_release = locks.lock_release
        self.lock_info = locks.lock_info
        self.lock_list = locks.lock_list
        self.put_schedule = schedules.put_schedule
        self.delete_schedule = schedules.delete_schedule
        self.pause_schedule = schedules.pause_schedule
        self.schedule_info = schedules.schedule_info
        self.schedule_list = schedules.schedule_list
        self.schedule_body = schedules.schedule_body
        # recovery, checkpoints, compaction
        self.begin_recovery = recovery.begin_recovery
        self.replay = recovery.replay
        self.finish_recovery = recovery.finish_recovery
        self.snapshot = snapshots.snapshot
        self.relocate = compaction.relocate
        # the log's feedback, and confirms held from outside
        self.durable = durability.durable
        self.storage_failed = durability.storage_failed
        self.storage_recovered = durability.storage_recovered
        self.refuse_publishes = durability.refuse_publishes
        self.accept_publishes = durability.accept_publishes
        self.hold_confirms = durability.hold_confirms
        self.release_held_confirms = durability.release_held_confirms
        self.nack_held_confirms = durability.nack_held_confirms
        # a replicated queue's bounds, set from outside
        self.refuse_queue = queue_controls.refuse_queue
        self.persist_messages = queue_controls.persist_messages
        self.hold_deliveries = queue_controls.hold_deliveries
        self.restore_message = queue_controls.restore_message
        # time
        self.next_deadline = deadlines.next_deadline
        self.earliest_timer = deadlines.earliest_timer
        self.advance = deadlines.advance

    # ------------------------------------------------------------ read-only views

    @property
    def exchanges(self) -> dict[str, Exchange]:
        """Every exchange, by name (the topology's)."""
        return self.topology.exchanges

    @property
    def queues(self) -> dict[str, Queue]:
        """Every queue, by name (the queue store's)."""
        return self.store.queues

    @property
    def channels(self) -> dict[int, ChannelState]:
        """Every open channel, by id (the deliveries')."""
        return self.deliveries.channels

    @property
    def users(self) -> UserStore:
        """Users and tokens, for authentication."""
        return self.accounts.store

    @property
    def coord(self) -> CoordState:
        """Locks and schedules, for metrics."""
        return self.coordination.coord

    @property
    def dedup(self) -> DedupWindow:
        return self.log.dedup

    @property
    def dead_letter_drops(self) -> dict[str, int]:
        return self.dead_letters.drops

    @property
    def durable_lsn(self) -> int:
        return self.log.durable_lsn

    @property
    def storage_ok(self) -> bool:
        return self.log.storage_ok

    @property
    def storage_reason(self) -> str:
        return self.log.storage_reason

    @property
    def publish_refusal(self) -> str | None:
        return self.log.publish_refusal

    @property
    def dropped_references(self) -> list[tuple[str, int, int]]:
        """``(queue, count, lowest LSN)`` of queued-message references recovery dropped
        because their records are not on disk (see ``Recovery.finish_recovery``)."""
        return self.recovery.dropped_references

    # ----------------------------------------------- settable by the IO layer

    @property
    def last_lsn(self) -> int:
        """LSN of the last record produced (set by recovery to the checkpoint's)."""
        return self.log.last_lsn

    @last_lsn.setter
    def last_lsn(self, lsn: int) -> None:
        self.log.last_lsn = lsn

    @property
    def read_log(self) -> ReadLog | None:
        """How logged records are read back (set by recovery once the log is open)."""
        return self.log.read_log

    @read_log.setter
    def read_log(self, read_log: ReadLog | None) -> None:
        self.log.read_log = read_log

    @property
    def delivering(self) -> bool:
        """False while the broker shuts down: nothing more is handed to consumers."""
        return self.deliveries.delivering

    @delivering.setter
    def delivering(self, on: bool) -> None:
        self.deliveries.delivering = on

    # ---------------------------------------------------------------- effects

    @property
    def views(self) -> BrokerViews:
        """Read-only queries for the edges (:mod:`broker.core.views`): the API reads
        the core through these, never through its live dicts."""
        return BrokerViews(self)

    def take_effects(self) -> list[Effect]:
        """Settle pending work (dispatch, confirms, log records) and hand over the effects."""
        self.store.start_recovered_timers()
        if self.coordination.coord.pending:  # (may publish ticks: before dispatch)
            self.coordination.take_effects()
        if self._wakeups.dispatch:
            self.deliveries.dispatch_due()
        self.long_polls.ready_getters()
        # Records logged before the marks (publishes, declares...) have waiters.
        self.log.take_records()
        if self.log.has_confirms_due():
            self.log.release_confirms()
        return self._outbox.take()

    # ----------------------------------------------------------------- totals

    def totals(self) -> dict[str, int]:
        """Broker-wide counts for ``GET /overview`` and the metrics, in O(1): read from
        the running counts (``counts``: totals.py), not summed over every queue."""
        counts = self.counts
        channels = self.deliveries.channels
        return {
            "exchanges": len(self.topology.exchanges),
            "queues": len(self.store.queues),
            # (not the REST channel, nor the one holding a cluster's dead letters)
            "channels": len(channels) - 1 - (self.held_dead_letters.channel_id in channels),
            "consumers": counts.consumers,
            "messages": counts.ready + counts.unacked,
            "messages_ready": counts.ready,
            "messages_unacked": counts.unacked,
        }

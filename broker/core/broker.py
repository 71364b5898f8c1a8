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
"""

from __future__ import annotations

from . import records as rec
from .browsing import BrowsingMixin
from .compaction import CompactionMixin
from .coordlog import CoordLogMixin
from .deadletter import DeadLetterMixin
from .delays import DelaysMixin
from .delivery import DeliveryMixin
from .effects import (
    AppendRecords,
    Effect,
    QueueReady,
)
from .leases import LeasesMixin
from .publishing import PublishingMixin
from .replay import ReplayMixin
from .settling import SettlingMixin
from .snapshot import SnapshotMixin
from .state import (
    BUILTIN_EXCHANGES,
    DELIVERY_OVERHEAD_BYTES,
    REST_CHANNEL,
    BrokerState,
    PublishResult,
)
from .timers import TimersMixin
from .topology import TopologyMixin
from .transactions import TransactionsMixin
from .users import UsersMixin
from .views import BrokerViews

__all__ = [
    "Broker",
    "REST_CHANNEL",
    "BUILTIN_EXCHANGES",
    "PublishResult",
    "DELIVERY_OVERHEAD_BYTES",
]


class Broker(
    TopologyMixin,
    PublishingMixin,
    CompactionMixin,
    DeliveryMixin,
    SettlingMixin,
    LeasesMixin,
    DeadLetterMixin,
    DelaysMixin,
    BrowsingMixin,
    TransactionsMixin,
    UsersMixin,
    CoordLogMixin,
    TimersMixin,
    ReplayMixin,
    SnapshotMixin,
    BrokerState,
):
    """Every entity of one broker and the rules that tie them together.

    The commands are spread over the mixins by job (see :mod:`broker.core.state`);
    this class adds the outbox of effects and the log's feedback.
    """

    @property
    def views(self) -> BrokerViews:
        """Read-only queries for the edges (:mod:`broker.core.views`): the API reads
        the core through these, never through its live dicts."""
        return BrokerViews(self)

    def take_effects(self) -> list[Effect]:
        """Settle pending work (dispatch, confirms, log records) and hand over the effects."""
        if self._queues_to_schedule:
            self._start_recovered_timers()
        if self._coord_pending:  # (may publish ticks: before dispatch)
            self._coord_take_effects()
        if self._dirty_queues:
            self._dispatch_dirty()
        if self._getter_checks:
            for queue in self._getter_checks.values():
                if queue.getters and queue.has_ready() and not queue.deleted:
                    self._effects.append(QueueReady(queue.name))
            self._getter_checks.clear()
        # Records logged before the marks (publishes, declares...) have waiters.
        lazy = not self._records
        if self._settles or self._delivered_marks or self._count_marks or self._delay_marks:
            self._flush_marks()
        if self._records:
            records = self._records
            self._records = []
            self._effects.append(
                AppendRecords(records, self._first_pending_lsn, self.last_lsn, lazy, self._keep_together)
            )
            self._keep_together = False
            self._first_pending_lsn = self.last_lsn + 1
        if self._confirm_dirty:
            self._release_confirms()
        effects = self._effects
        self._effects = []
        return effects

    def _start_recovered_timers(self) -> None:
        """Recovered queues' timers start now: due delays, expiries, and x-expires
        (whose unused time starts over at a restart)."""
        for queue in self._queues_to_schedule:
            if not queue.deleted:
                queue.unused_since = self.clock()
                self._schedule_queue(queue)
        self._queues_to_schedule = []

    def _append(self, rtype: int, payload: bytes) -> int:
        if self._replay is not None:
            return 0
        self._records.append((rtype, payload))
        self.last_lsn += 1
        return self.last_lsn

    def _flush_marks(self) -> None:
        if self._replay is not None:
            self._settles.clear()
            self._delivered_marks.clear()
            self._count_marks.clear()
            self._delay_marks.clear()
            return
        for qid, seqs in self._delivered_marks.items():
            self._append(rec.RecordType.DELIVERED, rec.encode_seqs(qid, seqs))
        self._delivered_marks.clear()
        for qid, pairs in self._count_marks.items():
            self._append(rec.RecordType.DELIVERY_COUNTS, rec.encode_counts(qid, pairs))
        self._count_marks.clear()
        # before the settles: a message delayed and then settled in one step stays settled
        for qid, pairs in self._delay_marks.items():
            self._append(rec.RecordType.DELAY, rec.encode_counts(qid, pairs))
        self._delay_marks.clear()
        for qid, seqs in self._settles.items():
            self._append(rec.RecordType.SETTLE, rec.encode_seqs(qid, seqs))
        self._settles.clear()

    def durable(self, lsn: int) -> None:
        """Records up to ``lsn`` are on disk: release the confirms that waited on them."""
        if lsn <= self.durable_lsn:
            return
        self.durable_lsn = lsn
        unsynced = self._unsynced
        if unsynced:
            i = 0
            while i < len(unsynced) and unsynced[i][0] <= lsn:
                i += 1
            del unsynced[:i]
        for ch in self.channels.values():
            if len(ch.confirms):
                self._confirm_dirty[ch.id] = ch
        if self._relocations and self._relocations[0][0] <= lsn:
            self._apply_relocations(lsn)
        if self._page_out_due:
            self._page_out()
        if self._delays_to_page_out:
            self._page_out_delays()

    def storage_failed(self, first_lsn: int, last_lsn: int, reason: str) -> None:
        """Records ``first_lsn``..``last_lsn`` could not be written.

        Publishes that waited on them are nacked, their messages leave the queues they
        have not yet left and are forgotten by the deduplication window (so a resend
        is taken again), and persistent publishes are refused until
        :meth:`storage_recovered`.
        """
        self.storage_ok = False
        self.storage_reason = reason
        if self._relocations:  # copies never written: the messages stay where they were
            self._relocations = [r for r in self._relocations if not first_lsn <= r[0] <= last_lsn]
        for ch in self.channels.values():
            if ch.confirms.fail_lsns(first_lsn, last_lsn, f"storage failure: {reason}"):
                self._confirm_dirty[ch.id] = ch
        failed = [item for item in self._unsynced if first_lsn <= item[0] <= last_lsn]
        if not failed:
            return
        self._unsynced = [item for item in self._unsynced if not first_lsn <= item[0] <= last_lsn]
        by_queue: dict[str, set[int]] = {}
        for _lsn, message, queues in failed:
            mid = message.message_id
            if mid is not None:
                self.dedup.forget(message.exchange, mid)
            for routed in queues:
                by_queue.setdefault(routed.name, set()).add(message.seq)
        for qname, seqs in by_queue.items():
            queue = self.queues.get(qname)
            if queue is not None:
                queue.remove_entries(seqs)

    def refuse_publishes(self, reason: str) -> None:
        """Refuse persistent publishes to durable queues (nacked with ``reason``) while
        settles still go through: the disk is nearly full, and what space is left is
        kept for the acks and checkpoints that free it."""
        self.publish_refusal = reason

    def accept_publishes(self) -> None:
        self.publish_refusal = None

    def storage_recovered(self) -> None:
        """Writes succeed again: accept persistent publishes again."""
        self.storage_ok = True
        self.storage_reason = ""

    def totals(self) -> dict[str, int]:
        ready = unacked = 0
        for q in self.queues.values():
            ready += q.ready_count()
            unacked += q.unacked
        return {
            "exchanges": len(self.exchanges),
            "queues": len(self.queues),
            "channels": len(self.channels) - 1,
            "consumers": sum(len(ch.consumers) for ch in self.channels.values()),
            "messages_ready": ready,
            "messages_unacked": unacked,
        }

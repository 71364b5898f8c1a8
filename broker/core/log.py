"""The core's side of the write-ahead log: records out, durability back, confirms.

:class:`MessageLog` numbers the records the components append (LSNs, in the order the
core produced them) and hands them out as one ``AppendRecords`` effect per
``take_effects()``; it keeps the lazily written marks (settles, delivered marks,
delivery counts, delay due times: written with the next batch, waited for by nobody),
the publishes whose ENQUEUE record is not yet durable (so a storage failure can take
them back), the state of storage (failing, or refusing persistent publishes), the
deduplication window of logged publishes, and releases publisher confirms once the
record each waits for is durable. It also holds ``read_log``, how paged-out records are
read back.

During recovery (``replaying``) nothing is appended: replay rebuilds state from
records that are already in the log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import records as rec
from .dedup import DedupWindow
from .effects import AppendRecords, Confirm
from .entities import ChannelState, Queue
from .errors import Unavailable
from .message import Entry, StoredMessage
from .shared import Outbox

__all__ = ["MessageLog", "ReadLog"]

#: Reads log records back by LSN: ``(rtype, payload)`` each, or why it could not.
ReadLog = Callable[[Sequence[int]], list[tuple[int, bytes] | str]]


class MessageLog:
    """Records, LSNs, lazy marks, storage state, deduplication and confirms (see the
    module docstring)."""

    def __init__(
        self, outbox: Outbox, stats: dict[str, int], *, dedup_window_s: float, read_log: ReadLog | None
    ) -> None:
        self._outbox = outbox
        self._stats = stats
        #: how to read logged records back (None: nothing is paged out)
        self.read_log = read_log
        self.last_lsn = 0  # LSN of the last record produced
        self.durable_lsn = 0  # every record up to this LSN is on disk
        #: True while recovery replays records: nothing is appended then
        self.replaying = False
        self._records: list[tuple[int, bytes]] = []
        self._first_pending_lsn = 1
        # a transaction was committed since the last batch: its records must stay in
        # one write group (AppendRecords.together)
        self._keep_together = False
        # lazy marks, by qid: settled seqs, first deliveries, (seq, count) of later
        # ones, (seq, due in ms since the epoch) of messages held back by a delay
        self._settles: dict[int, list[int]] = {}
        self._delivered: dict[int, list[int]] = {}
        self._counts: dict[int, list[tuple[int, int]]] = {}
        self._delays: dict[int, list[tuple[int, int]]] = {}
        # (lsn, message, queues routed to) of ENQUEUE records not yet durable
        self._unsynced: list[tuple[int, StoredMessage, list[Queue]]] = []
        self.storage_ok = True
        self.storage_reason = ""
        #: why persistent publishes are refused although the log takes writes (the
        #: disk is nearly full: its space reserve is used up), or None
        self.publish_refusal: str | None = None
        self.dedup = DedupWindow(dedup_window_s)
        # channels with confirms that may be released
        self._confirm_dirty: dict[int, ChannelState] = {}
        #: LSNs whose confirms also wait for an outside word (``Broker.hold_confirms``:
        #: a replicated queue's records wait for a majority of replicas); empty on a
        #: single node, so the release costs nothing more there
        self.held: set[int] = set()

    # ------------------------------------------------------------- appending

    def append(self, rtype: int, payload: bytes) -> int:
        """Queue one record for the log; return its LSN (0 while replaying)."""
        if self.replaying:
            return 0
        self._records.append((rtype, payload))
        self.last_lsn += 1
        return self.last_lsn

    def append_message(self, rtype: int, payload: bytes, message: StoredMessage, queues: list[Queue]) -> int:
        """Append the record that carries ``message`` into ``queues`` (ENQUEUE, MOVE or
        SCHEDULE_TICK), number the message with its LSN, and remember it until the
        record is durable (see :meth:`fail`). ``queues`` must be a list of its own."""
        if self.replaying:
            return 0
        self._records.append((rtype, payload))  # (append() written out: once per message)
        self.last_lsn = lsn = self.last_lsn + 1
        message.lsn = lsn
        self._unsynced.append((lsn, message, queues))
        return lsn

    def keep_together(self) -> None:
        """The records appended since the last batch are one transaction's: the log
        keeps them in one write group."""
        self._keep_together = True

    # ---------------------------------------------------------------- marks

    def settle_entry(self, queue: Queue, entry: Entry) -> None:
        """``entry`` left ``queue`` for good: log it settled (lazily) if it was logged."""
        if queue.persistent_log and entry.message.persistent and not queue.deleted:
            self._settles.setdefault(queue.qid, []).append(entry.message.seq)

    def settle_seqs(self, qid: int, seqs: list[int]) -> None:
        """Log messages ``seqs`` of queue ``qid`` settled (lazily)."""
        self._settles.setdefault(qid, []).extend(seqs)

    def mark_delivered(self, qid: int, seq: int) -> None:
        self._delivered.setdefault(qid, []).append(seq)

    def mark_count(self, qid: int, seq: int, count: int) -> None:
        self._counts.setdefault(qid, []).append((seq, count))

    def mark_delay(self, qid: int, seq: int, due_ms: int) -> None:
        self._delays.setdefault(qid, []).append((seq, due_ms))

    def forget_queue(self, qid: int) -> None:
        """Queue ``qid`` is deleted: its pending marks are moot."""
        self._settles.pop(qid, None)
        self._delivered.pop(qid, None)
        self._counts.pop(qid, None)
        self._delays.pop(qid, None)

    def _flush_marks(self) -> None:
        if self.replaying:
            self._settles.clear()
            self._delivered.clear()
            self._counts.clear()
            self._delays.clear()
            return
        for qid, seqs in self._delivered.items():
            self.append(rec.RecordType.DELIVERED, rec.encode_seqs(qid, seqs))
        self._delivered.clear()
        for qid, pairs in self._counts.items():
            self.append(rec.RecordType.DELIVERY_COUNTS, rec.encode_counts(qid, pairs))
        self._counts.clear()
        # before the settles: a message delayed and then settled in one step stays settled
        for qid, pairs in self._delays.items():
            self.append(rec.RecordType.DELAY, rec.encode_counts(qid, pairs))
        self._delays.clear()
        for qid, seqs in self._settles.items():
            self.append(rec.RecordType.SETTLE, rec.encode_seqs(qid, seqs))
        self._settles.clear()

    def take_records(self) -> None:
        """Emit the records appended since the last call (and the marks) as one
        ``AppendRecords`` effect. A batch of marks alone is ``lazy``: nobody waits
        for it."""
        lazy = not self._records
        if self._settles or self._delivered or self._counts or self._delays:
            self._flush_marks()
        if self._records:
            records = self._records
            self._records = []
            self._outbox.emit(
                AppendRecords(records, self._first_pending_lsn, self.last_lsn, lazy, self._keep_together)
            )
            self._keep_together = False
            self._first_pending_lsn = self.last_lsn + 1

    def recovered(self, last_lsn: int) -> None:
        """Recovery ended with the log holding records up to ``last_lsn``, all durable."""
        self.replaying = False
        self.last_lsn = max(self.last_lsn, last_lsn)
        self.durable_lsn = self.last_lsn
        self._first_pending_lsn = self.last_lsn + 1

    # ------------------------------------------------------------ durability

    def durable(self, lsn: int) -> bool:
        """Records up to ``lsn`` are on disk; return whether that is news."""
        if lsn <= self.durable_lsn:
            return False
        self.durable_lsn = lsn
        unsynced = self._unsynced
        if unsynced:
            i = 0
            while i < len(unsynced) and unsynced[i][0] <= lsn:
                i += 1
            del unsynced[:i]
        return True

    def fail(self, first_lsn: int, last_lsn: int, reason: str) -> list[tuple[int, StoredMessage, list[Queue]]]:
        """Records ``first_lsn``..``last_lsn`` could not be written: storage is failing
        from now on. Returns the publishes they carried (forgotten by the
        deduplication window here; the caller takes them out of their queues)."""
        self.storage_ok = False
        self.storage_reason = reason
        failed = [item for item in self._unsynced if first_lsn <= item[0] <= last_lsn]
        if failed:
            self._unsynced = [item for item in self._unsynced if not first_lsn <= item[0] <= last_lsn]
            for lsn, message, _queues in failed:
                if message.message_id is not None:
                    self.dedup.forget(message.exchange, message.message_id, lsn)
        return failed

    def check_settles_writable(self, queue: Queue, what: str) -> None:
        """Raises Unavailable when settling ``queue``'s messages cannot be logged now."""
        if not self.storage_ok and queue.persistent_log:
            raise Unavailable(
                f"cannot {what} on queue {queue.name!r}: the log cannot be written "
                f"({self.storage_reason}); it would come undone at the next start",
                code="storage_failed",
            )

    # -------------------------------------------------------------- confirms

    def confirms_due(self, ch: ChannelState) -> None:
        """``ch`` has confirms that may be released at the next ``take_effects()``."""
        self._confirm_dirty[ch.id] = ch

    def forget_channel(self, channel_id: int) -> None:
        self._confirm_dirty.pop(channel_id, None)

    def has_confirms_due(self) -> bool:
        return bool(self._confirm_dirty)

    def release_confirms(self) -> None:
        """Emit a ``Confirm`` for every confirm whose record is durable (coalesced per
        channel with ``multiple``), after the ``Return`` held for its tag."""
        durable = self.durable_lsn
        emit = self._outbox.emit
        stats = self._stats
        waiting = self.held
        for ch in self._confirm_dirty.values():
            for tag, multiple, ack, reason in ch.confirms.release(durable, waiting):
                held = ch.confirms.take_returns(tag)
                if held:
                    self._outbox.extend(held)  # type: ignore[arg-type]
                emit(Confirm(ch.id, tag, multiple, ack, reason))
                answered = tag - ch.last_released_tag if multiple else 1
                ch.last_released_tag = tag
                stats["confirmed" if ack else "nacked"] += answered
        self._confirm_dirty.clear()

"""Replay: rebuilding the broker from a checkpoint and the log at start.

A table maps each record type to its handler (``REPLAY_HANDLERS``), in the manner of
h11's transition tables. Replay is idempotent: a checkpoint and the log after it may
overlap. Queued messages stay paged out (indexed by LSN) and are restored in order by
``finish_recovery``.

:class:`Recovery` works through the components: it declares queues in the queue store,
exchanges and bindings in the topology, hands users and coordination their records,
and keeps only what recovery itself needs (each queue's index of messages, the
deduplication entries to load at the end).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import compress
from typing import Any

from . import records as rec
from .constants import _ENQUEUE
from .coordlog import COORD_RECORD_TYPES, Coordination
from .dedup import digest_utf8
from .delays import Delays
from .entities import Exchange, Queue
from .lanes import split_by_level
from .log import MessageLog
from .message import Entry, Message
from .pager import Pager
from .paging import ReplayIndex, mark_all_delivered, on_disk_mask
from .queues import QueueStore
from .records import RecordType
from .topology import Topology
from .users import Users

__all__ = ["Recovery"]


class Recovery:
    """Replay (see the module docstring)."""

    def __init__(
        self,
        log: MessageLog,
        queues: QueueStore,
        topology: Topology,
        pager: Pager,
        delays: Delays,
        coordination: Coordination,
        users: Users,
        *,
        wall_clock: Callable[[], float],
    ) -> None:
        self._log = log
        self._store = queues
        self._topology = topology
        self._exchanges = topology.exchanges
        self._queues = queues.queues
        self._by_id = queues.by_id
        self._pager = pager
        self._delays = delays
        self._coordination = coordination
        self._users = users
        self._dedup = log.dedup
        self._wall_clock = wall_clock
        # the messages of each queue by qid; None outside recovery
        self._replay: dict[int, ReplayIndex] | None = None
        self._replay_messages: dict[int, Message] = {}
        # deduplication entries of the logged publishes replayed, in log order
        self._replay_dedup_digests: array[int] = array("Q")
        self._replay_dedup_ms: array[int] = array("q")
        self._replay_dedup_from = 0.0
        self._next_seq = 1  # above every message seq replayed so far
        #: LSN ranges of the records on disk while ``finish_recovery`` runs
        self._log_spans: Sequence[tuple[int, int]] | None = None
        #: ``(queue, count, lowest LSN)`` of queued-message references recovery dropped
        #: because their records are not on disk (see ``finish_recovery``)
        self.dropped_references: list[tuple[str, int, int]] = []

    def begin_recovery(self) -> None:
        """Enter replay mode: records applied with :meth:`replay` rebuild state."""
        self._replay = {}
        self._log.replaying = True
        self._replay_messages = {}
        self._replay_dedup_digests = array("Q")
        self._replay_dedup_ms = array("q")
        self._next_seq = self._store.counters()[0]
        # publishes older than the window are not remembered (they would expire at once)
        window_s = self._dedup.window_s
        self._replay_dedup_from = self._wall_clock() - window_s if window_s > 0 else math.inf

    def replay(self, rtype: int, payload: bytes, lsn: int = 0) -> None:
        """Apply one logged record during recovery (idempotent): the handler for its
        type in ``REPLAY_HANDLERS``. ``lsn`` is 0 for a checkpoint's records.

        Raises ValueError for an unknown record type."""
        state = self._replay
        assert state is not None, "replay outside recovery"
        log = self._log
        if lsn > log.last_lsn:
            log.last_lsn = lsn
        if rtype == _ENQUEUE and lsn:
            # the bulk of every recovery: one test, no table lookup
            self._replay_logged_enqueue(state, payload, lsn, rtype)
            return
        handler = REPLAY_HANDLERS.get(rtype)
        if handler is None:
            raise ValueError(f"unknown record type {rtype}")
        handler(self, state, payload, lsn, rtype)

    def _replay_logged_enqueue(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        """A logged publish: the queues index it by LSN; its body stays on disk."""
        # A logged publish: the queues index it by LSN; its body stays on disk.
        seq, wall_s, expires, qids, exchange_utf8, id_utf8 = rec.peek_enqueue(payload)
        if seq >= self._next_seq:
            self._next_seq = seq + 1
        loc = lsn << 1
        prio = -1
        for qid in qids:
            entries = state.get(qid)
            if entries is not None:
                if expires:
                    entries.expiring[seq] = expires
                if entries.prios is None:
                    entries.add(seq, loc, update=True)
                    continue
                if prio < 0:
                    prio = rec.peek_priority(payload)
                entries.add(seq, loc, update=True, prio=prio)
        if id_utf8 is not None and wall_s >= self._replay_dedup_from:
            # loaded into the window in one go at the end of recovery
            self._replay_dedup_digests.append(digest_utf8(exchange_utf8, id_utf8))
            self._replay_dedup_ms.append(round(wall_s * 1000.0))

    def _replay_whole_enqueue(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        """A message written whole into a checkpoint (checkpoints before QUEUE_REFS): there is no log record to page it out to, so it is kept in memory."""
        # A message written whole into a checkpoint (checkpoints before QUEUE_REFS):
        # there is no log record to page it out to, so it is kept in memory.
        r = rec.decode_enqueue(payload)
        if r.seq >= self._next_seq:
            self._next_seq = r.seq + 1
        message = self._replay_messages.get(r.seq)
        for qid in r.qids:
            entries = state.get(qid)
            if entries is None or r.seq in entries:
                continue
            if message is None:
                message = Message(
                    r.seq, r.exchange, r.routing_key, r.body, r.properties, r.expires_at, owned=True
                )
                self._replay_messages[r.seq] = message
            queue = self._by_id[qid]
            expires = r.expires_at
            if queue.message_ttl_s is not None and r.wall_s:
                # wall_s is 0 in checkpoints, whose expires_at already holds the TTL
                q_exp = r.wall_s + queue.message_ttl_s
                expires = q_exp if expires is None else min(expires, q_exp)
            entries.add_whole(r.seq, Entry(message, False, expires))
            if r.expires_at is not None:
                entries.expiring[r.seq] = r.expires_at
        if r.message_id is not None:
            self._dedup.remember(r.exchange, r.message_id, r.wall_s, 0)

    def _replay_queue_refs(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        """QUEUE_REFS or PRIORITY_REFS: a checkpoint's references to queued messages."""
        if rtype == RecordType.PRIORITY_REFS:
            qid, prio, pairs = rec.decode_priority_refs(payload)
        else:
            (qid, pairs), prio = rec.decode_refs(payload), 0
        entries = state.get(qid)
        if entries is not None:
            it = iter(pairs)
            top = 0
            add = entries.add
            for seq, loc in zip(it, it):
                add(seq, loc, update=False, prio=prio)
                if seq > top:
                    top = seq
            if top >= self._next_seq:
                self._next_seq = top + 1

    def _replay_expires(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        """EXPIRES: when a checkpoint's queued messages with their own expiration expire."""
        qid, pairs = rec.decode_counts(payload)
        entries = state.get(qid)
        if entries is not None:
            for seq, expires_ms in pairs:
                entries.expiring[seq] = expires_ms / 1000.0

    def _replay_settle(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        qid, seqs = rec.decode_seqs(payload)
        entries = state.get(qid)
        if entries is not None:
            for seq in seqs:
                entries.settle(seq)

    def _replay_delivered(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        qid, seqs = rec.decode_seqs(payload)
        entries = state.get(qid)
        if entries is not None:
            for seq in seqs:
                entries.mark_delivered(seq)

    def _replay_pairs(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        """DELIVERY_COUNTS or DELAY: ``(seq, value)`` pairs of one queue; the larger
        value wins (both only grow)."""
        qid, pairs = rec.decode_counts(payload)
        entries = state.get(qid)
        if entries is not None:
            raise_ = entries.raise_count if rtype == RecordType.DELIVERY_COUNTS else entries.raise_due
            for seq, value in pairs:
                raise_(seq, value)

    def _replay_move(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        """A message leaving one queue for others (dead letter, redrive, delayed
        publish): settled in its origin, indexed in its new queues by this record."""
        origin_qid, origin_seq, due, enqueue = rec.decode_move(payload)
        origin = state.get(origin_qid) if origin_qid else None
        if origin is not None:
            origin.settle(origin_seq)
        if not lsn:
            raise ValueError("MOVE record in a checkpoint")
        self._replay_logged_enqueue(state, enqueue, lsn, rtype)
        if due is not None:
            seq, _wall, _expires, qids, _exchange, _id = rec.peek_enqueue(enqueue)
            due_ms = round(due * 1000.0)
            for qid in qids:
                entries = state.get(qid)
                if entries is not None:
                    entries.raise_due(seq, due_ms)

    def _replay_declare_queue(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        d = rec.decode_json(payload)
        qid = d["qid"]
        if qid in self._by_id:
            return
        replaced = self._queues.get(d["name"])
        if replaced is not None:
            self._drop_replay_queue(replaced)
        queue = Queue(qid, d["name"], True, None, d.get("auto_delete", False), d.get("arguments", {}))
        self._store.add_recovered(queue)
        state[qid] = ReplayIndex(priorities=queue.max_priority is not None)

    def _replay_delete_queue(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        d = rec.decode_json(payload)
        deleted = self._by_id.get(d["qid"])
        if deleted is not None:
            self._drop_replay_queue(deleted)

    def _replay_declare_exchange(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        d = rec.decode_json(payload)
        if d["name"] in self._exchanges and not self._exchanges[d["name"]].builtin:
            old_ex = self._exchanges[d["name"]]
            if old_ex.settings() == (d["type"], True, d.get("auto_delete", False), d.get("internal", False), d.get("arguments", {})):
                return
            self._topology.remove_exchange(old_ex)
        if d["name"] not in self._exchanges:
            self._exchanges[d["name"]] = Exchange(
                d["name"], d["type"], True, d.get("auto_delete", False),
                d.get("internal", False), d.get("arguments", {}),
            )

    def _replay_delete_exchange(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        d = rec.decode_json(payload)
        ex = self._exchanges.get(d["name"])
        if ex is not None and not ex.builtin:
            self._topology.remove_exchange(ex)

    def _replay_binding(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        d = rec.decode_json(payload)
        src = self._exchanges.get(d["exchange"])
        to_exchange = "to_exchange" in d
        dname = d["to_exchange"] if to_exchange else d["queue"]
        if src is None or (dname not in (self._exchanges if to_exchange else self._queues)):
            return
        key = ("x" if to_exchange else "q", dname)
        if rtype == RecordType.BIND:
            if src.table.add(key, d["routing_key"], d.get("arguments", {})):
                target: Any = self._exchanges[dname] if to_exchange else self._queues[dname]
                target.bound_from.add(src.name)
        else:
            if src.table.remove(key, d["routing_key"], d.get("arguments", {})):
                # as unbind() does live: keep bound_from in step with the table
                if not any(bk[0] == key for bk in src.table.bindings):
                    self._topology.forget_binding_dest(src.name, key)

    def _replay_dedup_digests_record(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        self._dedup.load_payload(payload)

    def _replay_dedup_batch(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        """checkpoints written before DEDUP_DIGESTS"""
        exchange, window = rec.decode_dedup_batch(payload)
        remember = self._dedup.remember
        for message_id, wall in window:
            remember(exchange, message_id, wall, 0)

    def _replay_dedup(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        """one entry a record: checkpoints written before DEDUP_BATCH"""
        exchange, message_id, wall = rec.decode_dedup(payload)
        self._dedup.remember(exchange, message_id, wall, 0)

    def _replay_meta(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        d = rec.decode_json(payload)
        self._store.recovered_counters(0, d.get("next_qid", 1))
        self._next_seq = max(self._next_seq, d.get("next_seq", 1))

    def _replay_user(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        self._users.replay(rtype, payload)

    def _replay_coordination(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        enqueue = self._coordination.replay(rtype, payload, lsn)
        if enqueue is not None:  # a schedule's tick: its message, as a logged publish
            self._replay_logged_enqueue(state, enqueue, lsn, rtype)

    def _drop_replay_queue(self, queue: Queue) -> None:
        assert self._replay is not None
        self._replay.pop(queue.qid, None)
        self._topology.queue_deleted(queue)
        self._store.drop_recovered(queue)

    def finish_recovery(
        self,
        last_lsn: int,
        *,
        assume_delivered: bool = False,
        log_spans: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        """Leave replay mode: queues take their recovered contents in original order.
        Messages that were delivered and unacked at the crash come back redelivered.

        ``log_spans``: the LSN ranges ``[first, end)`` of the records on disk. A queued
        message whose record is outside them is dropped (and counted in
        ``dropped_references``) instead of blocking its queue: a checkpoint only refers
        to records synced before it was put in place, so such a reference can only be
        to a publish that was never confirmed (written by a broker that did not keep
        that rule, or nacked after a failed write). The deduplication window read from
        the checkpoint is then emptied, so that a resend of such a publish is taken.

        ``assume_delivered`` (after an unclean stop): mark every recovered message
        redelivered. Delivered marks are logged lazily (a delivery does not wait for an
        fsync), so after a crash the log cannot tell which messages a consumer saw;
        AMQP's ``redelivered`` means "may have been delivered before", and a message
        that was delivered, or even acked, must not come back looking fresh."""
        state = self._replay
        assert state is not None
        self._store.recovered_counters(self._next_seq, 0)
        self._log_spans = log_spans
        for qid, entries in state.items():
            queue = self._by_id[qid]
            self._restore_queue(queue, entries, assume_delivered)
            for seq, expires in entries.expiring.items():
                if seq in entries:  # (one delayed is indexed too: found gone at its time)
                    queue.expiring.add(seq, expires)
            if queue.max_length_bytes is not None:
                queue.ready_bytes = queue.count_ready_bytes()
                self._pager.load_paged(queue)
            if queue.delayed or queue.message_ttl_s is not None or queue.expires_s is not None or queue.expiring:
                # timers start with the next take_effects(): recovery may run where
                # the clock cannot be read (the runtime replays in a worker thread)
                self._store.schedule_when_started(queue)
        self._store.recount_totals()
        self._replay = None
        self._replay_messages = {}
        self._log_spans = None
        if self.dropped_references:
            # Ids of the dropped publishes may be among the checkpoint's entries
            # (which carry no LSN to tell them by); the log's own are loaded below.
            self._dedup.clear()
        self._log.recovered(last_lsn)
        self._dedup.load_entries(self._replay_dedup_digests, self._replay_dedup_ms)
        self._replay_dedup_digests = array("Q")
        self._replay_dedup_ms = array("q")
        self._dedup.prune(self._wall_clock())

    def _restore_queue(self, queue: Queue, entries: ReplayIndex, assume_delivered: bool) -> None:
        """Give a queue its recovered messages in sequence order: those indexed by LSN
        stay paged out (read back when their turn comes), those recovered whole (from a
        checkpoint of an older format) stay in memory. The in-memory part must precede
        the paged-out one, so messages indexed by LSN that precede a whole one, or any
        when there is no log to read, are read back at once.

        Messages still delayed go to the queue's delayed messages, paged out there
        too. Delivery counts above one follow their messages."""
        counts = {seq: c for seq, c in entries.counts.items() if c > 1 and seq in entries}
        due_seqs, due_ms = entries.due_after(self._wall_clock() * 1000.0)
        logged = entries.logged()
        if logged is not None and self._log.read_log is not None:
            seqs, locs, prios = logged
            if self._log_spans is not None:
                mask = on_disk_mask(locs, self._log_spans)
                if mask is not None:
                    self._note_dropped(queue, [loc >> 1 for loc, on in zip(locs, mask) if not on])
                    seqs = array("q", compress(seqs, mask))
                    locs = array("q", compress(locs, mask))
                    if prios is not None:
                        prios = array("B", compress(prios, mask))
            if assume_delivered:
                locs = mark_all_delivered(locs)
            if due_seqs:
                seqs, locs, prios = self._restore_delayed(queue, seqs, locs, prios, due_seqs, due_ms)
            if prios is None or queue.max_priority is None:
                queue.lanes[0].paged.extend(seqs, locs)
            else:
                for level, (lane_seqs, lane_locs) in split_by_level(seqs, locs, prios, queue.max_priority):
                    queue.lanes[level].paged.extend(lane_seqs, lane_locs)
            queue.paged_counts = counts
            return
        last_whole = max((seq for seq, item in entries.extra.items() if type(item) is not int), default=0)
        if self._log.read_log is None:
            last_whole = 1 << 63
        pending: list[tuple[int, int]] = []
        dues = dict(zip(due_seqs, due_ms))  # (an older checkpoint's format: rare)
        top = queue.max_priority or 0
        spans = self._log_spans
        missing: list[int] = []
        for seq, item in entries.items():
            if type(item) is int:
                if spans is not None and on_disk_mask(array("q", [item]), spans) is not None:
                    missing.append(item >> 1)
                    continue
                loc = item | 1 if assume_delivered else item
                if seq in dues and self._log.read_log is not None:
                    queue.delayed.push_paged(dues[seq], seq, loc)
                    if seq in counts:
                        queue.paged_counts[seq] = counts[seq]
                elif seq < last_whole:
                    pending.append((seq, loc))
                else:
                    queue.lanes[min(entries.priority(seq), top)].paged.append(seq, loc)
                    if seq in counts:
                        queue.paged_counts[seq] = counts[seq]
            else:
                assert isinstance(item, Entry)
                if pending:
                    self._restore_read(queue, pending)
                    pending = []
                if assume_delivered and not item.deliveries:
                    item.deliveries = 1
                item.deliveries = max(item.deliveries, counts.get(seq, 0))
                if seq in dues:
                    self._delays.hold_back(queue, item, dues[seq] / 1000.0)
                else:
                    queue.lane_for(item.message).ready.append(item)
        if missing:
            self._note_dropped(queue, missing)
        if pending:
            self._restore_read(queue, pending)
        for lane in queue.lanes:
            for entry in lane.ready:
                entry.deliveries = max(entry.deliveries, counts.get(entry.message.seq, 0))

    def _note_dropped(self, queue: Queue, lsns: list[int]) -> None:
        """References of ``queue`` to the records ``lsns``, not on disk, were dropped."""
        self.dropped_references.append((queue.name, len(lsns), min(lsns)))

    def _restore_read(self, queue: Queue, pending: list[tuple[int, int]]) -> None:
        """Read messages back at recovery into the ready part of their lanes (those
        that must precede a message recovered whole)."""
        for entry in self._pager.read_entries(queue, pending):
            queue.lane_for(entry.message).ready.append(entry)

    def _restore_delayed(
        self,
        queue: Queue,
        seqs: array[int],
        locs: array[int],
        prios: array[int] | None,
        due_seqs: array[int],
        due_ms: array[int],
    ) -> tuple[array[int], array[int], array[int] | None]:
        """Move the still-delayed messages among ``seqs`` (paged out, locators
        ``locs``, priorities ``prios``; sorted by seq, as are ``due_seqs``) to the
        queue's delayed messages, paged out there too; return what is left for the
        ready index."""
        keep = bytearray(b"\x01") * len(seqs)
        found = array("q")  # indexes into seqs/locs, and their due times
        found_due = array("q")
        n = len(seqs)
        for seq, due in zip(due_seqs, due_ms):
            i = bisect_left(seqs, seq)
            if i < n and seqs[i] == seq:  # (not settled since)
                keep[i] = 0
                found.append(i)
                found_due.append(due)
        queue.delayed.extend_paged(found_due, (seqs[i] for i in found), (locs[i] for i in found))
        kept_prios = None if prios is None else array("B", compress(prios, keep))
        return array("q", compress(seqs, keep)), array("q", compress(locs, keep)), kept_prios


_Handler = Callable[[Recovery, dict[int, ReplayIndex], bytes, int, int], None]
#: Record type -> how replay applies it. A logged ENQUEUE (the bulk of any log) is
#: handled before the lookup; the ENQUEUE entry serves checkpoints' whole messages.
REPLAY_HANDLERS: dict[int, _Handler] = {
    RecordType.ENQUEUE: Recovery._replay_whole_enqueue,
    RecordType.QUEUE_REFS: Recovery._replay_queue_refs,
    RecordType.PRIORITY_REFS: Recovery._replay_queue_refs,
    RecordType.SETTLE: Recovery._replay_settle,
    RecordType.DELIVERED: Recovery._replay_delivered,
    RecordType.DELIVERY_COUNTS: Recovery._replay_pairs,
    RecordType.DELAY: Recovery._replay_pairs,
    RecordType.EXPIRES: Recovery._replay_expires,
    RecordType.MOVE: Recovery._replay_move,
    RecordType.DECLARE_QUEUE: Recovery._replay_declare_queue,
    RecordType.DELETE_QUEUE: Recovery._replay_delete_queue,
    RecordType.DECLARE_EXCHANGE: Recovery._replay_declare_exchange,
    RecordType.DELETE_EXCHANGE: Recovery._replay_delete_exchange,
    RecordType.BIND: Recovery._replay_binding,
    RecordType.UNBIND: Recovery._replay_binding,
    RecordType.DEDUP_DIGESTS: Recovery._replay_dedup_digests_record,
    RecordType.DEDUP_BATCH: Recovery._replay_dedup_batch,
    RecordType.DEDUP: Recovery._replay_dedup,
    RecordType.META: Recovery._replay_meta,
    RecordType.USER: Recovery._replay_user,
    RecordType.USER_DELETE: Recovery._replay_user,
    RecordType.TOKEN: Recovery._replay_user,
    RecordType.TOKEN_DELETE: Recovery._replay_user,
}
# Locks and schedules (coordlog.py)
for _rtype in COORD_RECORD_TYPES:
    REPLAY_HANDLERS[_rtype] = Recovery._replay_coordination

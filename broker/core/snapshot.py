"""Snapshots: the live state as records, for a checkpoint.

Produced in chunks, so that the runtime can write a checkpoint while serving: the
entities, each queue's message references (QUEUE_REFS, by LSN), the deduplication
window and the counters.

:class:`Snapshots` reads every component that holds durable state: the topology, the
queue store (and the deliveries' unacked messages), the log's deduplication window,
users and coordination.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator

from . import records as rec
from .constants import DEDUP_BATCH_ENTRIES
from .coordlog import Coordination
from .delivery import Deliveries
from .entities import Queue
from .log import MessageLog
from .message import Entry
from .paging import locator
from .queues import QueueStore, queue_record
from .topology import Topology, binding_record
from .userstore import UserStore

__all__ = ["Snapshots"]


class Snapshots:
    """Snapshots (see the module docstring)."""

    def __init__(
        self,
        log: MessageLog,
        queues: QueueStore,
        topology: Topology,
        deliveries: Deliveries,
        users: UserStore,
        coordination: Coordination,
        *,
        wall_clock: Callable[[], float],
    ) -> None:
        self._log = log
        self._store = queues
        self._topology = topology
        self._deliveries = deliveries
        self._users = users
        self._coordination = coordination
        self._wall_clock = wall_clock

    def snapshot(self, chunk_entries: int = 4096) -> tuple[int, Iterator[list[tuple[int, bytes]]]]:
        """A checkpoint of the durable state, as (LSN covered, chunks of records).

        The chunks are produced lazily so the caller can interleave them with
        serving; state may change between chunks. That is safe because replay is
        idempotent: the checkpoint holds every effect of records up to the LSN, plus
        possibly some later ones, which replaying the log after the LSN re-applies
        harmlessly. Call ``take_effects()`` first so the LSN covers every record.
        """
        covered = self._log.last_lsn
        # The window is pruned as publishes arrive; an idle broker would otherwise
        # carry expired entries into every checkpoint (and keep them in memory).
        self._log.dedup.prune(self._wall_clock())
        return covered, self._snapshot_chunks(chunk_entries)

    def _snapshot_chunks(self, chunk_entries: int) -> Iterator[list[tuple[int, bytes]]]:
        T = rec.RecordType
        head: list[tuple[int, bytes]] = []
        for ex in list(self._topology.exchanges.values()):
            if ex.durable and not ex.builtin:
                head.append((T.DECLARE_EXCHANGE, rec.encode_json(ex.info())))
        queues = [q for q in self._store.queues.values() if q.persistent_log]
        for q in queues:
            head.append((T.DECLARE_QUEUE, rec.encode_json(queue_record(q))))
        for ex in list(self._topology.exchanges.values()):
            if not ex.durable:
                continue
            for (dest, key, _f), args in ex.table.bindings.items():
                if self._topology.binding_durable(ex, dest):
                    head.append((T.BIND, rec.encode_json(binding_record(ex.name, dest, key, args))))
        # One consistent cut of every queue's messages (ready, requeued and unacked),
        # taken in the same step as the head. Looking at the unacked deliveries and
        # at each queue at different times would lose a message delivered in
        # between: its ENQUEUE record is before the covered LSN, so only the
        # checkpoint can carry it. Only references are copied here; records are
        # encoded lazily, chunk by chunk.
        unacked: dict[int, list[Entry]] = {}
        for ch in list(self._deliveries.channels.values()):
            for d in ch.deliveries.values():
                if d.queue.persistent_log:
                    unacked.setdefault(d.queue.qid, []).append(d.entry)
        cut: list[
            tuple[
                Queue,
                list[Entry],
                list[tuple[int, tuple[array[int], int, int]]],
                dict[int, int],
                list[tuple[int, int]],
                list[tuple[int, int]],
            ]
        ] = []
        for q in queues:
            entries = q.held_entries()
            entries.extend(unacked.get(q.qid, ()))
            # paged-out delayed messages: referenced like ready ones, with their due times
            # (in sequence order: recovery indexes an ordered run without a dict)
            delayed_refs = array("q")
            for seq, loc in sorted((seq, loc) for _due_ms, seq, loc in q.delayed.paged_items()):
                delayed_refs.append(seq)
                delayed_refs.append(loc)
            # each lane's paged-out messages, by priority level (a plain queue: level 0)
            paged_cut = [(level, part) for level, lane in enumerate(q.lanes) for part in lane.paged.cut()]
            if delayed_refs:
                paged_cut.append((0, (delayed_refs, 0, len(delayed_refs))))
            # when messages that carry their own expiration expire (ms): the ready ones
            # indexed (paged out included), and the unacked ones, ready again after a restart
            expiring = [(seq, round(at * 1000.0)) for seq, at in q.expiring.items()]
            for e in unacked.get(q.qid, ()):
                if e.message.expires_at is not None and e.expires_at is not None:
                    expiring.append((e.message.seq, round(e.expires_at * 1000.0)))
            cut.append((q, entries, paged_cut, dict(q.paged_counts), q.delayed.due_times(), expiring))
        del unacked
        head.extend(self._users.snapshot_records(self._wall_clock()))
        yield head
        per_record = 2 * chunk_entries
        for q, entries, paged_cut, paged_counts, delays, expiring in cut:
            if q.deleted:
                continue  # its DELETE_QUEUE record follows the covered LSN
            qid = q.qid
            # Messages are referenced by the LSN of their ENQUEUE record, whose segment
            # the log keeps while it is referenced (QUEUE_REFS): bodies are not copied.
            for level, (chunk_array, start, stop) in paged_cut:
                for lo in range(start, stop, per_record):
                    yield [_refs_record(qid, level, chunk_array[lo : min(stop, lo + per_record)])]
            for lo in range(0, len(entries), chunk_entries):
                chunk: list[tuple[int, bytes]] = []
                refs: dict[int, array[int]] = {}  # by priority level
                delivered: list[int] = []
                for e in entries[lo : lo + chunk_entries]:
                    m = e.message
                    if not m.persistent:
                        continue
                    if m.lsn:
                        level = 0 if q.max_priority is None else min(m.priority, q.max_priority)
                        level_refs = refs.get(level)
                        if level_refs is None:
                            level_refs = refs[level] = array("q")
                        level_refs.append(m.seq)
                        level_refs.append(locator(m.lsn, e.deliveries > 0))
                        continue
                    # recovered whole from an older checkpoint: no record to refer to
                    chunk.append(
                        (
                            T.ENQUEUE,
                            rec.encode_enqueue(
                                m.seq, 0.0, e.expires_at, [qid], m.exchange, m.routing_key,
                                None, m.properties, m.body,
                            ),
                        )
                    )
                    if e.deliveries:
                        delivered.append(m.seq)
                for level, level_refs in refs.items():
                    chunk.append(_refs_record(qid, level, level_refs))
                if delivered:
                    chunk.append((T.DELIVERED, rec.encode_seqs(qid, delivered)))
                counts = [(e.message.seq, e.deliveries) for e in entries[lo : lo + chunk_entries] if e.deliveries > 1 and e.message.persistent]
                if counts:
                    chunk.append((T.DELIVERY_COUNTS, rec.encode_counts(qid, counts)))
                if chunk:
                    yield chunk
            # after the references they apply to (replay keeps the larger value)
            paged_pairs = sorted(paged_counts.items())
            for lo in range(0, len(paged_pairs), chunk_entries):
                yield [(T.DELIVERY_COUNTS, rec.encode_counts(qid, paged_pairs[lo : lo + chunk_entries]))]
            for lo in range(0, len(delays), chunk_entries):
                yield [(T.DELAY, rec.encode_counts(qid, delays[lo : lo + chunk_entries]))]
            for lo in range(0, len(expiring), chunk_entries):
                yield [(T.EXPIRES, rec.encode_counts(qid, expiring[lo : lo + chunk_entries]))]
        tail = [
            (T.DEDUP_DIGESTS, payload) for payload in self._log.dedup.checkpoint_payloads(DEDUP_BATCH_ENTRIES)
        ]
        tail.extend(self._coordination.checkpoint_records())  # locks, schedules, next token
        next_seq, next_qid = self._store.counters()
        tail.append((T.META, rec.encode_json({"next_seq": next_seq, "next_qid": next_qid})))
        yield tail


def _refs_record(qid: int, level: int, pairs: array[int]) -> tuple[int, bytes]:
    """The record referring to queued messages of priority ``level``: QUEUE_REFS for
    level 0 (and every plain queue), PRIORITY_REFS above it."""
    if level:
        return rec.RecordType.PRIORITY_REFS, rec.encode_priority_refs(qid, level, pairs)
    return rec.RecordType.QUEUE_REFS, rec.encode_refs(qid, pairs)

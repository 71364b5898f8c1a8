"""Compaction: logging again the few queued messages of mostly consumed segments.

After a checkpoint the runtime may ask to relocate records of sparse segments: their
live messages are logged again, and once the copies are durable the queues point at
the new LSNs, so the next checkpoint can delete the old segments.

:class:`Compaction` finds the messages in the queue store and the deliveries, logs the
copies with the log, and owns the relocations waiting for their copy to be durable.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from . import records as rec
from .delivery import Deliveries
from .entities import Queue
from .log import MessageLog
from .message import Entry
from .pager import logged_message
from .paging import PagedRefs
from .queues import QueueStore

__all__ = ["Compaction"]


class Compaction:
    """Compaction (see the module docstring)."""

    def __init__(self, queues: QueueStore, deliveries: Deliveries, log: MessageLog) -> None:
        self._store = queues
        self._deliveries = deliveries
        self._log = log
        # (new LSN, seq, [(queue, in-memory entry or paged-out index)]) of records
        # logged again, applied to the queues once the new copy is written
        self._relocations: list[tuple[int, int, list[tuple[Queue, Entry | PagedRefs]]]] = []

    def relocate(self, ranges: Sequence[tuple[int, int]]) -> int:
        """Log again every queued message whose ENQUEUE record's LSN is in one of
        ``ranges`` (``[first, end)`` pairs, sorted: segments whose other records are all
        settled), so that a later checkpoint no longer refers to those segments and they
        can be deleted. Returns how many records were logged.

        Each copy is an ENQUEUE record of the same message for the durable queues that
        still hold it (without the message id, so the deduplication window is left
        alone). Queues are pointed at a copy only once it is written (:meth:`durable`):
        until then, and for good if writing it fails, they keep the original.
        """
        read_log = self._log.read_log
        if read_log is None or not ranges or self._log.replaying:
            return 0
        starts = [lo for lo, _hi in ranges]
        lo_all, hi_all = ranges[0][0], ranges[-1][1]

        def inside(lsn: int) -> bool:
            if not lo_all <= lsn < hi_all:
                return False
            i = bisect_right(starts, lsn) - 1
            return i >= 0 and lsn < ranges[i][1]

        holders: dict[int, list[tuple[Queue, Entry | PagedRefs]]] = {}
        old_lsn: dict[int, int] = {}
        unacked: dict[int, list[Entry]] = {}
        for ch in self._deliveries.channels.values():
            for d in ch.deliveries.values():
                unacked.setdefault(d.queue.qid, []).append(d.entry)
        for queue in self._store.queues.values():
            if not queue.persistent_log or queue.deleted:
                continue
            for lane in queue.lanes:
                for chunk, start, stop in lane.paged.cut():
                    locs = chunk[start + 1 : stop : 2]
                    if not locs or (max(locs) >> 1) < lo_all or (min(locs) >> 1) >= hi_all:
                        continue
                    for k in range(start, stop, 2):
                        lsn = chunk[k + 1] >> 1
                        if inside(lsn):
                            seq = chunk[k]
                            holders.setdefault(seq, []).append((queue, lane.paged))
                            old_lsn[seq] = lsn
            entries = queue.held_entries()
            entries.extend(unacked.get(queue.qid, ()))
            for entry in entries:
                m = entry.message
                if m.lsn and inside(m.lsn):
                    holders.setdefault(m.seq, []).append((queue, entry))
                    old_lsn[m.seq] = m.lsn
        if not holders:
            return 0
        seqs = sorted(holders)
        results = read_log([old_lsn[seq] for seq in seqs])
        logged = 0
        for seq, result in zip(seqs, results):
            r = logged_message(result, seq, old_lsn[seq])
            if isinstance(r, str):
                continue  # unreadable: left where it is, reported when its turn comes
            qids = sorted({q.qid for q, _e in holders[seq]})
            payload = rec.encode_enqueue(
                seq, r.wall_s, r.expires_at, qids, r.exchange, r.routing_key, None, r.properties, r.body
            )
            new_lsn = self._log.append(rec.RecordType.ENQUEUE, payload)
            self._relocations.append((new_lsn, seq, holders[seq]))
            logged += 1
        return logged

    def durable(self, durable: int) -> None:
        """Records up to ``durable`` are on disk: queues now point at those copies."""
        relocations = self._relocations
        if not relocations or relocations[0][0] > durable:
            return
        i = 0
        while i < len(relocations) and relocations[i][0] <= durable:
            new_lsn, seq, holders = relocations[i]
            for _queue, holder in holders:
                if isinstance(holder, PagedRefs):
                    holder.relocate(seq, new_lsn)
                elif holder.message.seq == seq:
                    holder.message.lsn = new_lsn
            i += 1
        del relocations[:i]

    def failed(self, first_lsn: int, last_lsn: int) -> None:
        """Records ``first_lsn``..``last_lsn`` could not be written: their copies never
        will be, and the messages stay where they were."""
        if self._relocations:
            self._relocations = [r for r in self._relocations if not first_lsn <= r[0] <= last_lsn]

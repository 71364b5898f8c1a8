"""Paging: reading queued messages back from the log.

A durable queue keeps only ``queue_memory_messages`` ready messages in memory; the
rest are *paged out*: their bodies stay only in the log, indexed by the LSN of their
record (``paging.PagedRefs``), and are read back in batches when their turn comes
(:meth:`Pager.page_in`). A read that fails never discards a message (see
``page_in``); the queue retries with backoff on its timer.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import error as struct_error

from . import records as rec
from .constants import PAGE_IN_BATCH
from .delays import Delays
from .effects import LogReadFailed, MessageLost
from .entities import Queue
from .lanes import Lane
from .log import MessageLog
from .message import Entry, StoredMessage
from .shared import Outbox

__all__ = [
    "Pager",
    "logged_message",
    "READ_RETRY_MIN_S",
    "READ_RETRY_MAX_S",
    "READ_SET_ASIDE_ATTEMPTS",
    "retry_delay",
]

#: Backoff between tries to read a paged-out message back after a failure.
READ_RETRY_MIN_S = 0.05
READ_RETRY_MAX_S = 30.0
#: A transient read failure of a queue's head is retried in place this many times
#: (about 3 s of backoff: a passing EMFILE keeps the queue's order) before the message
#: is set aside so that the ones behind it are served.
READ_SET_ASIDE_ATTEMPTS = 6


def retry_delay(attempts: int) -> float:
    """How long a queue waits before its ``attempts``-th retry of a failed read."""
    return min(READ_RETRY_MAX_S, READ_RETRY_MIN_S * 2.0 ** (attempts - 1))


class Pager:
    """Reads paged-out messages back through ``log.read_log`` (see the module
    docstring); a failed read sets the queue's retry timer with ``delays``."""

    def __init__(
        self,
        log: MessageLog,
        delays: Delays,
        outbox: Outbox,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        repair: bool,
    ) -> None:
        self._log = log
        self._delays = delays
        self._outbox = outbox
        self._clock = clock
        self._wall_clock = wall_clock
        self._repair = repair

    def page_in(self, queue: Queue, lane: Lane | None = None) -> None:
        """Read the next paged-out messages of ``queue`` back into its in-memory head
        (of ``lane``: by default the lane the next message comes from).

        A read that fails never discards a message, and a ``LogReadFailed`` effect
        raises the alarm. The message and those after it go back to the front of the
        paged-out index and the queue delivers nothing more until a retry (with
        backoff, on the timer heap) reads it. But a *transient* failure (the operating
        system failed the read: the record may be intact) that outlasts
        ``READ_SET_ASIDE_ATTEMPTS`` retries sets that one message aside, held back like
        a delayed message until a retry reads it and puts it back in its place, while
        the messages behind it are served: a bad read never blocks a queue for good.
        When the very next record fails too, the log cannot be read at all: the queue
        waits as before. Only with ``repair`` is a record that is really
        unreadable (not a transient error) given up, as MessageLost."""
        if lane is None:
            lane = queue.next_lane()
            if lane is None:
                return
        set_aside = False  # one message per call: a second failure means the log is down
        while lane.paged and not lane.ready:
            if queue.read_blocked_until is not None:
                return  # a retry is scheduled (see QueueTimers.wake_queue)
            pairs = lane.paged.take(PAGE_IN_BATCH)
            read_log = self._log.read_log
            if read_log is None:
                raise RuntimeError("messages are indexed by LSN but the broker has no log to read")
            results = read_log([loc >> 1 for _seq, loc in pairs])
            failure: str | None = None
            ready = lane.ready
            i = 0
            for (seq, loc), result in zip(pairs, results):
                r = logged_message(result, seq, loc >> 1)
                if isinstance(r, str):
                    # a failed read keeps its ``transient`` flag; a wrong record is not
                    failure = result if isinstance(result, str) else r
                    break
                ready.append(self.entry_of(queue, loc, r))
                if queue.paged_counts:
                    queue.paged_counts.pop(seq, None)
                if queue.max_length_bytes is not None:  # (left paged by a failed read at start)
                    queue.ready_bytes += len(r.body)
                i += 1
            if failure is None:
                if queue.read_failure is not None and not set_aside:
                    queue.read_failure = None
                    queue.read_attempts = 0
                continue
            transient = bool(getattr(failure, "transient", False))
            seq, loc = pairs[i]
            if self._repair and not transient:
                # the operator chose to give up on unreadable records
                self._log.settle_seqs(queue.qid, [seq])
                self._outbox.emit(MessageLost(queue.name, seq, loc >> 1, failure))
                queue.totals.ready -= 1
                lane.paged.put_back(pairs[i + 1 :])
                continue
            queue.read_attempts += 1
            delay = retry_delay(queue.read_attempts)
            queue.read_failure = str(failure)
            self._outbox.emit(LogReadFailed(queue.name, loc >> 1, str(failure), transient, delay))
            if (
                transient
                and not set_aside
                and queue.read_attempts > READ_SET_ASIDE_ATTEMPTS
                and (len(pairs) > i + 1 or lane.paged)
            ):
                # held back like a delayed message: retried by QueueTimers._release_due,
                # which puts it back in its place once read (and backs off while it fails)
                set_aside = True
                queue.totals.ready -= 1  # (back in place, and counted, once read: Queue.requeue)
                queue.delayed.push_paged(round((self._wall_clock() + delay) * 1000.0), seq, loc)
                lane.paged.put_back(pairs[i + 1 :])
                self._delays.schedule_queue(queue)
                continue
            lane.paged.put_back(pairs[i:])
            queue.read_blocked_until = self._clock() + delay
            self._delays.schedule_queue(queue)
            return

    def load_paged(self, queue: Queue) -> None:
        """Read every paged-out message of ``queue`` into memory, counting its bytes
        (a recovered queue with ``x-max-length-bytes``, see ``Queue.ready_bytes``). A
        read that fails leaves the rest paged out: read when their turn comes."""
        read_log = self._log.read_log
        for lane in queue.lanes:
            while lane.paged and read_log is not None:
                pairs = lane.paged.take(PAGE_IN_BATCH)
                results = read_log([loc >> 1 for _seq, loc in pairs])
                for i, ((seq, loc), result) in enumerate(zip(pairs, results)):
                    r = logged_message(result, seq, loc >> 1)
                    if isinstance(r, str):
                        lane.paged.put_back(pairs[i:])
                        return
                    lane.ready.append(self.entry_of(queue, loc, r))
                    queue.paged_counts.pop(seq, None)
                    queue.ready_bytes += len(r.body)

    def entry_of(self, queue: Queue, loc: int, r: rec.EnqueueRecord) -> Entry:
        """The queue entry of a message read back from its record at ``loc``."""
        lsn = loc >> 1
        message = StoredMessage(
            r.seq, r.exchange, r.routing_key, r.body, r.properties, r.expires_at, owned=True, enqueued_at=r.wall_s
        )
        message.lsn = lsn
        expires = r.expires_at
        ttl = queue.message_ttl_s
        if ttl is not None and r.wall_s:
            q_exp = r.wall_s + ttl
            expires = q_exp if expires is None else min(expires, q_exp)
        return Entry(message, max(loc & 1, queue.paged_counts.get(r.seq, 0)), expires)

    def read_entries(self, queue: Queue, pairs: list[tuple[int, int]]) -> list[Entry]:
        """Entries for ``(seq, locator)`` pairs of ``queue``, read from the log (the
        restore of a queue from an older checkpoint, at recovery).

        A message whose record cannot be read (a damaged or missing segment) leaves the
        queue for good, reported as a MessageLost effect: recovery has already refused
        to start on a damaged log unless the operator asked to repair it."""
        read_log = self._log.read_log
        if read_log is None:
            raise RuntimeError("messages are indexed by LSN but the broker has no log to read")
        results = read_log([loc >> 1 for _seq, loc in pairs])
        out: list[Entry] = []
        for (seq, loc), result in zip(pairs, results):
            r = logged_message(result, seq, loc >> 1)
            if isinstance(r, str):
                self._log.settle_seqs(queue.qid, [seq])
                self._outbox.emit(MessageLost(queue.name, seq, loc >> 1, r))
                continue
            out.append(self.entry_of(queue, loc, r))
        return out


def logged_message(result: tuple[int, bytes] | str, seq: int, lsn: int) -> rec.EnqueueRecord | str:
    """Message ``seq``'s ENQUEUE record as read back from LSN ``lsn``, or why it is not."""
    if isinstance(result, str):
        return result
    rtype, payload = result
    due = None
    try:
        if rtype == rec.RecordType.MOVE:
            _qid, _seq, due, payload = rec.decode_move(payload)
        elif rtype == rec.RecordType.SCHEDULE_TICK:
            _name, _tick, payload = rec.decode_tick(payload)
        elif rtype != rec.RecordType.ENQUEUE:
            return f"record {lsn} is of type {rtype}, not a message"
        r = rec.decode_enqueue(payload)
        if due is not None and due > r.wall_s:
            r.wall_s = due  # a delayed publish enters its queues (and its TTL starts) when due
    except (ValueError, IndexError, UnicodeDecodeError, struct_error) as exc:
        return f"record {lsn} does not decode: {exc}"
    if r.seq != seq:
        return f"record {lsn} holds message {r.seq}, not {seq}"
    return r

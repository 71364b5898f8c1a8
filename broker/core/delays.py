"""Delays and queue timers: messages held back until a time, expiry at the head, and
queues that expire unused.

A nack or reject with a delay, or a publish with one, holds a message back in its
queue's delay heap until a wall-clock time (durable: a DELAY mark, or the MOVE record
of a delayed publish, carries the due time, so it holds across restarts); when due it
returns to its original place, ahead of messages published after it. Each queue has at
most one live entry on the broker's timer heap (``Queue.wake_at``), for the earliest of
its due delays, its next message to expire, a retry of a failed read from the log, and
(``x-expires``) the moment it has been unused long enough to be deleted. "Unused" is
RabbitMQ's: no consumers, no get, no redeclare; a restart starts the time over.

The methods here belong to :class:`~broker.core.broker.Broker`; they share its state
(:class:`~broker.core.state.BrokerState`).
"""

from __future__ import annotations

import heapq

from .effects import LogReadFailed
from .entities import Queue
from .errors import InvalidArgument
from .message import MAX_EXPIRATION_MS, Entry
from .publishing import READ_RETRY_MAX_S, READ_RETRY_MIN_S, _logged_message
from .state import BrokerState

__all__ = ["DelaysMixin", "MAX_DELAY_S", "check_delay"]

#: Longest delay: as long as the longest message TTL (2^32 - 1 ms, 49.7 days).
MAX_DELAY_S = MAX_EXPIRATION_MS / 1000.0
#: The channel id of a timer entry that wakes a queue (its tag is the queue's qid).
QUEUE_TIMER = -1


def check_delay(delay_s: object) -> float:
    """A delay in seconds from JSON: a number 0..MAX_DELAY_S. Raises InvalidArgument."""
    if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or not 0 <= delay_s <= MAX_DELAY_S:
        raise InvalidArgument(f"delay_s must be a number of seconds 0..{MAX_DELAY_S:g}")
    return float(delay_s)


class DelaysMixin(BrokerState):
    """Delays and queue timers (see the module docstring)."""

    def _hold_back(self, queue: Queue, entry: Entry, due: float) -> None:
        """Keep ``entry`` out of ``queue``'s ready messages until wall-clock ``due``:
        paged out at once when its record is written, else whole until it is."""
        message = entry.message
        earliest = queue.delayed.next_due()
        pageable = queue.persistent_log and message.persistent and message.lsn and self.read_log is not None
        if pageable and message.lsn <= self.durable_lsn:
            self._page_out_delayed(queue, due, entry)
        else:
            queue.delayed.push_entry(due, entry)
            if pageable:
                self._delays_to_page_out[queue.name] = queue
        if earliest is None or due < earliest:
            self._schedule_queue(queue)

    def _page_out_delayed(self, queue: Queue, due: float, entry: Entry) -> None:
        seq = entry.message.seq
        if entry.deliveries > 1:
            queue.paged_counts[seq] = entry.deliveries
        queue.delayed.push_paged(round(due * 1000.0), seq, (entry.message.lsn << 1) | (entry.deliveries > 0))

    def _page_out_delays(self) -> None:
        """Records are durable up to ``durable_lsn``: page out the delayed messages
        they hold (called from ``durable()``)."""
        for name, queue in list(self._delays_to_page_out.items()):
            if not queue.deleted:
                for due, entry in queue.delayed.take_pageable(self.durable_lsn):
                    self._page_out_delayed(queue, due, entry)
            if queue.deleted or not queue.delayed.has_unwritten():
                del self._delays_to_page_out[name]

    def _delay_return(self, queue: Queue, entry: Entry, due: float) -> None:
        """A delivery came back with a delay (nack/reject ``delay_s``): hold it back
        and log its due time (lazily, as delivery marks are: after a crash before the
        mark is written, the message is simply ready again)."""
        self._hold_back(queue, entry, due)
        if queue.persistent_log and entry.message.persistent:
            self._delay_marks.setdefault(queue.qid, []).append((entry.message.seq, round(due * 1000.0)))

    def _touch_queue(self, queue: Queue) -> None:
        """``queue`` was used (declared, consumed from, got from): an ``x-expires``
        queue starts its unused time over."""
        if queue.expires_s is not None:
            queue.unused_since = self.clock()
            self._schedule_queue(queue)

    def _expire_at(self, queue: Queue) -> float | None:
        """When (monotonic) an ``x-expires`` queue is deleted if still unused."""
        if queue.expires_s is None or queue.consumers:
            return None
        return queue.unused_since + queue.expires_s

    def _schedule_queue(self, queue: Queue) -> None:
        """Put ``queue``'s next wake-up on the timer heap: the earliest of a read
        retry, its first due delay, when the head of its memory expires, and when the
        queue itself expires unused."""
        wake = queue.read_blocked_until
        expire_at = self._expire_at(queue)
        if expire_at is not None:
            wake = expire_at if wake is None else min(wake, expire_at)
        if queue.delayed or queue.message_ttl_s is not None:
            now_wall = self.wall_clock()
            now = self.clock()
            due = queue.delayed.next_due()
            if due is not None:
                at = now + max(0.0, due - now_wall)
                wake = at if wake is None else min(wake, at)
            head = queue.memory_head()
            if head is not None and head.expires_at is not None:
                at = now + max(0.0, head.expires_at - now_wall)
                wake = at if wake is None else min(wake, at)
        if wake is not None and wake != queue.wake_at:
            queue.wake_at = wake
            heapq.heappush(self._timers, (wake, QUEUE_TIMER, queue.qid))

    def _wake_queue(self, queue: Queue, now: float) -> None:
        """``queue``'s timer fired (``now``: monotonic): retry a failed read, release
        due delays, expire messages at the head; then schedule the next wake-up."""
        queue.wake_at = None
        expire_at = self._expire_at(queue)
        if expire_at is not None and expire_at <= now:
            self._delete_queue(queue, "queue expired (unused for its x-expires)")
            return
        woke = False
        if queue.read_blocked_until is not None and queue.read_blocked_until <= now:
            queue.read_blocked_until = None
            woke = True
        if queue.delayed:
            woke = self._release_due(queue) or woke
        self._expire_head(queue)
        if woke:
            self._dirty_queues[queue.name] = queue
            if queue.getters:
                self._getter_checks[queue.name] = queue
        self._schedule_queue(queue)

    def _release_due(self, queue: Queue) -> bool:
        """Delayed messages now due go back to their place in ``queue``; paged-out ones
        are read back first. One whose read fails stays delayed and is tried again
        with the backoff of any failed read (the queue's alarm shows it). Returns
        whether any came back."""
        wall = self.wall_clock()
        entries, paged = queue.delayed.pop_due(wall)
        for entry in entries:
            queue.requeue(entry)
        if paged:
            read_log = self.read_log
            assert read_log is not None
            results = read_log([loc >> 1 for _due, _seq, loc in paged])
            failed = False
            for (due_ms, seq, loc), result in zip(paged, results):
                r = _logged_message(result, seq, loc >> 1)
                if isinstance(r, str):
                    failed = True
                    failure = result if isinstance(result, str) else r
                    queue.read_attempts += 1
                    delay = min(READ_RETRY_MAX_S, READ_RETRY_MIN_S * 2 ** (queue.read_attempts - 1))
                    queue.read_failure = str(failure)
                    queue.delayed.push_paged(max(due_ms, round((wall + delay) * 1000.0)), seq, loc)
                    self._effects.append(
                        LogReadFailed(queue.name, loc >> 1, str(failure), bool(getattr(failure, "transient", False)), delay)
                    )
                    continue
                entry = self._entry_of(queue, loc, r)
                queue.paged_counts.pop(seq, None)
                queue.requeue(entry)
                entries.append(entry)
            if not failed and queue.read_failure is not None and queue.read_blocked_until is None:
                queue.read_failure = None  # (a failed read of the queue's head keeps its alarm)
                queue.read_attempts = 0
        return bool(entries)

    def _expire_head(self, queue: Queue) -> None:
        """Remove the expired messages at the head of ``queue``'s memory (dead-letter
        them, reason ``expired``), so they stop counting as ready when they expire."""
        wall = self.wall_clock()
        while True:
            head = queue.memory_head()
            if head is None and queue.message_ttl_s is not None and queue.read_blocked_until is None:
                self._page_in(queue)  # the oldest paged-out messages may have expired
                head = queue.memory_head()
            if head is None or head.expires_at is None or head.expires_at > wall:
                return
            entry = queue.pop()
            assert entry is head
            self._dead_letter(queue, entry, "expired")

"""Delays and queue timers: messages held back until a time, expiry at the head, and
queues that expire unused.

A nack or reject with a delay, or a publish with one, holds a message back in its
queue's delay heap until a wall-clock time (durable: a DELAY mark, or the MOVE record
of a delayed publish, carries the due time, so it holds across restarts); when due it
returns to its original place, ahead of messages published after it. Each queue has at
most one live entry on the broker's timer heap (``Queue.wake_at``), for the earliest of
its due delays, its next message to expire (the head of its memory, under
``x-message-ttl``, or the first of the messages that carry their own ``expiration``,
indexed by ``Queue.expiring``: see expiry.py), a retry of a failed read from the log,
and (``x-expires``) the moment it has been unused long enough to be deleted. "Unused" is
RabbitMQ's: no consumers, no get, no redeclare; a restart starts the time over.

An auto-delete queue is deleted when its last consumer goes (deliveries.py), as in
RabbitMQ. One read over REST instead (gets and long-polls, which are not consumers:
Celery's ``rpc://`` reply queues) has no consumer to lose, so its timer deletes it once
it has been *idle* for ``auto_delete_grace_s``: no consumer, no parked long-poll, no
lease or delivery out, no message (ready or delayed), and no get or redeclare, for that
long. Leases out keep it: the grace starts when the last one settles. A queue holding
messages is kept (nobody came for them yet: deleting it would lose them); an
abandoned one is for ``x-expires``.

:class:`Delays` holds messages back and keeps each queue's timer; the queue store acts
when a queue's timer fires (``QueueTimers.wake_queue``).
"""

from __future__ import annotations

from collections.abc import Callable

from .entities import Queue
from .errors import InvalidArgument
from .log import MessageLog
from .message import MAX_EXPIRATION_MS, Entry
from .timers import QUEUE_TIMER, TimerHeap

__all__ = ["Delays", "MAX_DELAY_S", "check_delay"]

#: Longest delay: as long as the longest message TTL (2^32 - 1 ms, 49.7 days).
MAX_DELAY_S = MAX_EXPIRATION_MS / 1000.0


def check_delay(delay_s: object) -> float:
    """A delay in seconds from JSON: a number 0..MAX_DELAY_S. Raises InvalidArgument."""
    if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or not 0 <= delay_s <= MAX_DELAY_S:
        raise InvalidArgument(f"delay_s must be a number of seconds 0..{MAX_DELAY_S:g}")
    return float(delay_s)


class Delays:
    """Delays and queue timers (see the module docstring). Owns the set of queues
    whose delayed messages wait for their record to be written to be paged out."""

    def __init__(
        self,
        log: MessageLog,
        timers: TimerHeap,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        auto_delete_grace_s: float = 5.0,
    ) -> None:
        self._log = log
        self._grace_s = auto_delete_grace_s
        self._timers = timers
        self._clock = clock
        self._wall_clock = wall_clock
        # queues holding delayed messages to page out once their records are written
        self._to_page_out: dict[str, Queue] = {}

    def hold_back(self, queue: Queue, entry: Entry, due: float) -> None:
        """Keep ``entry`` out of ``queue``'s ready messages until wall-clock ``due``:
        paged out at once when its record is written, else whole until it is."""
        message = entry.message
        earliest = queue.delayed.next_due()
        pageable = queue.persistent_log and message.persistent and message.lsn and self._log.read_log is not None
        if pageable and message.lsn <= self._log.durable_lsn:
            self._page_out_delayed(queue, due, entry)
        else:
            queue.delayed.push_entry(due, entry)
            if pageable:
                self._to_page_out[queue.name] = queue
        if earliest is None or due < earliest:
            self.schedule_queue(queue)

    def _page_out_delayed(self, queue: Queue, due: float, entry: Entry) -> None:
        seq = entry.message.seq
        if entry.deliveries > 1:
            queue.paged_counts[seq] = entry.deliveries
        queue.delayed.push_paged(round(due * 1000.0), seq, (entry.message.lsn << 1) | (entry.deliveries > 0))

    def page_out(self) -> None:
        """Records are durable up to the log's ``durable_lsn``: page out the delayed
        messages they hold (called from ``Broker.durable()``)."""
        if not self._to_page_out:
            return
        durable = self._log.durable_lsn
        for name, queue in list(self._to_page_out.items()):
            if not queue.deleted:
                for due, entry in queue.delayed.take_pageable(durable):
                    self._page_out_delayed(queue, due, entry)
            if queue.deleted or not queue.delayed.has_unwritten():
                del self._to_page_out[name]

    def delay_return(self, queue: Queue, entry: Entry, due: float) -> None:
        """A delivery came back with a delay (nack/reject ``delay_s``): hold it back
        and log its due time (lazily, as delivery marks are: after a crash before the
        mark is written, the message is simply ready again)."""
        self.hold_back(queue, entry, due)
        if queue.persistent_log and entry.message.persistent:
            self._log.mark_delay(queue.qid, entry.message.seq, round(due * 1000.0))

    def touch_queue(self, queue: Queue) -> None:
        """``queue`` was used (declared, consumed from, got from): an ``x-expires``
        queue starts its unused time over, and so does an auto-delete queue read over
        REST its grace."""
        if queue.expires_s is not None:
            queue.unused_since = self._clock()
            self.schedule_queue(queue)
        if queue.read_at is not None:
            self.rest_read(queue)

    def rest_read(self, queue: Queue) -> None:
        """An auto-delete ``queue`` was read over REST (a get, the end of a long-poll,
        its last lease settled): its grace starts over (see the module docstring)."""
        if queue.auto_delete:
            queue.read_at = self._clock()
            self.schedule_queue(queue)

    def auto_delete_at(self, queue: Queue) -> float | None:
        """When (monotonic) an auto-delete queue read over REST is deleted if it stays
        idle (see the module docstring); None while it holds something or has a
        consumer. While a long-poll waits on it, one grace from now: the queue's timer
        looks again then, since the long-poll may end (its client gone) with nothing
        after it to tell the IO layer's timer of the new deadline."""
        read_at = queue.read_at
        if read_at is None or queue.consumers or queue.unacked or queue.delayed or queue.has_ready():
            return None
        if queue.getters:
            return self._clock() + self._grace_s
        return read_at + self._grace_s

    def expire_at(self, queue: Queue) -> float | None:
        """When (monotonic) an ``x-expires`` queue is deleted if still unused."""
        if queue.expires_s is None or queue.consumers:
            return None
        return queue.unused_since + queue.expires_s

    def wake_by(self, queue: Queue, expires_at: float) -> None:
        """A ready message of ``queue`` expires at ``expires_at`` (wall clock): make
        sure the queue's timer fires by then (only reschedules when it would not)."""
        wake = queue.wake_at
        if wake is None or expires_at - self._wall_clock() < wake - self._clock():
            self.schedule_queue(queue)

    def schedule_queue(self, queue: Queue) -> None:
        """Put ``queue``'s next wake-up on the timer heap: the earliest of a read
        retry, its first due delay, when the head of its memory or the first message
        with its own expiration expires, and when the queue itself expires unused."""
        wake = queue.read_blocked_until
        expire_at = self.expire_at(queue)
        if expire_at is not None:
            wake = expire_at if wake is None else min(wake, expire_at)
        if queue.read_at is not None:
            idle_until = self.auto_delete_at(queue)
            if idle_until is not None:
                wake = idle_until if wake is None else min(wake, idle_until)
        if queue.delayed or queue.message_ttl_s is not None or queue.expiring:
            now_wall = self._wall_clock()
            now = self._clock()
            due = queue.delayed.next_due()
            if due is not None:
                at = now + max(0.0, due - now_wall)
                wake = at if wake is None else min(wake, at)
            head = queue.memory_head()
            if head is not None and head.expires_at is not None:
                at = now + max(0.0, head.expires_at - now_wall)
                wake = at if wake is None else min(wake, at)
            first = queue.expiring.next_due()
            if first is not None:
                at = now + max(0.0, first - now_wall)
                wake = at if wake is None else min(wake, at)
        if wake is not None and wake != queue.wake_at:
            queue.wake_at = wake
            self._timers.push(wake, QUEUE_TIMER, queue.qid)

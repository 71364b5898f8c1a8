"""Expiry: a message leaves its queue when its time comes, whether or not anyone reads
the queue.

A message expires ``x-message-ttl`` after it entered its queue, or at its own
``expiration``, whichever is sooner. Under ``x-message-ttl`` alone messages expire in
queue order, so the queue's timer (``Delays.schedule_queue``) wakes for the head of its
memory; a message that carries its own expiration is also indexed by when it expires
(``Queue.expiring``, expiring.py), so that one expiring behind others that do not, or
paged out to the log, leaves on time too. When the queue's timer fires
(``QueueTimers.wake_queue``), :meth:`Expiry.expire` takes out what has expired:

* at the head of the queue's memory, in order (paging the next messages in when the
  memory is empty and the queue has a TTL: the oldest paged-out ones may have expired);
* every indexed message whose time has passed, wherever it waits: requeued, in memory
  (found by bisection: each part of a lane is in sequence order) or paged out (its
  pair removed from the index; read back from the log only when there is a
  dead-letter exchange to send it to).

Each leaves dead-lettered with reason ``expired`` (dropped without a dead-letter
exchange), and stops counting as ready. Messages being delivered are not in the queue:
one that comes back (nack, lease or ack timeout) is indexed again, and expires then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .effects import LogReadFailed
from .entities import Queue
from .log import MessageLog
from .message import Entry
from .pager import Pager, logged_message, retry_delay
from .shared import Outbox

__all__ = ["Expiry"]


def _unconnected(*args: Any) -> None:
    raise RuntimeError("Expiry.connect() was not called")


class Expiry:
    """Removes expired messages from a queue when its timer fires (see the module
    docstring). Owns nothing: the index is each queue's (``Queue.expiring``)."""

    def __init__(self, log: MessageLog, pager: Pager, outbox: Outbox, *, wall_clock: Callable[[], float]) -> None:
        self._log = log
        self._pager = pager
        self._outbox = outbox
        self._wall_clock = wall_clock
        self._dead_letter: Callable[[Queue, Entry, str], None] = _unconnected

    def connect(self, *, dead_letter: Callable[[Queue, Entry, str], None]) -> None:
        """Name the dead letters (built after this component). Called once, by ``Broker``."""
        self._dead_letter = dead_letter

    def expire(self, queue: Queue) -> None:
        """Take out every message of ``queue`` that has expired (see the module docstring)."""
        self._expire_head(queue)
        if queue.expiring:
            self._expire_indexed(queue)

    def _expire_head(self, queue: Queue) -> None:
        """Remove the expired messages at the head of ``queue``'s memory, in order."""
        wall = self._wall_clock()
        while True:
            head = queue.memory_head()
            if head is None and queue.message_ttl_s is not None and queue.read_blocked_until is None:
                self._pager.page_in(queue)  # the oldest paged-out messages may have expired
                head = queue.memory_head()
            if head is None or head.expires_at is None or head.expires_at > wall:
                return
            entry = queue.pop()
            assert entry is head
            if entry.message.expires_at is not None:
                queue.expiring.discard(entry.message.seq)
            self._dead_letter(queue, entry, "expired")

    def _expire_indexed(self, queue: Queue) -> None:
        """Remove the indexed messages whose expiration has passed, wherever they wait."""
        for seq in queue.expiring.pop_due(self._wall_clock()):
            found = queue.take_seq(seq)
            if found is None:
                continue  # delivered, delayed or dropped since it was indexed
            if isinstance(found, Entry):
                self._dead_letter(queue, found, "expired")
            else:
                self._expire_paged(queue, seq, found)

    def _expire_paged(self, queue: Queue, seq: int, loc: int) -> None:
        """Paged-out message ``seq`` (its record at ``loc``) expired and is out of the
        index: dead-letter it, reading it back only when there is somewhere to send it."""
        if queue.dead_letter_exchange is None:
            queue.dead_lettered["expired"] = queue.dead_lettered.get("expired", 0) + 1
            queue.paged_counts.pop(seq, None)
            self._log.settle_seqs(queue.qid, [seq])
            return
        read_log = self._log.read_log
        assert read_log is not None  # (it was paged out to the log)
        lsn = loc >> 1
        result = read_log([lsn])[0]
        r = logged_message(result, seq, lsn)
        if isinstance(r, str):
            # held back like a message set aside after a failed read: the queue's
            # timer reads it back (with backoff) and puts it in place, and it expires then
            failure = result if isinstance(result, str) else r
            queue.read_attempts += 1
            delay = retry_delay(queue.read_attempts)
            queue.read_failure = str(failure)
            queue.delayed.push_paged(round((self._wall_clock() + delay) * 1000.0), seq, loc)
            self._outbox.emit(
                LogReadFailed(queue.name, lsn, str(failure), bool(getattr(failure, "transient", False)), delay)
            )
            return
        entry = self._pager.entry_of(queue, loc, r)
        queue.paged_counts.pop(seq, None)
        self._dead_letter(queue, entry, "expired")

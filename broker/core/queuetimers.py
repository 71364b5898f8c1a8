"""A queue's timer firing: what is due in one queue when its wake-up comes.

Each queue has one wake-up on the timer heap (``Queue.wake_at``, scheduled by
delays.py at the earliest of its due delays, expiries, read retry and ``x-expires``).
When it fires (``Deadlines.advance``), :meth:`QueueTimers.wake_queue` deletes a queue
left unused past its ``x-expires`` or an auto-delete queue left idle by its readers,
ends a failed read's backoff, puts due delayed messages back in their place (reading
paged-out ones back from the log first), takes out expired messages (expiry.py), and
schedules the next wake-up.
"""

from __future__ import annotations

from collections.abc import Callable

from .delays import Delays
from .effects import LogReadFailed
from .entities import Queue
from .expiry import Expiry
from .log import MessageLog
from .pager import Pager, logged_message, retry_delay
from .queues import QueueStore
from .shared import Outbox, Wakeups

__all__ = ["QueueTimers"]


class QueueTimers:
    """A queue's timer firing (see the module docstring). Owns nothing: the delayed
    messages, the wake-up and the read-failure state are the queue's."""

    def __init__(
        self,
        store: QueueStore,
        log: MessageLog,
        delays: Delays,
        pager: Pager,
        expiry: Expiry,
        outbox: Outbox,
        wakeups: Wakeups,
        *,
        wall_clock: Callable[[], float],
    ) -> None:
        self._remove_queue = store.remove_queue
        self._log = log
        self._delays = delays
        self._pager = pager
        self._expire = expiry.expire
        self._outbox = outbox
        self._dispatch = wakeups.dispatch
        self._getters = wakeups.getters
        self._wall_clock = wall_clock

    def wake_queue(self, queue: Queue, now: float) -> None:
        """``queue``'s timer fired (``now``: monotonic): retry a failed read, release
        due delays, expire messages at the head; then schedule the next wake-up."""
        queue.wake_at = None
        expire_at = self._delays.expire_at(queue)
        if expire_at is not None and expire_at <= now:
            self._remove_queue(queue, "queue expired (unused for its x-expires)", by_itself=True)
            return
        if queue.read_at is not None:
            idle_until = self._delays.auto_delete_at(queue)
            if idle_until is not None and idle_until <= now:
                self._remove_queue(queue, "auto-delete queue left idle by its readers", by_itself=True)
                return
        woke = False
        if queue.read_blocked_until is not None and queue.read_blocked_until <= now:
            queue.read_blocked_until = None
            woke = True
        if queue.delayed:
            woke = self._release_due(queue) or woke
        self._expire(queue)
        if woke:
            self._dispatch[queue.name] = queue
            if queue.getters:
                self._getters[queue.name] = queue
        self._delays.schedule_queue(queue)

    def _release_due(self, queue: Queue) -> bool:
        """Delayed messages now due go back to their place in ``queue``; paged-out ones
        are read back first. One whose read fails stays delayed and is tried again
        with the backoff of any failed read (the queue's alarm shows it). Returns
        whether any came back."""
        wall = self._wall_clock()
        entries, paged = queue.delayed.pop_due(wall)
        for entry in entries:
            queue.requeue(entry)
        if paged:
            read_log = self._log.read_log
            assert read_log is not None
            results = read_log([loc >> 1 for _due, _seq, loc in paged])
            failed = False
            for (due_ms, seq, loc), result in zip(paged, results):
                r = logged_message(result, seq, loc >> 1)
                if isinstance(r, str):
                    failed = True
                    failure = result if isinstance(result, str) else r
                    queue.read_attempts += 1
                    delay = retry_delay(queue.read_attempts)
                    queue.read_failure = str(failure)
                    queue.delayed.push_paged(max(due_ms, round((wall + delay) * 1000.0)), seq, loc)
                    self._outbox.emit(
                        LogReadFailed(queue.name, loc >> 1, str(failure), bool(getattr(failure, "transient", False)), delay)
                    )
                    continue
                entry = self._pager.entry_of(queue, loc, r)
                queue.paged_counts.pop(seq, None)
                queue.requeue(entry)
                entries.append(entry)
            if not failed and queue.read_failure is not None and queue.read_blocked_until is None:
                queue.read_failure = None  # (a failed read of the queue's head keeps its alarm)
                queue.read_attempts = 0
        return bool(entries)

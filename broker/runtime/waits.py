"""Calls parked until the core answers: durability, a lock, messages for a long-poll.

A REST call that must wait for something the core decides later parks here and sleeps
on a trio event: a publish or declare waiting for its records to be durable (woken by
the log's durability or failure report, :meth:`Waits.release_durable`), an acquire
queued behind a held lock (woken by the core's ``LockGranted`` or ``LockWaitEnded``),
and a long-poll get waiting for messages (woken by ``QueueReady``). A shutdown wakes
the lock and long-poll waits at once (:meth:`Waits.wake_getters`). The runtime owns
one :class:`Waits` and hands the core's answers to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from broker.core import LockGranted, LockWaitEnded, QueueReady, Unavailable

__all__ = ["LockWait", "Waits"]


@dataclass
class _DurableWaiter:
    target: int
    event: trio.Event = field(default_factory=trio.Event)
    failure: str | None = None


@dataclass
class LockWait:
    """A REST acquire parked behind a held lock: ``answer`` is set (a ``LockGranted``
    or ``LockWaitEnded``) and ``event`` fired when the core ends the wait."""

    event: trio.Event = field(default_factory=trio.Event)
    answer: LockGranted | LockWaitEnded | None = None


class Waits:
    """Every parked call and the event it sleeps on (see the module docstring)."""

    def __init__(self) -> None:
        self._durable_waiters: list[_DurableWaiter] = []
        self._queue_events: dict[str, trio.Event] = {}
        self._lock_waits: dict[int, LockWait] = {}

    # ------------------------------------------------------------ durability

    async def wait_durable(self, target: int) -> None:
        """Sleep until records up to LSN ``target`` are durable (the caller checked
        they are not yet). Raises Unavailable if they could not be written."""
        waiter = _DurableWaiter(target)
        self._durable_waiters.append(waiter)
        await waiter.event.wait()
        if waiter.failure is not None:
            raise Unavailable(f"storage failure: {waiter.failure}", code="storage_failed")

    def release_durable(self, lsn: int, failure: str | None) -> None:
        """Records up to ``lsn`` are durable (``failure`` None) or failed: wake the
        waiters whose target they reach."""
        if self._durable_waiters:
            still = []
            for waiter in self._durable_waiters:
                if waiter.target <= lsn:
                    waiter.failure = failure
                    waiter.event.set()
                else:
                    still.append(waiter)
            self._durable_waiters = still

    # ------------------------------------------------------------------ locks

    def lock_wait(self, waiter_id: int) -> LockWait:
        """Park a REST acquire queued as ``waiter_id`` (see ``Broker.lock_acquire``)."""
        wait = self._lock_waits[waiter_id] = LockWait()
        return wait

    def forget_lock_wait(self, waiter_id: int) -> None:
        self._lock_waits.pop(waiter_id, None)

    def lock_answered(self, effect: LockGranted | LockWaitEnded) -> None:
        """The core ended the REST wait of ``effect.waiter_id``: wake it."""
        wait = self._lock_waits.pop(effect.waiter_id, None)
        if wait is not None:
            wait.answer = effect
            wait.event.set()

    # -------------------------------------------------------------- long-polls

    def queue_event(self, queue: str) -> trio.Event:
        """An event set when ``queue`` gets ready messages (for long-polls)."""
        event = self._queue_events.get(queue)
        if event is None:
            event = self._queue_events[queue] = trio.Event()
        return event

    def queue_ready(self, effect: QueueReady) -> None:
        event = self._queue_events.pop(effect.queue, None)
        if event is not None:
            event.set()

    # --------------------------------------------------------------- shutdown

    def wake_getters(self) -> None:
        """Wake every parked long-poll and lock acquire (they answer at once when
        shutting down)."""
        events = list(self._queue_events.values())
        self._queue_events.clear()
        for event in events:
            event.set()
        # and parked lock acquires (they answer 503: the broker is shutting down)
        for wait in self._lock_waits.values():
            wait.event.set()

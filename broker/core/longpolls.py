"""Parked long-polls: REST gets waiting on a queue for messages.

A long-poll (``POST /queues/{name}/get`` with a wait) that finds nothing parks on its
queue (:meth:`LongPolls.park_getter`, counted in ``Queue.getters``) and the runtime
waits for a ``QueueReady`` effect naming the queue: :meth:`LongPolls.ready_getters`
emits one, before effects leave, for each queue that received messages and still holds
ready ones after the consumers took theirs. An auto-delete queue's idle grace starts
when its last long-poll leaves (:meth:`LongPolls.unpark_getter`).
"""

from __future__ import annotations

from .delays import Delays
from .effects import QueueReady
from .queues import QueueStore
from .shared import Outbox, Wakeups

__all__ = ["LongPolls"]


class LongPolls:
    """Parked long-polls (see the module docstring). Owns nothing: the count of
    parked getters is the queue's, the queues to wake are the shared ``Wakeups``'."""

    def __init__(self, store: QueueStore, delays: Delays, outbox: Outbox, wakeups: Wakeups) -> None:
        self._store = store
        self._delays = delays
        self._outbox = outbox
        self._getters = wakeups.getters

    def park_getter(self, queue_name: str) -> None:
        """A long-poll waits for messages on this queue (wake it with ``QueueReady``)."""
        self._store.queue(queue_name).getters += 1

    def unpark_getter(self, queue_name: str) -> None:
        """A long-poll stopped waiting on this queue (an auto-delete queue's grace
        starts when its last one does)."""
        queue = self._store.queues.get(queue_name)
        if queue is not None and queue.getters:
            queue.getters -= 1
            if not queue.getters and queue.auto_delete:
                self._delays.rest_read(queue)

    def ready_getters(self) -> None:
        """Wake the parked long-polls of queues that received messages and still hold
        ready ones after dispatch (consumers may have taken them all)."""
        getters = self._getters
        if getters:
            for queue in getters.values():
                if queue.getters and queue.has_ready() and not queue.deleted:
                    self._outbox.emit(QueueReady(queue.name))
            getters.clear()

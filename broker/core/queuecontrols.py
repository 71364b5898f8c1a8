"""What the edge sets on one queue from outside: a replicated queue's bounds.

A replicated (quorum) queue's leader runs above the core, which never knows of
replicas; it steers the queue through these commands, bound as the ``Broker``'s own:
publishes to it refused for a while (:meth:`QueueControls.refuse_queue`), every message
kept persistent (:meth:`QueueControls.persist_messages`), messages its majority does
not hold yet kept from consumers (:meth:`QueueControls.hold_deliveries`), and a message
another copy of the queue held put back into it (:meth:`QueueControls.restore_message`).
"""

from __future__ import annotations

from typing import Any

from .errors import NotFound
from .publishing import Publishing
from .queues import QueueStore
from .shared import Wakeups

__all__ = ["QueueControls"]


class QueueControls:
    """Per-queue controls from outside (see the module docstring). Owns nothing: each
    sets a field of the queue (``Queue.refusal``, ``persist_all``, ``hold_after``) or
    goes through publishing."""

    def __init__(self, store: QueueStore, publishing: Publishing, wakeups: Wakeups) -> None:
        self._store = store
        self._publishing = publishing
        self._wakeups = wakeups

    def refuse_queue(self, name: str, reason: str | None) -> None:
        """Nack publishes routed to queue ``name`` with ``reason`` (None: take them
        again). Other queues the publish reaches keep it."""
        queue = self._store.queues.get(name)
        if queue is not None:
            queue.refusal = reason

    def persist_messages(self, name: str, on: bool = True) -> None:
        """Make every message published or dead-lettered into queue ``name``
        persistent, ``delivery_mode`` 1 included (the message is stored with
        ``delivery_mode`` 2): a replicated queue keeps every message, as RabbitMQ's
        quorum queues do. Publishes reaching no such queue are untouched."""
        queue = self._store.queues.get(name)
        if queue is not None:
            queue.persist_all = on

    def hold_deliveries(self, name: str, after_seq: int | None) -> None:
        """Hand out no message of queue ``name`` with a seq above ``after_seq`` (None:
        every message again); a raised bound wakes its consumers and long-polls."""
        queue = self._store.queues.get(name)
        if queue is not None:
            queue.hold_after = after_seq
            self._wakeups.dispatch[name] = queue
            if queue.getters:
                self._wakeups.getters[name] = queue

    def restore_message(
        self,
        queue: str,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        wall: float,
        deliveries: int = 0,
        due: float | None = None,
        *,
        dedup: bool = True,
    ) -> int:
        """Put a message into ``queue`` as another copy of it held the message
        (``Publishing.restore``), held back until wall-clock ``due`` if given, its
        ``message_id`` remembered for deduplication only with ``dedup``; returns its
        seq. Raises ``NotFound``."""
        found = self._store.queues.get(queue)
        if found is None:
            raise NotFound(f"no queue {queue!r}")
        return self._publishing.restore(found, exchange, routing_key, body, properties, wall, deliveries, due, dedup)

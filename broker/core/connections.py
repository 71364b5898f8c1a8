"""Connections: owners of exclusive queues shared by several channels.

An exclusive queue belongs to the channel that declared it (an HTTP channel), or, for
a channel that joined a connection (``Deliveries.join_connection``: an AMQP
connection's channels), to that connection, as in RabbitMQ: the connection's other
channels may use it, other channels get ``ResourceLocked``, and it is deleted when
the connection closes (:meth:`Connections.close_connection`), not with the channel
that declared it. A connection's id is negative, so that it never names a channel
(``Queue.exclusive_owner`` holds either).
"""

from __future__ import annotations

from .queues import QueueStore

__all__ = ["Connections", "remove_exclusive"]


def remove_exclusive(store: QueueStore, names: set[str]) -> None:
    """Delete the exclusive queues ``names`` (their owner ended)."""
    for name in list(names):
        queue = store.queues.get(name)
        if queue is not None:
            store.remove_queue(queue, "exclusive queue owner closed", by_itself=True)


class Connections:
    """Open connections and the exclusive queues each owns (see the module docstring)."""

    def __init__(self, store: QueueStore) -> None:
        self._store = store
        self._owned: dict[int, set[str]] = {}
        self._next = -1

    def open_connection(self) -> int:
        """A new connection's id (negative: never a channel's)."""
        connection_id = self._next
        self._next -= 1
        self._owned[connection_id] = set()
        return connection_id

    def queues_of(self, connection_id: int) -> set[str] | None:
        """The names of the exclusive queues an open connection owns (the set its
        channels share), or None if it is not open."""
        return self._owned.get(connection_id)

    def close_connection(self, connection_id: int) -> None:
        """The connection ended (after its channels): delete its exclusive queues.
        Idempotent."""
        owned = self._owned.pop(connection_id, None)
        if owned is not None:
            remove_exclusive(self._store, owned)

    def __len__(self) -> int:
        return len(self._owned)

"""Cluster mode: a queue the broker deleted by itself leaves etcd too.

An auto-delete queue its last consumer left, or a queue unused for its ``x-expires``,
is deleted by the core of the node serving it (its owner; a quorum queue's leader),
which alone sees it unused (``QueueAutoDeleted``). Its definition is etcd's, though:
left there, every node would still route to it (publishes nacked by its owner, which
has no such queue), and a declare with other settings would be refused. So that node
deletes the definition and its bindings from etcd as well, as a client's delete does,
retrying while etcd cannot be reached. It stops as soon as the definition is gone,
belongs to another node, or the queue is in this node's core again (declared anew).

A connection's own queue (exclusive or server-named, in etcd for every node's routing:
``MetadataWriter.register_local_queue``) leaves etcd the same way when its connection
ends (``QueueAutoDeleted`` too) or a client deletes it (:meth:`AutoDeletedQueues.forget`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from broker.cluster.etcdproto import EtcdError
from broker.cluster.writes import MetadataWriter
from broker.core import ErrorReply, NotFound, QueueAutoDeleted

__all__ = ["AutoDeletedQueues"]

log = logging.getLogger("ackbus.cluster")

#: Retry delays while etcd cannot take the delete: from the first to the last.
RETRY_MIN_S: Final = 0.5
RETRY_MAX_S: Final = 10.0


class AutoDeletedQueues:
    """The deletes from etcd of the queues this node's core deleted by itself.
    ``serving(queue)`` is whether this node serves ``queue`` per its etcd definition;
    ``in_core(queue)`` whether its core has it now."""

    def __init__(
        self, writer: MetadataWriter, definition: Callable[[str], dict[str, Any] | None],
        serving: Callable[[str, dict[str, Any]], bool], in_core: Callable[[str], bool],
    ) -> None:
        self._writer = writer
        self._definition = definition
        self._serving = serving
        self._in_core = in_core
        self._nursery: trio.Nursery | None = None
        #: deleted before ``serve`` ran (at recovery): handled once it runs
        self._early: list[str] = []

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            early, self._early = self._early, []
            for queue in early:
                nursery.start_soon(self._forget, queue)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def take(self, effect: QueueAutoDeleted) -> None:
        """The runtime's tap of ``QueueAutoDeleted`` (in its pump: starts the delete)."""
        self.forget(effect.queue)

    def forget(self, queue: str) -> None:
        """``queue`` left this core: delete its definition from etcd (in the background)."""
        if self._nursery is not None:
            self._nursery.start_soon(self._forget, queue)
        else:
            self._early.append(queue)

    def run_soon(self, put_back: Callable[[], Awaitable[None]]) -> None:
        """Run ``put_back`` in the background (this node joined again with a new lease:
        its connections' own queues, held by the old one, are put in etcd again)."""
        if self._nursery is not None:
            self._nursery.start_soon(put_back)

    def _still_ours(self, queue: str) -> bool:
        d = self._definition(queue)
        return d is not None and self._serving(queue, d) and not self._in_core(queue)

    async def _forget(self, queue: str) -> None:
        delay = RETRY_MIN_S
        while self._still_ours(queue):
            try:
                await self._writer.delete_queue(queue, local_check=lambda: self._check(queue))
            except NotFound:
                return
            except (ErrorReply, EtcdError) as exc:  # etcd down, or the definition changed meanwhile
                log.warning("auto-deleted queue still in etcd; trying again",
                            extra={"fields": {"queue": queue, "error": str(exc), "retry_s": delay}})
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
            else:
                log.info("auto-deleted queue removed from the cluster", extra={"fields": {"queue": queue}})
                return

    def _check(self, queue: str) -> None:
        """After the writer read the definition: refuse if it is no longer ours."""
        if not self._still_ours(queue):
            raise NotFound(f"queue {queue!r} is not this node's to forget any more")

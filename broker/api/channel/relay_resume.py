"""Cluster mode: a quorum queue's relayed consumer outlives the queue's leader.

When the leader a consumer is relayed from dies or steps down, the consumer is not
cancelled: its channel consumes again, with the same consumer tag, from the next
leader as soon as the cluster names one that answers (looking every ``RESUME_POLL_S``,
for up to ``RESUME_S``), as RabbitMQ's quorum queue consumers go on across a leader
change. Only then, or once the queue is gone from the cluster, is it cancelled. What
the lost leader had delivered and not seen settled comes again from the new one,
redelivered; the old delivery tags are gone with their relay (settling one does
nothing). The consumer can be cancelled while it waits (:meth:`Resumption.withdraw`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from broker.core import ErrorReply

__all__ = ["RESUME_POLL_S", "RESUME_S", "Resumption"]

log = logging.getLogger("ackbus.cluster")

#: How long a consumer whose leader was lost waits for the next one; how often it
#: looks for it meanwhile.
RESUME_S: Final = 30.0
RESUME_POLL_S: Final = 0.25


class Resumption:
    """One relayed consumer of ``queue`` between the loss of its leader and the
    consume on the next one; ``consume_op`` is what its consumes ask of the owner."""

    def __init__(self, queue: str, consumer_tag: str, consume_op: dict[str, Any], reason: str) -> None:
        self.queue = queue
        self.consumer_tag = consumer_tag
        self.consume_op = consume_op
        #: why it is not consuming (at the end: why it was cancelled)
        self.reason = reason
        self.scope = trio.CancelScope(deadline=trio.current_time() + RESUME_S)
        #: cancelled meanwhile (by the client, the channel's end or a revoked
        #: permission): its end sends no ``cancel`` event, and a consume made in the
        #: meantime is ended
        self.withdrawn = False
        #: the relays its consumes made (``relayed._Relay``; the last is the resumed one)
        self.relays: list[Any] = []

    def withdraw(self) -> None:
        self.withdrawn = True
        self.scope.cancel()

    async def run(
        self,
        owner_of: Callable[[str], tuple[str, str | None] | None],
        consume_at: Callable[[str, str, str, str, dict[str, Any], list[Any]], Awaitable[object]],
        finished: Callable[[], bool],
    ) -> bool:
        """Consume again from the queue's leader (``owner_of``) with ``consume_at``
        until one takes it: True; False once the queue is gone, the channel ended,
        the time ran out or the consumer was withdrawn (``reason`` says why)."""
        queue, consumer_tag = self.queue, self.consumer_tag
        log.info("relayed consumer lost its quorum queue's leader; consuming from the next one",
                 extra={"fields": {"queue": queue, "consumer_tag": consumer_tag, "reason": self.reason[:200]}})
        with self.scope:
            while not finished():
                located = owner_of(queue)
                if located is None:
                    self.reason = f"queue {queue!r} was deleted"
                    return False
                owner, url = located
                if url is not None:
                    try:
                        await consume_at(queue, owner, url, consumer_tag, self.consume_op, self.relays)
                    except ErrorReply as exc:  # no leader there yet, or it cannot be reached
                        self.reason = f"{exc.code}: {exc.message}"
                    else:
                        log.info("relayed consumer resumed on the quorum queue's next leader",
                                 extra={"fields": {"queue": queue, "consumer_tag": consumer_tag, "node": owner}})
                        return True
                await trio.sleep(RESUME_POLL_S)
        return False

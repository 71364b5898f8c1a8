"""Cluster mode: a quorum queue's consumer outlives the queue's leader.

When the leader a consumer is relayed from dies or steps down, the consumer is not
cancelled: its channel consumes again, with the same consumer tag, from the next
leader as soon as the cluster names one that answers (looking every ``RESUME_POLL_S``,
for up to ``RESUME_S``), as RabbitMQ's quorum queue consumers go on across a leader
change. Only then, or once the queue is gone from the cluster, is it cancelled. What
the lost leader had delivered and not seen settled comes again from the new one,
redelivered; the old delivery tags are gone with their relay (settling one does
nothing). The consumer can be cancelled while it waits (:meth:`Resumption.withdraw`).

A channel's own consumer of a quorum queue this node leads goes on the same way
when this node stops leading it while it lives (its lease lapsed, it was cut off
from etcd, it left the replica set): the core cancels it with the cluster's
``queue_moved`` reason (``broker.cluster.is_moved``), not a delete's, and
:class:`LocalQuorumConsumers`, which kept what its consume asked, hands it to the
channel's relayed consumers to resume, without a ``cancel`` for the client. The
next leader may be this node again: the consumer is then a local one again
(:meth:`LocalQuorumConsumers.consume_here`), whichever way it was consuming before.
Its old deliveries stay unacked on the channel, of a queue the core no longer
holds: settling them does nothing, and their messages come again, redelivered.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from broker.cluster import is_moved
from broker.core import Broker, ErrorReply
from broker.runtime import ClusterPort, CommandGateway

__all__ = ["CONSUME_FIELDS", "RESUME_POLL_S", "RESUME_S", "LocalQuorumConsumers", "Resumption", "consume_op_of"]

log = logging.getLogger("ackbus.cluster")

#: How long a consumer whose leader was lost waits for the next one; how often it
#: looks for it meanwhile.
RESUME_S: Final = 30.0
RESUME_POLL_S: Final = 0.25
#: The fields of a channel's consume op a resumption repeats (besides the queue and
#: the consumer tag): what a relayed consume asks of the owner.
CONSUME_FIELDS: Final = ("prefetch", "no_ack", "exclusive", "ack_timeout_ms", "arguments")


def consume_op_of(op: dict[str, Any], default_prefetch: int | None) -> dict[str, Any]:
    """What a consume op asks besides its queue and tag, with the channel's
    per-consumer default prefetch (``default_prefetch``, taken at the consume as a
    local consume takes it) when it names none."""
    consume_op = {k: v for k, v in op.items() if k in CONSUME_FIELDS}
    if consume_op.get("prefetch") is None and default_prefetch:
        consume_op["prefetch"] = default_prefetch
    return consume_op


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
        local: LocalQuorumConsumers | None = None,
    ) -> bool:
        """Consume again from the queue's leader (``owner_of``) with ``consume_at``,
        or in this node's core with ``local`` when the leader is this node, until
        one takes it: True; False once the queue is gone, the channel ended, the
        time ran out or the consumer was withdrawn (``reason`` says why)."""
        queue, consumer_tag = self.queue, self.consumer_tag
        log.info("consumer lost its quorum queue's leader; consuming from the next one",
                 extra={"fields": {"queue": queue, "consumer_tag": consumer_tag, "reason": self.reason[:200]}})
        with self.scope:
            # (``withdrawn`` too: withdrawn before this task began, its cancelled scope
            # would stop it at its first await only, and a consume here has none)
            while not finished() and not self.withdrawn:
                located = owner_of(queue)
                if located is None:
                    self.reason = f"queue {queue!r} was deleted"
                    return False
                owner, url = located
                here = local is not None and owner == local.cluster.node_name
                if url is not None or here:
                    try:
                        if local is not None and here:
                            local.consume_here(queue, consumer_tag, self.consume_op)
                        elif url is not None:
                            await consume_at(queue, owner, url, consumer_tag, self.consume_op, self.relays)
                    except ErrorReply as exc:  # no leader there yet, or it cannot be reached
                        self.reason = f"{exc.code}: {exc.message}"
                    else:
                        log.info("consumer resumed on the quorum queue's next leader",
                                 extra={"fields": {"queue": queue, "consumer_tag": consumer_tag, "node": owner}})
                        return True
                await trio.sleep(RESUME_POLL_S)
        return False


class LocalQuorumConsumers:
    """One channel's consumers on this node of quorum queues (it leads them): what
    each consume asked, so that the consumer goes on from the queue's next leader
    when this node stops leading it (:meth:`cancelled` hands it to ``resume``: the
    channel's ``RelayedConsumers.resume``); and the consume on this node when that
    next leader is this node (:meth:`consume_here`)."""

    def __init__(
        self,
        channel_id: int,
        gateway: CommandGateway,
        cluster: ClusterPort,
        resume: Callable[[str, str, dict[str, Any], str], bool],
    ) -> None:
        self.channel_id = channel_id
        self.gateway = gateway
        self.cluster = cluster
        self._resume = resume
        #: consumer tag -> (quorum queue, what its consume asked)
        self._consumes: dict[str, tuple[str, dict[str, Any]]] = {}

    def noted(self, queue: str, consumer_tag: str, op: dict[str, Any]) -> None:
        """A consume of ``queue`` as ``consumer_tag`` was made in this node's core
        with the fields of ``op`` (a channel's consume op): kept if it is a quorum
        queue's."""
        if not self.cluster.is_replicated(queue):
            self._consumes.pop(consumer_tag, None)
            return
        info = self.gateway.views.channel_info(self.channel_id) or {}
        self._consumes[consumer_tag] = (queue, consume_op_of(op, info.get("default_prefetch")))

    def forget(self, consumer_tag: str) -> None:
        """The client cancelled ``consumer_tag``."""
        self._consumes.pop(consumer_tag, None)

    def cancelled(self, consumer_tag: str, reason: str) -> bool:
        """The core cancelled ``consumer_tag`` for ``reason``: True when the consumer
        goes on from its quorum queue's next leader (this node stopped leading the
        queue: the client is told nothing), False when the client is to see the
        cancel (a delete, a revoked permission, a classic queue's consumer)."""
        noted = self._consumes.pop(consumer_tag, None)
        if noted is None or not is_moved(reason):
            return False
        queue, consume_op = noted
        return self._resume(queue, consumer_tag, consume_op, reason)

    def consume_here(self, queue: str, consumer_tag: str, consume_op: dict[str, Any]) -> None:
        """Consume ``queue`` in this node's core again, as ``consumer_tag`` with
        ``consume_op`` (this node leads it again). Raises the core's refusal
        (``not_found`` while the queue is not in the core yet). The tag, held in the
        core while the consumer waited (``RelayedConsumers.resume``), passes to the
        core's consumer, or stays held when the consume is refused."""
        channel_id = self.channel_id
        timeout_ms = consume_op.get("ack_timeout_ms")
        arguments = consume_op.get("arguments") or {}

        def consume(core: Broker) -> None:
            core.release_consumer_tag(channel_id, consumer_tag)
            try:
                core.consume(
                    channel_id, queue, consumer_tag=consumer_tag, prefetch=consume_op.get("prefetch"),
                    no_ack=bool(consume_op.get("no_ack")), exclusive=bool(consume_op.get("exclusive")),
                    ack_timeout_s=timeout_ms / 1000.0 if timeout_ms is not None else None,
                    priority=arguments.get("x-priority") if isinstance(arguments, dict) else None,
                )
            except ErrorReply:
                core.hold_consumer_tag(channel_id, consumer_tag)
                raise

        self.gateway.run(consume)
        self._consumes[consumer_tag] = (queue, consume_op)

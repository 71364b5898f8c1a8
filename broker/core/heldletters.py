"""Dead letters held for a cluster: :class:`HeldDeadLetters`.

On a single node a dead letter that routes to no queue is dropped (and logged). A
node of a cluster holds it instead: other nodes may own the queues it reaches, and it
must not leave its source queue before one of them has taken it. Held, the message
stays in its source queue, unsettled, as an unacked delivery (no consumer, no
deadline, not counted as a delivery) of one channel the cluster opened for this
(:meth:`HeldDeadLetters.hold_on`); checkpoints keep it with the queue's other
unacked messages, and a restart finds it back in its queue. The cluster settles it
once taken (:meth:`HeldDeadLetters.settle`); should that channel end, its held dead
letters go back to their queues like any unacked delivery.

A dead letter that reaches queues of this node *and* queues of other nodes goes to
both, as a publish would: the local queues get their copy at once (an ENQUEUE record,
not a MOVE: the source is not settled yet; once per source message within the
deduplication window, should the source come back after a restart and die again) and
the source message is held as above for the other nodes' share. Which dead letters reach other nodes the core cannot know:
it asks the :class:`DeadLetterRoutes` port the cluster hands it with
:meth:`HeldDeadLetters.hold_on`.

A publish refused by a full ``x-overflow: reject-publish-dlx`` queue was never in
that queue: its dead letter is held by its publish's confirm (a nack) instead
(:meth:`HeldDeadLetters.hold_confirm`), which the cluster releases once the dead
letter is taken, or given up on.

A queue of this node may also keep a message only once a majority of its replicas
has it (a quorum queue this node leads: the port says which). Its copy is not made
with the others at once, in the step that could settle the source: the source is held
as for another node's queue, and the cluster makes the copy
(``DeadLetters.copy_held``) and settles the source once the majority has it, so a
leader lost before that leaves the message in its source queue.
"""

from __future__ import annotations

from typing import Any, Protocol

from .delivery import Deliveries
from .entities import Delivery, Queue
from .log import MessageLog
from .message import Entry

__all__ = ["DeadLetterRoutes", "HeldDeadLetters"]


class DeadLetterRoutes(Protocol):
    """What the core asks a cluster about a dead letter that reaches queues of this
    node: whether it also reaches queues other nodes serve (then its source is held
    until they took it)."""

    def reaches_other_nodes(self, exchange: str, routing_key: str, properties: dict[str, Any]) -> bool:
        """True when the dead letter (published to ``exchange`` with ``routing_key``
        and ``properties``, its ``x-death`` included) reaches some queue another node
        serves, or may (the cluster cannot tell yet): it must be held."""
        ...

    def needs_majority(self, queue: str) -> bool:
        """True when ``queue``, a queue of this core, keeps a message only once a
        majority of its replicas has it (a quorum queue this node leads): a dead
        letter reaching it is held, its copy made by the cluster."""
        ...


class HeldDeadLetters:
    """Owns which channel holds the dead letters (see the module docstring)."""

    def __init__(self, deliveries: Deliveries, log: MessageLog) -> None:
        self._deliveries = deliveries
        self._channels = deliveries.channels
        self._settle_entry = log.settle_entry
        #: the holding channel; None: dead letters routing nowhere are dropped
        self.channel_id: int | None = None
        #: the cluster's answer to "does it reach other nodes too"; None: never
        self.routes: DeadLetterRoutes | None = None

    def hold_on(self, channel_id: int | None, routes: DeadLetterRoutes | None = None) -> None:
        """Hold dead letters that route to no queue of this core as deliveries of
        ``channel_id`` from now on (None: drop them again, a single node's rule); with
        ``routes``, also those that reach queues here and, ``routes`` says, elsewhere."""
        self.channel_id = channel_id
        self.routes = routes if channel_id is not None else None

    def reaches_other_nodes(self, exchange: str, routing_key: str, properties: dict[str, Any]) -> bool:
        """Whether a dead letter that reaches queues here must also be held for other
        nodes' queues (False on a single node, without a call)."""
        routes = self.routes
        return routes is not None and routes.reaches_other_nodes(exchange, routing_key, properties)

    def needs_majority(self, queue: str) -> bool:
        """Whether a dead letter's copy for ``queue`` waits for a majority of its
        replicas (False on a single node, without a call)."""
        routes = self.routes
        return routes is not None and routes.needs_majority(queue)

    def hold_confirm(self, channel_id: int, tag: int) -> bool:
        """Hold the confirm of publish ``tag`` of ``channel_id`` for one more answer:
        the dead letter of a publish a full ``reject-publish-dlx`` queue refused. The
        message was never in that queue, so nothing holds it there; the publisher, told
        nothing until the cluster answers (``settle_held_confirm``), sends it again
        should this node stop first. False when nothing holds dead letters (a single
        node) or the confirm cannot wait (its channel is gone)."""
        if self.channel_id is None:
            return False
        ch = self._channels.get(channel_id)
        return ch is not None and not ch.closed and ch.confirms.hold(tag, 1)

    def hold(self, queue: Queue, entry: Entry) -> tuple[int, int] | None:
        """Keep ``entry``, which has left ``queue``'s ready messages, unsettled there:
        (holding channel, delivery tag); None when nothing holds dead letters."""
        channel_id = self.channel_id
        ch = self._channels.get(channel_id) if channel_id is not None else None
        if ch is None or ch.closed:
            return None
        tag = self._deliveries.reserve_tag(ch.id)
        ch.deliveries[tag] = Delivery(tag, entry, queue, None, None)
        ch.unacked += 1
        queue.unacked += 1
        queue.totals.unacked += 1
        return ch.id, tag

    def settle(self, channel_id: int, tag: int) -> bool:
        """Held dead letter ``tag`` was taken elsewhere: settled in its queue for good.
        False when it is not held (its channel ended: it went back to its queue)."""
        ch = self._channels.get(channel_id)
        d = ch.deliveries.pop(tag, None) if ch is not None else None
        if ch is None or d is None:
            return False
        self._deliveries.finish_delivery(ch, d)
        self._settle_entry(d.queue, d.entry)
        return True

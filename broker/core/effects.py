"""Effects: what the core asks the outside world to do.

The core never performs IO. Every command returns nothing but leaves effects in the
broker's outbox (``Broker.take_effects()``); the IO layer carries them out: events go
to channels, records go to the log, wake-ups go to parked long-polls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .message import StoredMessage

__all__ = [
    "Effect",
    "Deliver",
    "Confirm",
    "Return",
    "ConsumerCancelled",
    "DeliveryExpired",
    "AppendRecords",
    "QueueReady",
    "QueueAutoDeleted",
    "MessageLost",
    "LogReadFailed",
    "DeadLetterDropped",
    "DeadLetterHeld",
    "ConsumerActive",
]


class Effect:
    __slots__ = ()


@dataclass(slots=True)
class Deliver(Effect):
    """Send ``message`` to a consumer (or, with ``lease_id``, to a lease-mode stream)."""

    channel_id: int
    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    message: StoredMessage
    lease_id: str | None = None
    #: How many times the queue delivered the message before this delivery.
    delivery_count: int = 0


@dataclass(slots=True)
class Confirm(Effect):
    """Publisher confirm: ``ack`` (or nack) for ``delivery_tag``, or every tag up to it."""

    channel_id: int
    delivery_tag: int
    multiple: bool
    ack: bool
    reason: str | None = None


@dataclass(slots=True)
class Return(Effect):
    """An unroutable mandatory message goes back to its publisher (before its confirm)."""

    channel_id: int
    delivery_tag: int
    reply_code: int
    reason: str
    message: StoredMessage


@dataclass(slots=True)
class ConsumerCancelled(Effect):
    """The broker cancelled a consumer (its queue was deleted)."""

    channel_id: int
    consumer_tag: str
    reason: str


@dataclass(slots=True)
class DeliveryExpired(Effect):
    """A delivery was not acked within its ack timeout and went back to its queue."""

    channel_id: int
    consumer_tag: str
    delivery_tag: int


@dataclass(slots=True)
class AppendRecords(Effect):
    """Append these records to the log; they take LSNs ``first_lsn`` .. ``last_lsn``.

    ``lazy``: the batch only settles or marks deliveries (acks and the like), which
    nobody waits for; the log may sync it later (the design lets consumer acks be
    synced lazily: a lost one means a redelivery, never a lost message).
    """

    records: list[tuple[int, bytes]]
    first_lsn: int
    last_lsn: int
    lazy: bool = False
    #: the batch holds a committed transaction: the log must write it as one group
    together: bool = False


@dataclass(slots=True)
class QueueReady(Effect):
    """A queue with parked long-poll getters has messages ready."""

    queue: str



@dataclass(slots=True)
class QueueAutoDeleted(Effect):
    """The broker deleted ``queue`` by itself, for ``reason``: an auto-delete queue
    left unused, one unused for its ``x-expires``, or an exclusive queue whose
    connection closed. (In a cluster its definition, kept by etcd, goes too.)"""

    queue: str
    reason: str


@dataclass(slots=True)
class MessageLost(Effect):
    """A paged-out message whose record could not be read back from the log (a damaged
    or missing segment). It has left its queue; the IO layer reports it loudly."""

    queue: str
    seq: int
    lsn: int
    reason: str


@dataclass(slots=True)
class LogReadFailed(Effect):
    """Reading a paged-out message of ``queue`` back from the log failed. The message
    keeps its place (and the queue its order): its queue delivers nothing more until a
    retry in ``retry_in_s`` succeeds. The IO layer raises the alarm."""

    queue: str
    lsn: int
    reason: str
    transient: bool
    retry_in_s: float


@dataclass(slots=True)
class DeadLetterDropped(Effect):
    """A message left ``queue`` for ``reason`` and could not be dead-lettered (its
    dead-letter exchange is missing or routes nowhere, or a dead-letter cycle): it is
    gone. The IO layer logs it (RabbitMQ does the same). ``forward``: when it routed
    to no queue of this core, the dead letter as it would have been published
    (exchange, routing key, body, properties with ``x-death``): a cluster forwards it
    to the nodes owning the queues it reaches there."""

    queue: str
    seq: int
    reason: str
    why: str
    forward: tuple[str, str, bytes, dict[str, Any]] | None = None


@dataclass(slots=True)
class DeadLetterHeld(Effect):
    """A dead letter that routed to no queue of this core, held (``hold_dead_letters``:
    a cluster, whose other nodes may own the queues it reaches): the message stays in
    its source queue ``queue``, unsettled, as delivery ``delivery_tag`` of the holding
    channel ``channel_id``, until ``settle_held_dead_letter`` (once another node took
    the dead letter) or that channel's end (back to the queue). ``exchange``,
    ``routing_key``, ``body``, ``properties`` (with ``x-death``): the dead letter as
    it is to be published. ``local``: it also reached queues of this core, which have
    their copy already; only other nodes' queues are still to take it. ``awaiting``:
    queues of this core it reaches that keep a message only once a majority of their
    replicas has it (a cluster's quorum queues this node leads): they have no copy yet;
    the cluster makes it (``copy_held_dead_letter``) and settles the source once the
    majority has it. ``refused``: the message was refused by ``queue``, full with
    ``x-overflow: reject-publish-dlx``, and never stored there: ``channel_id`` and
    ``delivery_tag`` are its publisher's channel and publish tag, whose confirm (a
    nack) waits for ``settle_held_confirm`` instead."""

    channel_id: int
    delivery_tag: int
    queue: str
    exchange: str
    routing_key: str
    body: bytes
    properties: dict[str, Any]
    local: bool = False
    awaiting: tuple[str, ...] = ()
    refused: bool = False


@dataclass(slots=True)
class ConsumerActive(Effect):
    """A standby consumer of a single-active-consumer queue became the active one (the
    one before it was cancelled or its channel ended): deliveries start."""

    channel_id: int
    consumer_tag: str

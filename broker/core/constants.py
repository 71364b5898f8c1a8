"""The constants the core's components share: built-in exchanges, the REST channel,
the delivery cost formula, and the tables of known queue and exchange arguments with
their checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import records as rec
from .errors import InvalidArgument
from .message import check_json_value
from .routing import DELAYED_ROUTING_TYPES

__all__ = [
    "BUILTIN_EXCHANGES",
    "check_arguments",
    "check_entity_arguments",
    "DEDUP_BATCH_ENTRIES",
    "DEFAULT_EXCHANGE",
    "DELIVERY_OVERHEAD_BYTES",
    "delivery_cost",
    "NO_ROUTE",
    "PAGE_IN_BATCH",
    "PublishResult",
    "QUEUE_ARGUMENTS",
    "QUEUE_DELETED",
    "EXCHANGE_ARGUMENTS",
    "REST_CHANNEL",
    "_ENQUEUE",
    "_EXPIRED_MEMORY",
]

REST_CHANNEL = 0
DEFAULT_EXCHANGE = ""
BUILTIN_EXCHANGES = {
    "": "direct",
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}
# Per-delivery overhead charged against a channel's credit besides the body (JSON
# framing, properties): keeps tiny messages from being unbounded in count.
DELIVERY_OVERHEAD_BYTES = 200


def delivery_cost(body: bytes) -> int:
    """What a message of this body costs against a channel's byte credit (and its
    outbox and unconfirmed-publish bounds): the body plus DELIVERY_OVERHEAD_BYTES.
    One formula, used by the core and the API layer alike."""
    return len(body) + DELIVERY_OVERHEAD_BYTES


# Deduplication window entries per DEDUP_DIGESTS record of a checkpoint (16 bytes each).
DEDUP_BATCH_ENTRIES = 4096
NO_ROUTE = 312
_EXPIRED_MEMORY = 4096  # how many expired tags a channel remembers for late-ack errors


def _int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _name(v: Any) -> bool:
    return isinstance(v, str) and len(v.encode("utf-8", "replace")) <= 255


_MAX_MS = (1 << 32) - 1  # RabbitMQ's bound for TTLs and timeouts in ms (49.7 days)
_INT63 = (1 << 63) - 1

#: The queue arguments the broker knows, each with its check. Any other ``x-``
#: argument is refused (see ``check_entity_arguments``).
QUEUE_ARGUMENTS: dict[str, Callable[[Any], bool]] = {
    "x-max-length": _int_in(0, _INT63),
    "x-max-length-bytes": _int_in(0, _INT63),
    "x-overflow": lambda v: v in ("drop-head", "reject-publish", "reject-publish-dlx"),
    "x-message-ttl": _int_in(0, _MAX_MS),
    "x-consumer-timeout": _int_in(1, _MAX_MS),
    "x-dead-letter-exchange": _name,
    "x-dead-letter-routing-key": _name,
    "x-delivery-limit": _int_in(0, _INT63),
    "x-expires": _int_in(1, _MAX_MS),
    "x-single-active-consumer": lambda v: isinstance(v, bool),
    "x-max-priority": _int_in(0, 255),  # 0: one level, a FIFO queue (RabbitMQ accepts it)
    # a single node has one kind of queue (quorum is accepted, a no-op); in a cluster
    # (docs/cluster.md) quorum is a queue replicated on that many nodes
    "x-queue-type": lambda v: v in ("classic", "quorum"),
    "x-quorum-initial-group-size": _int_in(1, 255),
    # Where a cluster places the queue (docs/cluster.md); a single node has one place.
    # RabbitMQ's quorum names, its classic one, and their older spellings:
    "x-queue-leader-locator": lambda v: v in ("client-local", "balanced", "random", "least-leaders"),
    "x-queue-master-locator": lambda v: v in ("client-local", "min-masters", "random"),
    # RabbitMQ's own storage settings, checked as RabbitMQ checks them and otherwise
    # moot here: every queue pages its messages out to the log past a memory budget
    # (lazy, v2), and dead-letters as docs/failures.md says whatever the strategy.
    "x-queue-mode": lambda v: v in ("default", "lazy"),
    "x-queue-version": lambda v: v in (1, 2) and not isinstance(v, bool),
    "x-max-in-memory-length": _int_in(0, _INT63),
    "x-max-in-memory-bytes": _int_in(0, _INT63),
    "x-dead-letter-strategy": lambda v: v in ("at-most-once", "at-least-once"),
    # RabbitMQ 2's mirroring arguments: RabbitMQ 3 ignores them, and so does ackbus
    "x-ha-policy": lambda v: True,
    "x-ha-nodes": lambda v: True,
    "x-ha-params": lambda v: True,
}
#: The exchange arguments the broker knows.
EXCHANGE_ARGUMENTS: dict[str, Callable[[Any], bool]] = {
    "alternate-exchange": _name,
    "hash-header": _name,  # x-consistent-hash: hash this header, not the routing key
    # x-delayed-message (RabbitMQ's plugin): the type it routes as, required there
    # (routing.routing_type); on another type kept and meaningless, as in RabbitMQ
    "x-delayed-type": lambda v: isinstance(v, str) and v in DELAYED_ROUTING_TYPES,
}

#: The reason a deleted queue's consumers are cancelled with (a caller that takes a
#: queue out of the core for another reason gives its own: ``QueueStore.delete_queue``).
QUEUE_DELETED = "queue deleted"

PublishResult = tuple[int, int]  # (publish tag, number of queues routed to)

_ENQUEUE = int(rec.RecordType.ENQUEUE)  # (a plain int: compared once per replayed record)
# Paged-out messages are read back from the log this many at once.
PAGE_IN_BATCH = 1024


def check_entity_arguments(kind: str, arguments: dict[str, Any], known: dict[str, Any]) -> None:
    """Refuse an unknown ``x-`` argument (a typo must not silently mean nothing) or a
    known one with a bad value, naming it. Other names are kept as metadata."""
    for key, value in arguments.items():
        check = known.get(key)
        if check is None:
            if key.startswith("x-"):
                raise InvalidArgument(
                    f"unknown {kind} argument {key!r} (known: {', '.join(sorted(known))})"
                )
            continue
        if not check(value):
            raise InvalidArgument(f"invalid value for {kind} argument {key}: {value!r}")


def check_arguments(arguments: Any) -> dict[str, Any]:
    """The ``arguments`` of a declare or binding: an object of JSON values (None: none)."""
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        raise InvalidArgument("arguments must be an object")
    check_json_value(arguments, "arguments")
    return arguments

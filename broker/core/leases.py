"""Gets: REST gets (leases), whose deliveries belong to channel 0 and are named by lease
ids, and a channel's get (AMQP's basic.get, :meth:`Leases.channel_get`).

``POST /queues/{name}/get`` takes messages as leases; a lease id names the delivery
(boot id, tag) so that one from an earlier run of the broker is recognised as gone.
Long-polls park on a queue and are woken by ``QueueReady``.

A lease is a delivery of the REST channel (or of a lease-mode consumer):
:class:`Leases` works through the deliveries' channels and settling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import CoreConfig
from .constants import REST_CHANNEL
from .deadletter import DeadLetters
from .delays import Delays
from .delivery import Deliveries, lease_id
from .entities import ChannelState, Delivery, Queue
from .errors import (
    InvalidArgument,
    NotFound,
)
from .log import MessageLog
from .message import Entry, StoredMessage
from .queues import QueueStore

__all__ = ["ChannelGot", "Leases", "MAX_GET_QUEUES"]

#: Most queues one get may wait on, and the largest weight of one.
MAX_GET_QUEUES = 32
MAX_GET_WEIGHT = 1000


@dataclass(slots=True, frozen=True)
class ChannelGot:
    """What a channel's get took: the delivery (its tag on the channel, whether it was
    delivered before, the message) and how many ready messages the queue has left."""

    delivery_tag: int
    redelivered: bool
    message: StoredMessage
    message_count: int


class Leases:
    """Leases (see the module docstring). Owns the state of weighted multi-queue gets."""

    def __init__(
        self,
        deliveries: Deliveries,
        queues: QueueStore,
        delays: Delays,
        dead_letters: DeadLetters,
        log: MessageLog,
        stats: dict[str, int],
        *,
        clock: Callable[[], float],
        boot_id: str,
        config: CoreConfig,
    ) -> None:
        self._deliveries = deliveries
        self._channels = deliveries.channels
        self._store = queues
        self._delays = delays
        self._dead_letter = dead_letters.dead_letter
        self._log = log
        self._stats = stats
        self._clock = clock
        self._boot_id = boot_id
        self._default_lease_s = config.default_lease_s
        self._max_lease_s = config.max_lease_s
        # smooth weighted round-robin state of weighted multi-queue gets, by (names, weights)
        self._get_weights: dict[tuple[tuple[str, ...], tuple[int, ...]], list[int]] = {}

    def _hand_out(self, ch: ChannelState, queue: Queue, entry: Entry) -> tuple[int, bool]:
        """Number a message taken from ``queue`` for ``ch`` and count it delivered;
        returns its delivery tag and whether it is a redelivery."""
        tag = ch.next_tag
        ch.next_tag += 1
        redelivered = entry.deliveries > 0
        queue.delivered += 1
        self._stats["delivered"] += 1
        if redelivered:
            queue.redelivered += 1
        return tag, redelivered

    def _lease_id(self, channel_id: int, tag: int) -> str:
        return lease_id(self._boot_id, channel_id, tag)

    def _parse_lease(self, lease_id: Any) -> tuple[ChannelState, Delivery]:
        if not isinstance(lease_id, str):
            raise InvalidArgument("lease ids must be strings")
        boot, _, rest = lease_id.rpartition("-")
        boot, _, chan = boot.rpartition("-")
        # Only the exact spelling the broker handed out names a lease: "01" or
        # non-ASCII digits would otherwise alias (or crash int()) and let one
        # request settle the same delivery twice.
        if (
            boot != self._boot_id
            or not (chan.isascii() and chan.isdigit() and rest.isascii() and rest.isdigit())
            or lease_id != self._lease_id(int(chan), int(rest))
        ):
            raise NotFound(f"unknown lease {lease_id!r} (expired, settled, or from before a restart)")
        ch = self._channels.get(int(chan))
        d = ch.deliveries.get(int(rest)) if ch is not None else None
        if ch is None or d is None:
            raise NotFound(f"unknown lease {lease_id!r} (expired, settled, or from before a restart)")
        if ch.id != REST_CHANNEL and (d.consumer is None or d.consumer.lease_s is None):
            raise NotFound(f"unknown lease {lease_id!r}")
        return ch, d

    def get(
        self, queue_name: str, max_count: int = 1, lease_s: float | None = None
    ) -> list[tuple[str, Delivery, bool]]:
        """Take up to ``max_count`` ready messages as leases (REST get).

        Each lease returns its message to the queue, redelivered, unless acked
        within ``lease_s``. Returns (lease_id, delivery, redelivered) triples; empty
        if none ready.
        Raises NotFound, ResourceLocked, InvalidArgument.
        """
        queue = self._store.queue(queue_name)
        if lease_s is None:
            lease_s = self._default_lease_s
        if not 0 < lease_s <= self._max_lease_s:
            raise InvalidArgument(f"lease must be between 0 and {self._max_lease_s:g} seconds")
        ch = self._channels[REST_CHANNEL]
        self._delays.touch_queue(queue)
        if queue.auto_delete:
            self._delays.rest_read(queue)  # a reader: deleted once idle (see delays.py)
        out: list[tuple[str, Delivery, bool]] = []
        deadline = self._clock() + lease_s
        while len(out) < max_count:
            entry = self._store.pop_live(queue)
            if entry is None:
                break
            tag, redelivered = self._hand_out(ch, queue, entry)
            self._deliveries.count_delivery(queue, entry)
            d = Delivery(tag, entry, queue, None, deadline)
            ch.deliveries[tag] = d
            ch.unacked += 1
            queue.unacked += 1
            queue.totals.unacked += 1
            self._deliveries.push_deadline(deadline, REST_CHANNEL, tag)
            out.append((self._lease_id(REST_CHANNEL, tag), d, redelivered))
        return out

    def channel_get(self, channel_id: int, queue_name: str, *, no_ack: bool = False) -> ChannelGot | None:
        """A channel's get (AMQP's basic.get): the queue's next ready message as a
        delivery of ``channel_id``, tagged in turn with its consumers' deliveries:
        unacked (settled by the channel's ack, nack or reject; back in its queue when
        the channel closes or the queue's ack timeout passes) or, with ``no_ack``,
        settled at once. Unlike a consumer it ignores prefetch, credit and a
        single-active-consumer queue's turns, and it does not make an auto-delete
        queue's reader (RabbitMQ's get does neither). None when nothing is ready.
        Raises ChannelError, NotFound, ResourceLocked."""
        deliveries = self._deliveries
        ch = deliveries.channel(channel_id)
        queue = self._store.queue(queue_name, channel_id)
        self._delays.touch_queue(queue)
        entry = self._store.pop_live(queue)
        if entry is None:
            return None
        tag, redelivered = self._hand_out(ch, queue, entry)
        if no_ack:
            queue.acked += 1
            self._log.settle_entry(queue, entry)
        else:
            deliveries.count_delivery(queue, entry)
            deadline = self._clock() + deliveries.ack_timeout_s(queue)
            ch.deliveries[tag] = Delivery(tag, entry, queue, None, deadline)
            ch.unacked += 1
            queue.unacked += 1
            queue.totals.unacked += 1
            deliveries.push_deadline(deadline, channel_id, tag)
        return ChannelGot(tag, redelivered, entry.message, queue.ready_count())

    def get_any(
        self,
        queue_names: list[Any],
        max_count: int = 1,
        lease_s: float | None = None,
        weights: list[Any] | None = None,
    ) -> tuple[str | None, list[tuple[str, Delivery, bool]]]:
        """One get over several queues: up to ``max_count`` messages from the first of
        ``queue_names`` that has any (strict preference), as :meth:`get` leases them;
        with ``weights`` (one positive integer per queue), from the queues that have
        messages in proportion to their weights instead (smooth weighted round-robin,
        deterministic). Returns (that queue's name, the leases), or (None, []) when all
        are empty. Everything is checked first: a bad request changes nothing.
        Raises NotFound, ResourceLocked, InvalidArgument."""
        if not isinstance(queue_names, list) or not 1 <= len(queue_names) <= MAX_GET_QUEUES:
            raise InvalidArgument(f"queues must be a list of 1..{MAX_GET_QUEUES} queue names")
        if len(set(map(str, queue_names))) != len(queue_names):
            raise InvalidArgument("queues lists a queue twice")
        for name in queue_names:
            if not isinstance(name, str):
                raise InvalidArgument("queues must be a list of queue names")
            self._store.queue(name)
        if lease_s is not None and not 0 < lease_s <= self._max_lease_s:
            raise InvalidArgument(f"lease must be between 0 and {self._max_lease_s:g} seconds")
        order: list[str] = queue_names
        if weights is not None:
            if (
                not isinstance(weights, list)
                or len(weights) != len(queue_names)
                or not all(type(w) is int and 1 <= w <= MAX_GET_WEIGHT for w in weights)
            ):
                raise InvalidArgument(f"weights must be one integer 1..{MAX_GET_WEIGHT} per queue")
            order = self._weighted_order(queue_names, weights)
        for name in order:
            leases = self.get(name, max_count, lease_s)
            if leases:
                return name, leases
        return None, []

    def _weighted_order(self, names: list[str], weights: list[int]) -> list[str]:
        """``names`` with the one whose turn it is first: smooth weighted round-robin
        (nginx's) among the queues that have messages, its state kept per list."""
        ready = [i for i, name in enumerate(names) if self._store.queues[name].has_ready()]
        if not ready:
            return names
        key = (tuple(names), tuple(weights))
        current = self._get_weights.get(key)
        if current is None:
            if len(self._get_weights) >= 1024:
                self._get_weights.clear()  # (bounded: the lists a broker sees are few)
            current = self._get_weights[key] = [0] * len(names)
        total = 0
        for i in ready:
            current[i] += weights[i]
            total += weights[i]
        chosen = max(ready, key=lambda i: current[i])
        current[chosen] -= total
        return [names[chosen], *(name for i, name in enumerate(names) if i != chosen)]

    def ack_leases(self, lease_ids: list[Any], queue: str | None = None) -> int:
        """Ack leases (all validated first: an unknown id changes nothing).

        With ``queue``, every lease must belong to that queue. Raises NotFound;
        Unavailable (``storage_failed``) while the log cannot be written (see
        ``purge_queue``): nothing is acked then."""
        pairs = self._leases(lease_ids, queue)
        for _ch, d in pairs:
            self._log.check_settles_writable(d.queue, "ack")
        for ch, d in pairs:
            del ch.deliveries[d.tag]
            self._deliveries.finish_delivery(ch, d)
            d.queue.acked += 1
            self._stats["acked"] += 1
            self._log.settle_entry(d.queue, d.entry)
        return len(pairs)

    def nack_leases(
        self,
        lease_ids: list[Any],
        requeue: bool = True,
        queue: str | None = None,
        *,
        delay_s: float | None = None,
    ) -> int:
        """Return leases to their queue (after ``delay_s``, if given), or dead-letter
        them (reason ``rejected``; dropped when the queue has no dead-letter exchange).
        Raises NotFound, InvalidArgument; Unavailable when dropping while the log
        cannot be written (see ``ack_leases``)."""
        if delay_s is not None and not requeue:
            raise InvalidArgument("a delay needs requeue: a message not requeued does not come back")
        pairs = self._leases(lease_ids, queue)
        if not requeue:
            for _ch, d in pairs:
                self._log.check_settles_writable(d.queue, "drop a message")
        for ch, d in pairs:
            del ch.deliveries[d.tag]
            if requeue:
                self._deliveries.requeue_deliveries(ch, [d], taken=True, delay_s=delay_s)
            else:
                self._deliveries.finish_delivery(ch, d)
                self._dead_letter(d.queue, d.entry, "rejected")
        return len(pairs)

    def extend_leases(self, lease_ids: list[Any], lease_s: float, queue: str | None = None) -> int:
        """Give leases ``lease_s`` more seconds from now. Raises NotFound, InvalidArgument."""
        if not 0 < lease_s <= self._max_lease_s:
            raise InvalidArgument(f"lease must be between 0 and {self._max_lease_s:g} seconds")
        pairs = self._leases(lease_ids, queue)
        deadline = self._clock() + lease_s
        for ch, d in pairs:
            self._deliveries.reset_deadline(ch, d, deadline)
        return len(pairs)

    def _leases(self, lease_ids: list[Any], queue: str | None = None) -> list[tuple[ChannelState, Delivery]]:
        if not isinstance(lease_ids, list) or not lease_ids:
            raise InvalidArgument("lease_ids must be a non-empty list")
        pairs = []
        seen = set()
        for lid in lease_ids:
            pair = self._parse_lease(lid)  # first: rejects non-strings (unhashable too)
            if queue is not None and pair[1].queue.name != queue:
                raise NotFound(f"lease {lid!r} does not belong to queue {queue!r}")
            if lid in seen:
                raise InvalidArgument(f"lease {lid!r} is listed twice")
            seen.add(lid)
            pairs.append(pair)
        return pairs

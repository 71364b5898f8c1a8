"""The broker state machine.

Theory of operation
-------------------

:class:`Broker` holds every exchange, queue, binding, channel, consumer and unsettled
delivery, and changes them only in response to commands: method calls such as
:meth:`Broker.publish`, :meth:`Broker.ack` or :meth:`Broker.advance` (time passed).
It performs no IO. What the outside world must do as a consequence accumulates as
effects (:mod:`broker.core.effects`) that the IO layer collects with
:meth:`Broker.take_effects`:

* events for channels (``Deliver``, ``Confirm``, ``Return``, ``ConsumerCancelled``,
  ``DeliveryExpired``);
* records for the log (``AppendRecords``), numbered by LSN in the order the core
  produced them; the IO layer reports back with :meth:`Broker.durable` once records
  up to an LSN are on disk, or :meth:`Broker.storage_failed` when they could not be
  written;
* wake-ups for parked long-polls (``QueueReady``).

A publisher confirm waits inside the core for the LSN of its message's ``ENQUEUE``
record (LSN 0 when nothing needed writing), so the channel code never knows whether
storage exists. Deliveries to consumers go out before the record is durable, as in
RabbitMQ; a consumer may therefore see a message whose publish is later nacked.

Time and identity arrive from outside: ``clock()`` is a monotonic clock for ack
timeouts and leases, ``wall_clock()`` the epoch clock for message timestamps, TTLs
and the deduplication window; ``boot_id`` makes lease ids and server-generated names
unique across restarts.

Flow control: each channel holds a byte *credit* granted by the IO layer as it
drains the channel's outgoing buffer; deliveries stop while the credit is spent and
resume when more is granted, so a consumer that stops reading never makes the broker
buffer without bound.

Channel 0 always exists: it is the REST API's channel, owner of the leases handed out
by ``POST /queues/{name}/get`` and of one-shot REST publishes.
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_right
from struct import error as struct_error
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import records as rec
from .dedup import DedupWindow, digest_utf8
from .effects import (
    AppendRecords,
    Confirm,
    ConsumerCancelled,
    Deliver,
    DeliveryExpired,
    Effect,
    MessageLost,
    QueueReady,
    Return,
)
from .entities import Channel, Consumer, Delivery, Exchange, Queue
from .errors import (
    AccessRefused,
    ChannelError,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
    Unavailable,
)
from .message import Entry, Message, check_json_value
from .names import check_name, check_routing_key
from .paging import ReplayIndex, locator, mark_all_delivered
from .routing import EXCHANGE_TYPES

__all__ = ["Broker", "REST_CHANNEL", "BUILTIN_EXCHANGES", "PublishResult"]

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
# Deduplication window entries per DEDUP_DIGESTS record of a checkpoint (16 bytes each).
DEDUP_BATCH_ENTRIES = 4096
NO_ROUTE = 312
_EXPIRED_MEMORY = 4096  # how many expired tags a channel remembers for late-ack errors
_TIMERS_COMPACT_MIN = 1024  # timer heap size below which stale entries are not worth a rebuild

QUEUE_ARGUMENTS: dict[str, Callable[[Any], bool]] = {
    "x-max-length": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "x-overflow": lambda v: v in ("drop-head", "reject-publish"),
    "x-message-ttl": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "x-consumer-timeout": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
}

PublishResult = tuple[int, int]  # (publish tag, number of queues routed to)

#: Reads log records back by LSN: ``(rtype, payload)`` each, or why it could not.
ReadLog = Callable[[Sequence[int]], list[tuple[int, bytes] | str]]
# A durable queue keeps at most this many ready messages in memory before paging the
# rest of its backlog out (see core/paging.py); they are paged back in this many at once.
MEMORY_MESSAGES_PER_QUEUE = 2048
_ENQUEUE = int(rec.RecordType.ENQUEUE)  # (a plain int: compared once per replayed record)
PAGE_IN_BATCH = 1024


class Broker:
    """Every entity of one broker and the rules that tie them together."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        boot_id: str = "0",
        dedup_window_s: float = 120.0,
        consumer_timeout_s: float = 1800.0,
        default_lease_s: float = 30.0,
        max_lease_s: float = 43200.0,
        channel_credit_bytes: int = 1 << 20,
        max_queues: int = 10000,
        max_exchanges: int = 10000,
        max_prefetch: int = 65535,
        read_log: ReadLog | None = None,
        memory_messages_per_queue: int = MEMORY_MESSAGES_PER_QUEUE,
    ) -> None:
        """``read_log``: how to read logged records back; without it nothing is paged
        out and every message stays in memory."""
        self.clock = clock
        self.wall_clock = wall_clock
        self.boot_id = boot_id
        self.consumer_timeout_s = consumer_timeout_s
        self.default_lease_s = default_lease_s
        self.max_lease_s = max_lease_s
        self.channel_credit_bytes = channel_credit_bytes
        self.max_queues = max_queues
        self.max_exchanges = max_exchanges
        self.max_prefetch = max_prefetch
        self.read_log = read_log
        self.memory_messages_per_queue = memory_messages_per_queue
        # queues whose tail may hold messages to page out once their records are written
        self._page_out_due: dict[str, Queue] = {}
        # compaction: (new LSN, seq, [(queue, in-memory entry or None if paged out)]) of
        # records logged again, applied to the queues once the new copy is written
        self._relocations: list[tuple[int, int, list[tuple[Queue, Entry | None]]]] = []

        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self._queues_by_id: dict[int, Queue] = {}
        self.channels: dict[int, Channel] = {}
        self.dedup = DedupWindow(dedup_window_s)

        self._next_seq = 1
        self._next_qid = 1
        self._next_channel = 1
        self._next_name = 1
        self._next_consumer = 1

        # log
        self.last_lsn = 0  # LSN of the last record produced
        self.durable_lsn = 0  # every record up to this LSN is on disk
        self._records: list[tuple[int, bytes]] = []
        self._first_pending_lsn = 1
        self._settles: dict[int, list[int]] = {}
        self._delivered_marks: dict[int, list[int]] = {}
        # (lsn, message, queues routed to) of ENQUEUE records not yet durable
        self._unsynced: list[tuple[int, Message, list[Queue]]] = []
        self.storage_ok = True
        self.storage_reason = ""
        # False while the broker shuts down: nothing more is handed to consumers.
        self.delivering = True

        self._effects: list[Effect] = []
        self._dirty_queues: dict[str, Queue] = {}
        # queues with parked long-polls that received messages: after dispatch, those
        # still holding ready messages wake their getters (consumers may be full)
        self._getter_checks: dict[str, Queue] = {}
        self._confirm_dirty: dict[int, Channel] = {}
        self._timers: list[tuple[float, int, int]] = []  # (deadline, channel id, tag)
        self._timers_compact_at = _TIMERS_COMPACT_MIN

        # recovery state: the messages of each queue by qid; None once recovery finished
        self._replay: dict[int, ReplayIndex] | None = None
        # deduplication entries of the logged publishes replayed, in log order
        self._replay_dedup_digests: array[int] = array("Q")
        self._replay_dedup_ms: array[int] = array("q")
        self._replay_dedup_from = 0.0
        self._replay_messages: dict[int, Message] = {}

        self.stats = {
            "published": 0,
            "delivered": 0,
            "acked": 0,
            "confirmed": 0,
            "nacked": 0,
            "returned": 0,
            "deduplicated": 0,
        }

        for name, etype in BUILTIN_EXCHANGES.items():
            self.exchanges[name] = Exchange(name, etype, True, False, False, {}, builtin=True)
        self.channels[REST_CHANNEL] = Channel(REST_CHANNEL, credit=1 << 62)

    # ------------------------------------------------------------------ effects

    def take_effects(self) -> list[Effect]:
        """Settle pending work (dispatch, confirms, log records) and hand over the effects."""
        if self._dirty_queues:
            self._dispatch_dirty()
        if self._getter_checks:
            for queue in self._getter_checks.values():
                if queue.getters and queue.has_ready() and not queue.deleted:
                    self._effects.append(QueueReady(queue.name))
            self._getter_checks.clear()
        # Records logged before the marks (publishes, declares...) have waiters.
        lazy = not self._records
        if self._settles or self._delivered_marks:
            self._flush_marks()
        if self._records:
            records = self._records
            self._records = []
            self._effects.append(AppendRecords(records, self._first_pending_lsn, self.last_lsn, lazy))
            self._first_pending_lsn = self.last_lsn + 1
        if self._confirm_dirty:
            self._release_confirms()
        effects = self._effects
        self._effects = []
        return effects

    def _append(self, rtype: int, payload: bytes) -> int:
        if self._replay is not None:
            return 0
        self._records.append((rtype, payload))
        self.last_lsn += 1
        return self.last_lsn

    def _flush_marks(self) -> None:
        if self._replay is not None:
            self._settles.clear()
            self._delivered_marks.clear()
            return
        for qid, seqs in self._delivered_marks.items():
            self._append(rec.RecordType.DELIVERED, rec.encode_seqs(qid, seqs))
        self._delivered_marks.clear()
        for qid, seqs in self._settles.items():
            self._append(rec.RecordType.SETTLE, rec.encode_seqs(qid, seqs))
        self._settles.clear()

    # ----------------------------------------------------------- storage feedback

    def durable(self, lsn: int) -> None:
        """Records up to ``lsn`` are on disk: release the confirms that waited on them."""
        if lsn <= self.durable_lsn:
            return
        self.durable_lsn = lsn
        unsynced = self._unsynced
        if unsynced:
            i = 0
            while i < len(unsynced) and unsynced[i][0] <= lsn:
                i += 1
            del unsynced[:i]
        for ch in self.channels.values():
            if len(ch.confirms):
                self._confirm_dirty[ch.id] = ch
        if self._relocations and self._relocations[0][0] <= lsn:
            self._apply_relocations(lsn)
        if self._page_out_due:
            self._page_out()

    def storage_failed(self, first_lsn: int, last_lsn: int, reason: str) -> None:
        """Records ``first_lsn``..``last_lsn`` could not be written.

        Publishes that waited on them are nacked, their messages leave the queues they
        have not yet left and are forgotten by the deduplication window (so a resend
        is taken again), and persistent publishes are refused until
        :meth:`storage_recovered`.
        """
        self.storage_ok = False
        self.storage_reason = reason
        if self._relocations:  # copies never written: the messages stay where they were
            self._relocations = [r for r in self._relocations if not first_lsn <= r[0] <= last_lsn]
        for ch in self.channels.values():
            if ch.confirms.fail_lsns(first_lsn, last_lsn, f"storage failure: {reason}"):
                self._confirm_dirty[ch.id] = ch
        failed = [item for item in self._unsynced if first_lsn <= item[0] <= last_lsn]
        if not failed:
            return
        self._unsynced = [item for item in self._unsynced if not first_lsn <= item[0] <= last_lsn]
        by_queue: dict[str, set[int]] = {}
        for _lsn, message, queues in failed:
            mid = message.message_id
            if mid is not None:
                self.dedup.forget(message.exchange, mid)
            for routed in queues:
                by_queue.setdefault(routed.name, set()).add(message.seq)
        for qname, seqs in by_queue.items():
            queue = self.queues.get(qname)
            if queue is not None:
                queue.remove_entries(seqs)

    def storage_recovered(self) -> None:
        """Writes succeed again: accept persistent publishes again."""
        self.storage_ok = True
        self.storage_reason = ""

    # ------------------------------------------------------------------ exchanges

    def declare_exchange(
        self,
        name: str,
        type: str = "direct",
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
        passive: bool = False,
    ) -> tuple[Exchange, bool]:
        """Declare an exchange; return it and whether it was created.

        Raises NotFound (passive, missing), PreconditionFailed (exists with other
        settings), AccessRefused (reserved name), InvalidArgument, Unavailable.
        """
        if name == DEFAULT_EXCHANGE:
            if passive or type == "direct":
                return self.exchanges[DEFAULT_EXCHANGE], False
            raise AccessRefused("the default exchange cannot be redeclared")
        check_name("exchange", name, allow_reserved=True)
        arguments = _check_arguments(arguments)
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise NotFound(f"no exchange {name!r}")
            return existing, False
        if type not in EXCHANGE_TYPES:
            raise InvalidArgument(
                f"exchange type must be one of {', '.join(EXCHANGE_TYPES)}, not {type!r}"
            )
        if existing is not None:
            if existing.settings() != (type, durable, auto_delete, internal, arguments):
                raise PreconditionFailed(
                    f"exchange {name!r} exists with other settings "
                    f"(type={existing.type}, durable={existing.durable}, "
                    f"auto_delete={existing.auto_delete}, internal={existing.internal}, "
                    f"arguments={existing.arguments})"
                )
            return existing, False
        check_name("exchange", name)
        if len(self.exchanges) - len(BUILTIN_EXCHANGES) >= self.max_exchanges:
            raise Unavailable(f"exchange limit reached ({self.max_exchanges})", code="limit_reached")
        if durable and not self.storage_ok:
            raise Unavailable(f"storage is failing: {self.storage_reason}", code="storage_failed")
        exchange = Exchange(name, type, durable, auto_delete, internal, arguments)
        self.exchanges[name] = exchange
        if durable:
            self._append(rec.RecordType.DECLARE_EXCHANGE, rec.encode_json(exchange.info()))
        return exchange, True

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Delete an exchange and every binding from or to it.

        Raises NotFound, AccessRefused (built-in exchange), PreconditionFailed (if_unused).
        """
        exchange = self._exchange(name)
        if exchange.builtin:
            raise AccessRefused(f"exchange {name or 'amq.default'!r} is built in and cannot be deleted")
        if if_unused and exchange.table.bindings:
            raise PreconditionFailed(f"exchange {name!r} has bindings")
        self._delete_exchange(exchange)

    def _delete_exchange(self, exchange: Exchange) -> None:
        for (dest, _key, _f), _args in list(exchange.table.bindings.items()):
            self._forget_binding_dest(exchange.name, dest)
        exchange.table.bindings.clear()
        for source_name in list(exchange.bound_from):
            source = self.exchanges.get(source_name)
            if source is not None:
                source.table.remove_destination(("x", exchange.name))
                self._maybe_auto_delete_exchange(source)
        del self.exchanges[exchange.name]
        if exchange.durable:
            self._append(rec.RecordType.DELETE_EXCHANGE, rec.encode_json({"name": exchange.name}))

    def _forget_binding_dest(self, source: str, dest: Any) -> None:
        kind, dname = dest
        if kind == "q":
            queue = self.queues.get(dname)
            if queue is not None:
                queue.bound_from.discard(source)
        else:
            target = self.exchanges.get(dname)
            if target is not None:
                target.bound_from.discard(source)

    def _exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange {name!r}")
        return exchange

    def _maybe_auto_delete_exchange(self, exchange: Exchange) -> None:
        # Not during replay: it sees only durable bindings (one to a transient queue
        # may have kept the exchange alive), and every auto-delete that happened
        # live is in the log as its own DELETE_EXCHANGE record.
        if self._replay is not None:
            return
        if exchange.auto_delete and not exchange.table.bindings and not exchange.builtin:
            self._delete_exchange(exchange)

    # --------------------------------------------------------------------- queues

    def declare_queue(
        self,
        name: str,
        *,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        passive: bool = False,
        channel_id: int = REST_CHANNEL,
    ) -> tuple[Queue, bool]:
        """Declare a queue; return it and whether it was created.

        An empty name asks for a server-generated one. Raises NotFound (passive,
        missing), PreconditionFailed (exists with other settings), ResourceLocked
        (exclusive to another channel), AccessRefused, InvalidArgument, Unavailable,
        ChannelError (exclusive on a channel that is not open).
        """
        arguments = _check_arguments(arguments)
        generated = name == ""
        if generated:
            if passive:
                raise NotFound("no queue ''")
            # Skip names already taken (a durable server-named queue recovered
            # from a run that used the same boot id).
            while True:
                name = f"amq.gen-{self.boot_id}-{self._next_name}"
                self._next_name += 1
                if name not in self.queues:
                    break
        else:
            check_name("queue", name, allow_reserved=True)
        existing = self.queues.get(name)
        if existing is not None:
            if existing.exclusive_owner is not None and existing.exclusive_owner != channel_id:
                raise ResourceLocked(f"queue {name!r} is exclusive to another channel")
            if not passive and existing.settings() != (durable, exclusive, auto_delete, arguments):
                raise PreconditionFailed(
                    f"queue {name!r} exists with other settings (durable={existing.durable}, "
                    f"exclusive={existing.exclusive_owner is not None}, "
                    f"auto_delete={existing.auto_delete}, arguments={existing.arguments})"
                )
            return existing, False
        if passive:
            raise NotFound(f"no queue {name!r}")
        if not generated:
            # only the broker may create amq.* queues (amq.gen-* included)
            check_name("queue", name)
        for key, value in arguments.items():
            check = QUEUE_ARGUMENTS.get(key)
            if check is not None and not check(value):
                raise InvalidArgument(f"invalid value for queue argument {key}: {value!r}")
        if exclusive and channel_id == REST_CHANNEL:
            raise InvalidArgument("exclusive queues belong to a channel: declare them on one")
        if exclusive:
            self._channel(channel_id)  # ChannelError before anything changes
        if len(self.queues) >= self.max_queues:
            raise Unavailable(f"queue limit reached ({self.max_queues})", code="limit_reached")
        if durable and not exclusive and not self.storage_ok:
            raise Unavailable(f"storage is failing: {self.storage_reason}", code="storage_failed")
        queue = Queue(
            self._next_qid, name, durable, channel_id if exclusive else None, auto_delete, arguments
        )
        self._next_qid += 1
        self.queues[name] = queue
        self._queues_by_id[queue.qid] = queue
        if exclusive:
            self.channels[channel_id].exclusive_queues.add(name)
        if queue.persistent_log:
            self._append(rec.RecordType.DECLARE_QUEUE, rec.encode_json(_queue_record(queue)))
        # every queue is bound to the default exchange by its name (implicitly)
        return queue, True

    def _queue(self, name: str, channel_id: int = REST_CHANNEL) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue {name!r}")
        if queue.exclusive_owner is not None and queue.exclusive_owner != channel_id:
            raise ResourceLocked(f"queue {name!r} is exclusive to another channel")
        return queue

    def delete_queue(
        self,
        name: str,
        *,
        if_unused: bool = False,
        if_empty: bool = False,
        channel_id: int = REST_CHANNEL,
    ) -> int:
        """Delete a queue; return how many ready messages it held.

        Its consumers are cancelled (``ConsumerCancelled``); its unacked deliveries
        stay with their channels and are simply forgotten when settled.
        Raises NotFound, ResourceLocked, PreconditionFailed (if_unused / if_empty).
        """
        queue = self._queue(name, channel_id)
        if if_unused and queue.consumers:
            raise PreconditionFailed(f"queue {name!r} has consumers")
        if if_empty and queue.ready_count():
            raise PreconditionFailed(f"queue {name!r} is not empty")
        return self._delete_queue(queue, "queue deleted")

    def _delete_queue(self, queue: Queue, reason: str) -> int:
        count = queue.ready_count()
        queue.deleted = True
        if queue.getters:
            self._effects.append(QueueReady(queue.name))  # parked gets answer 404 now
        for consumer in list(queue.consumers):
            self._remove_consumer(consumer, auto_delete=False)
            self._effects.append(ConsumerCancelled(consumer.channel.id, consumer.tag, reason))
        queue.clear_ready()
        self._page_out_due.pop(queue.name, None)
        for source_name in list(queue.bound_from):
            source = self.exchanges.get(source_name)
            if source is not None:
                source.table.remove_destination(("q", queue.name))
                self._maybe_auto_delete_exchange(source)
        queue.bound_from.clear()
        del self.queues[queue.name]
        del self._queues_by_id[queue.qid]
        self._dirty_queues.pop(queue.name, None)
        if queue.exclusive_owner is not None:
            owner = self.channels.get(queue.exclusive_owner)
            if owner is not None:
                owner.exclusive_queues.discard(queue.name)
        if queue.persistent_log:
            self._settles.pop(queue.qid, None)
            self._delivered_marks.pop(queue.qid, None)
            self._append(rec.RecordType.DELETE_QUEUE, rec.encode_json({"qid": queue.qid}))
        return count

    def purge_queue(self, name: str, *, channel_id: int = REST_CHANNEL) -> int:
        """Drop every ready message of a queue (not the unacked ones); return the count."""
        queue = self._queue(name, channel_id)
        entries, paged_seqs = queue.clear_ready()
        self._page_out_due.pop(queue.name, None)
        if queue.persistent_log:
            seqs = [e.message.seq for e in entries if e.message.persistent]
            seqs.extend(paged_seqs)
            if seqs:
                self._settles.setdefault(queue.qid, []).extend(seqs)
        return len(entries) + len(paged_seqs)

    def queue_info(self, queue: Queue) -> dict[str, Any]:
        ready = queue.ready_count()
        return {
            "name": queue.name,
            "durable": queue.durable,
            "exclusive": queue.exclusive_owner is not None,
            "auto_delete": queue.auto_delete,
            "arguments": queue.arguments,
            "messages": ready + queue.unacked,
            "messages_ready": ready,
            "messages_unacked": queue.unacked,
            "consumers": len(queue.consumers),
            "message_stats": {
                "published": queue.published,
                "delivered": queue.delivered,
                "acked": queue.acked,
                "redelivered": queue.redelivered,
            },
        }

    # ------------------------------------------------------------------- bindings

    def bind(
        self,
        source: str,
        destination: str,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
        *,
        to_exchange: bool = False,
        channel_id: int = REST_CHANNEL,
    ) -> bool:
        """Bind a queue (or, with ``to_exchange``, an exchange) to exchange ``source``.

        Returns False if the binding already existed. Raises NotFound, AccessRefused
        (the default exchange), ResourceLocked, InvalidArgument.
        """
        src, dest, key, arguments = self._binding_args(
            source, destination, routing_key, arguments, to_exchange, channel_id
        )
        if not src.table.add(key, routing_key, arguments):
            return False
        if to_exchange:
            self.exchanges[destination].bound_from.add(source)
        else:
            self.queues[destination].bound_from.add(source)
        if self._binding_durable(src, key):
            self._append(
                rec.RecordType.BIND,
                rec.encode_json(_binding_record(source, key, routing_key, arguments)),
            )
        return True

    def unbind(
        self,
        source: str,
        destination: str,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
        *,
        to_exchange: bool = False,
        channel_id: int = REST_CHANNEL,
    ) -> None:
        """Remove a binding. Raises NotFound (no such binding or entity), AccessRefused."""
        src, dest, key, arguments = self._binding_args(
            source, destination, routing_key, arguments, to_exchange, channel_id
        )
        if not src.table.remove(key, routing_key, arguments):
            raise NotFound("no such binding")
        if not any(bk[0] == key for bk in src.table.bindings):
            self._forget_binding_dest(source, key)
        if self._binding_durable(src, key):
            self._append(
                rec.RecordType.UNBIND,
                rec.encode_json(_binding_record(source, key, routing_key, arguments)),
            )
        self._maybe_auto_delete_exchange(src)

    def _binding_args(
        self,
        source: str,
        destination: str,
        routing_key: Any,
        arguments: dict[str, Any] | None,
        to_exchange: bool,
        channel_id: int,
    ) -> tuple[Exchange, Any, tuple[str, str], dict[str, Any]]:
        if source == DEFAULT_EXCHANGE:
            raise AccessRefused("the default exchange cannot be bound or unbound")
        if to_exchange and destination == DEFAULT_EXCHANGE:
            raise AccessRefused("the default exchange cannot be a binding destination")
        check_routing_key(routing_key)
        arguments = _check_arguments(arguments)
        src = self._exchange(source)
        if to_exchange:
            self._exchange(destination)
            key = ("x", destination)
        else:
            self._queue(destination, channel_id)
            key = ("q", destination)
        return src, key, key, arguments

    def _binding_durable(self, src: Exchange, key: tuple[str, str]) -> bool:
        if self._replay is not None or not src.durable:
            return False
        kind, name = key
        if kind == "q":
            queue = self.queues.get(name)
            return queue is not None and queue.persistent_log
        target = self.exchanges.get(name)
        return target is not None and target.durable

    def list_bindings(self) -> list[dict[str, Any]]:
        out = []
        for exchange in self.exchanges.values():
            for (dest, key, _f), args in exchange.table.bindings.items():
                kind, name = dest
                item: dict[str, Any] = {
                    "exchange": exchange.name,
                    "routing_key": key,
                    "arguments": args,
                }
                item["queue" if kind == "q" else "to_exchange"] = name
                out.append(item)
        return out

    # -------------------------------------------------------------------- routing

    def route(self, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None) -> list[Queue]:
        """The queues a message reaches, each once, following exchange-to-exchange
        bindings without looping on cycles."""
        if exchange.name == DEFAULT_EXCHANGE:
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None else []
        found: dict[str, Queue] = {}
        visited = {exchange.name}
        pending = [exchange]
        while pending:
            ex = pending.pop()
            for kind, name in ex.table.match(routing_key, headers):
                if kind == "q":
                    if name not in found:
                        queue = self.queues.get(name)
                        if queue is not None:
                            found[name] = queue
                elif name not in visited:
                    visited.add(name)
                    target = self.exchanges.get(name)
                    if target is not None:
                        pending.append(target)
        return list(found.values())

    # ------------------------------------------------------------------- channels

    def open_channel(self) -> int:
        """Open a channel; return its id."""
        channel_id = self._next_channel
        self._next_channel += 1
        self.channels[channel_id] = Channel(channel_id, self.channel_credit_bytes)
        return channel_id

    def close_channel(self, channel_id: int, reason: str = "channel closed") -> None:
        """End a channel, however it ended: requeue its unacked deliveries (marked
        redelivered), cancel its consumers, delete its exclusive queues, and drop the
        confirms still pending (nobody is left to receive them; messages already
        routed stay, and a client resend is caught by deduplication). Idempotent."""
        ch = self.channels.get(channel_id)
        if ch is None or channel_id == REST_CHANNEL:
            return
        ch.closed = True
        for consumer in list(ch.consumers.values()):
            self._remove_consumer(consumer)
        self._requeue_deliveries(ch, list(ch.deliveries.values()))
        for qname in list(ch.exclusive_queues):
            queue = self.queues.get(qname)
            if queue is not None:
                self._delete_queue(queue, "exclusive queue owner closed")
        del self.channels[channel_id]
        self._confirm_dirty.pop(channel_id, None)

    def grant_credit(self, channel_id: int, nbytes: int) -> None:
        """The IO layer drained ``nbytes`` of this channel's output: deliveries may resume."""
        ch = self.channels.get(channel_id)
        if ch is None:
            return
        was_blocked = ch.credit <= 0
        ch.credit = min(ch.credit + nbytes, self.channel_credit_bytes)
        if was_blocked and ch.credit > 0:
            for consumer in ch.consumers.values():
                self._dirty_queues[consumer.queue.name] = consumer.queue

    def _channel(self, channel_id: int) -> Channel:
        ch = self.channels.get(channel_id)
        if ch is None:
            raise ChannelError(f"channel {channel_id} is not open")
        return ch

    # -------------------------------------------------------------------- publish

    def publish(
        self,
        channel_id: int,
        exchange_name: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None = None,
        *,
        mandatory: bool = False,
    ) -> PublishResult:
        """Publish a message; return (publish tag, queues routed to).

        The publish is always answered later by exactly one ``Confirm`` effect for
        its tag (and preceded by a ``Return`` if mandatory and unroutable). Errors of
        the message itself (unknown exchange, storage failing, queue full) become a
        nack, not an exception. ``properties`` must already be validated.
        """
        ch = self._channel(channel_id)
        ch.publish_seq += 1
        tag = ch.publish_seq
        self.stats["published"] += 1
        self._confirm_dirty[channel_id] = ch
        exchange = self.exchanges.get(exchange_name)
        if exchange is None:
            ch.confirms.add(tag, 0, False, f"not_found: no exchange {exchange_name!r}")
            return tag, 0
        if exchange.internal:
            ch.confirms.add(tag, 0, False, f"access_refused: exchange {exchange_name!r} is internal")
            return tag, 0

        wall = self.wall_clock()
        message_id = properties.get("message_id") if properties else None
        if message_id is not None:
            seen_lsn = self.dedup.lookup(exchange_name, message_id, wall)
            if seen_lsn is not None:
                self.stats["deduplicated"] += 1
                ch.confirms.add(tag, seen_lsn)
                return tag, 0

        headers = properties.get("headers") if properties else None
        queues = self.route(exchange, routing_key, headers)
        if not queues:
            if mandatory:
                self.stats["returned"] += 1
                message = Message(0, exchange_name, routing_key, body, properties)
                self._effects.append(Return(channel_id, tag, NO_ROUTE, "NO_ROUTE", message))
            if message_id is not None:
                self.dedup.remember(exchange_name, message_id, wall, 0)
            ch.confirms.add(tag, 0)
            return tag, 0

        persistent = properties is None or properties.get("delivery_mode", 2) == 2
        durable_qids: list[int] = []
        if persistent:
            durable_qids = [q.qid for q in queues if q.persistent_log]
            if durable_qids and not self.storage_ok:
                ch.confirms.add(tag, 0, False, f"storage failure: {self.storage_reason}")
                return tag, 0
        nack_reason = None
        for queue in queues:
            if queue.max_length is not None and queue.overflow == "reject-publish":
                if queue.ready_count() >= queue.max_length:
                    nack_reason = f"queue {queue.name!r} is full (x-overflow reject-publish)"
        if nack_reason is not None:
            # RabbitMQ semantics: the publish is nacked; queues with room keep it.
            queues = [
                q
                for q in queues
                if not (
                    q.max_length is not None
                    and q.overflow == "reject-publish"
                    and q.ready_count() >= q.max_length
                )
            ]
            durable_qids = [q.qid for q in queues if persistent and q.persistent_log]

        seq = self._next_seq
        self._next_seq += 1
        msg_expires = None
        if properties is not None and "expiration" in properties:
            msg_expires = wall + properties["expiration"] / 1000.0
        message = Message(seq, exchange_name, routing_key, body, properties, msg_expires)
        # A nacked publish is not remembered for deduplication (neither live nor in
        # its ENQUEUE record): the nack asks the client to resend, and the resend
        # must be taken, not acked as a duplicate of a message that was refused.
        dedup_id = message_id if nack_reason is None else None
        lsn = 0
        if durable_qids:
            lsn = self._append(
                rec.RecordType.ENQUEUE,
                rec.encode_enqueue(
                    seq, wall, msg_expires, durable_qids, exchange_name, routing_key,
                    dedup_id, properties, body,
                ),
            )
            message.lsn = lsn
            self._unsynced.append((lsn, message, queues))  # a list of its own (route's)
        for queue in queues:
            self._enqueue(queue, message, wall)
        if dedup_id is not None:
            self.dedup.remember(exchange_name, dedup_id, wall, lsn)
        if nack_reason is not None:
            ch.confirms.add(tag, 0, False, nack_reason)
        else:
            ch.confirms.add(tag, lsn)
        return tag, len(queues)

    def _enqueue(self, queue: Queue, message: Message, wall: float) -> None:
        expires = message.expires_at
        if queue.message_ttl_s is not None:
            q_exp = wall + queue.message_ttl_s
            expires = q_exp if expires is None else min(expires, q_exp)
        entry = Entry(message, False, expires)
        if queue.tail or queue.paged:
            queue.tail.append(entry)
            self._page_out_due[queue.name] = queue
        elif len(queue.ready) < self.memory_messages_per_queue or self.read_log is None or not queue.persistent_log:
            queue.ready.append(entry)
        else:
            queue.tail.append(entry)
            self._page_out_due[queue.name] = queue
        queue.published += 1
        if queue.max_length is not None and queue.overflow == "drop-head":
            while queue.ready_count() > queue.max_length:
                self._drop_head(queue)
        if queue.consumers:
            self._dirty_queues[queue.name] = queue
        if queue.getters:
            self._getter_checks[queue.name] = queue

    def _settle_entry(self, queue: Queue, entry: Entry) -> None:
        if queue.persistent_log and entry.message.persistent and not queue.deleted:
            self._settles.setdefault(queue.qid, []).append(entry.message.seq)

    def _drop_head(self, queue: Queue) -> None:
        """Drop the oldest ready message (x-overflow drop-head) without reading it."""
        entry = queue.pop()
        if entry is not None:
            self._settle_entry(queue, entry)
            return
        for seq, _loc in queue.paged.take(1):
            self._settles.setdefault(queue.qid, []).append(seq)

    def _page_out(self) -> None:
        """Move the messages at the front of each due queue's tail whose records are
        written into its paged-out index, dropping their bodies from memory."""
        durable = self.durable_lsn
        for name, queue in list(self._page_out_due.items()):
            tail = queue.tail
            paged = queue.paged
            if queue.deleted:
                del self._page_out_due[name]
                continue
            while tail:
                message = tail[0].message
                lsn = message.lsn
                if lsn == 0 or not message.persistent:
                    # never logged: it stays in memory, and so does everything after it
                    del self._page_out_due[name]
                    break
                if lsn > durable:
                    break  # not written yet: a later durable() goes on
                entry = tail.popleft()
                paged.append(message.seq, (lsn << 1) | entry.delivered)
            else:
                del self._page_out_due[name]

    def _page_in(self, queue: Queue) -> None:
        """Read the next paged-out messages of ``queue`` back into its in-memory head."""
        while queue.paged and not queue.ready:
            queue.ready.extend(self._read_entries(queue, queue.paged.take(PAGE_IN_BATCH)))

    def _read_entries(self, queue: Queue, pairs: list[tuple[int, int]]) -> list[Entry]:
        """Entries for ``(seq, locator)`` pairs of ``queue``, read from the log.

        A message whose record cannot be read (a damaged or missing segment) leaves the
        queue for good, reported as a MessageLost effect."""
        read_log = self.read_log
        if read_log is None:
            raise RuntimeError("messages are indexed by LSN but the broker has no log to read")
        results = read_log([loc >> 1 for _seq, loc in pairs])
        ttl = queue.message_ttl_s
        out: list[Entry] = []
        for (seq, loc), result in zip(pairs, results):
            lsn = loc >> 1
            r = _logged_message(result, seq, lsn)
            if isinstance(r, str):
                self._settles.setdefault(queue.qid, []).append(seq)
                self._effects.append(MessageLost(queue.name, seq, lsn, r))
                continue
            message = Message(r.seq, r.exchange, r.routing_key, r.body, r.properties, r.expires_at, owned=True)
            message.lsn = lsn
            expires = r.expires_at
            if ttl is not None and r.wall_s:
                q_exp = r.wall_s + ttl
                expires = q_exp if expires is None else min(expires, q_exp)
            out.append(Entry(message, bool(loc & 1), expires))
        return out

    # ------------------------------------------------------------------ compaction

    def relocate(self, ranges: Sequence[tuple[int, int]]) -> int:
        """Log again every queued message whose ENQUEUE record's LSN is in one of
        ``ranges`` (``[first, end)`` pairs, sorted: segments whose other records are all
        settled), so that a later checkpoint no longer refers to those segments and they
        can be deleted. Returns how many records were logged.

        Each copy is an ENQUEUE record of the same message for the durable queues that
        still hold it (without the message id, so the deduplication window is left
        alone). Queues are pointed at a copy only once it is written (:meth:`durable`):
        until then, and for good if writing it fails, they keep the original.
        """
        read_log = self.read_log
        if read_log is None or not ranges or self._replay is not None:
            return 0
        starts = [lo for lo, _hi in ranges]
        lo_all, hi_all = ranges[0][0], ranges[-1][1]

        def inside(lsn: int) -> bool:
            if not lo_all <= lsn < hi_all:
                return False
            i = bisect_right(starts, lsn) - 1
            return i >= 0 and lsn < ranges[i][1]

        holders: dict[int, list[tuple[Queue, Entry | None]]] = {}
        old_lsn: dict[int, int] = {}
        unacked: dict[int, list[Entry]] = {}
        for ch in self.channels.values():
            for d in ch.deliveries.values():
                unacked.setdefault(d.queue.qid, []).append(d.entry)
        for queue in self.queues.values():
            if not queue.persistent_log or queue.deleted:
                continue
            for chunk, start, stop in queue.paged.cut():
                locs = chunk[start + 1 : stop : 2]
                if not locs or (max(locs) >> 1) < lo_all or (min(locs) >> 1) >= hi_all:
                    continue
                for k in range(start, stop, 2):
                    lsn = chunk[k + 1] >> 1
                    if inside(lsn):
                        seq = chunk[k]
                        holders.setdefault(seq, []).append((queue, None))
                        old_lsn[seq] = lsn
            entries = [e for _s, e in queue.requeued]
            entries.extend(queue.ready)
            entries.extend(queue.tail)
            entries.extend(unacked.get(queue.qid, ()))
            for entry in entries:
                m = entry.message
                if m.lsn and inside(m.lsn):
                    holders.setdefault(m.seq, []).append((queue, entry))
                    old_lsn[m.seq] = m.lsn
        if not holders:
            return 0
        seqs = sorted(holders)
        results = read_log([old_lsn[seq] for seq in seqs])
        logged = 0
        for seq, result in zip(seqs, results):
            r = _logged_message(result, seq, old_lsn[seq])
            if isinstance(r, str):
                continue  # unreadable: left where it is, reported when its turn comes
            qids = sorted({q.qid for q, _e in holders[seq]})
            payload = rec.encode_enqueue(
                seq, r.wall_s, r.expires_at, qids, r.exchange, r.routing_key, None, r.properties, r.body
            )
            new_lsn = self._append(rec.RecordType.ENQUEUE, payload)
            self._relocations.append((new_lsn, seq, holders[seq]))
            logged += 1
        return logged

    def _apply_relocations(self, durable: int) -> None:
        relocations = self._relocations
        i = 0
        while i < len(relocations) and relocations[i][0] <= durable:
            new_lsn, seq, holders = relocations[i]
            for queue, entry in holders:
                if entry is None:
                    queue.paged.relocate(seq, new_lsn)
                elif entry.message.seq == seq:
                    entry.message.lsn = new_lsn
            i += 1
        del relocations[:i]

    def _pop(self, queue: Queue) -> Entry | None:
        entry = queue.pop()
        if entry is None and queue.paged:
            self._page_in(queue)
            entry = queue.pop()
        return entry

    def _pop_live(self, queue: Queue) -> Entry | None:
        """The next ready entry, dropping expired ones on the way."""
        while True:
            entry = self._pop(queue)
            if entry is None:
                return None
            if entry.expires_at is not None and entry.expires_at <= self.wall_clock():
                self._settle_entry(queue, entry)
                continue
            return entry

    # ------------------------------------------------------------------ consumers

    def consume(
        self,
        channel_id: int,
        queue_name: str,
        *,
        consumer_tag: str = "",
        prefetch: int | None = None,
        no_ack: bool = False,
        exclusive: bool = False,
        ack_timeout_s: float | None = None,
        lease_s: float | None = None,
    ) -> str:
        """Start a consumer; return its tag.

        ``lease_s`` makes a lease-mode consumer (the streaming endpoint with
        ``ack=lease``): each delivery carries a lease id settled through the REST
        lease calls and returns to the queue after ``lease_s``.
        Raises NotFound, ResourceLocked, AccessRefused (exclusivity), ChannelError
        (tag in use), InvalidArgument.
        """
        ch = self._channel(channel_id)
        queue = self._queue(queue_name, channel_id)
        if prefetch is None:
            prefetch = ch.default_prefetch
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 0 <= prefetch <= self.max_prefetch:
            raise InvalidArgument(f"prefetch must be an integer 0..{self.max_prefetch}")
        if not consumer_tag:
            consumer_tag = f"ctag-{self.boot_id}-{self._next_consumer}"
            self._next_consumer += 1
        if consumer_tag in ch.consumers:
            raise ChannelError(f"consumer tag {consumer_tag!r} is already in use on this channel", code="not_allowed")
        if queue.exclusive_consumer:
            raise AccessRefused(f"queue {queue_name!r} has an exclusive consumer")
        if exclusive and queue.consumers:
            raise AccessRefused(f"queue {queue_name!r} already has consumers; cannot consume exclusively")
        if ack_timeout_s is None:
            ack_timeout_s = queue.consumer_timeout_s or self.consumer_timeout_s
        if lease_s is not None:
            ack_timeout_s = lease_s
        consumer = Consumer(consumer_tag, ch, queue, no_ack, prefetch, exclusive, ack_timeout_s, lease_s)
        ch.consumers[consumer_tag] = consumer
        queue.consumers.append(consumer)
        queue.had_consumer = True
        queue.exclusive_consumer = exclusive
        self._dirty_queues[queue.name] = queue
        return consumer_tag

    def cancel(self, channel_id: int, consumer_tag: str) -> None:
        """Stop a consumer. Its unacked deliveries stay with the channel until settled.
        Raises NotFound if the tag is unknown, ChannelError if the channel is not open."""
        ch = self._channel(channel_id)
        consumer = ch.consumers.get(consumer_tag)
        if consumer is None:
            raise NotFound(f"no consumer {consumer_tag!r} on this channel")
        self._remove_consumer(consumer)

    def _remove_consumer(self, consumer: Consumer, *, auto_delete: bool = True) -> None:
        ch = consumer.channel
        ch.consumers.pop(consumer.tag, None)
        queue = consumer.queue
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)
            if consumer.exclusive:
                queue.exclusive_consumer = False
            if queue.rr >= len(queue.consumers):
                queue.rr = 0
        if auto_delete and queue.auto_delete and queue.had_consumer and not queue.consumers and not queue.deleted:
            self._delete_queue(queue, "auto-delete queue lost its last consumer")
        elif queue.consumers:
            self._dirty_queues[queue.name] = queue

    def qos(self, channel_id: int, prefetch: int, global_: bool = False) -> None:
        """basic.qos: a channel-wide limit (``global_``) or the default per-consumer one."""
        ch = self._channel(channel_id)
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or not 0 <= prefetch <= self.max_prefetch:
            raise InvalidArgument(f"prefetch must be an integer 0..{self.max_prefetch}")
        if global_:
            ch.prefetch = prefetch
            for consumer in ch.consumers.values():
                self._dirty_queues[consumer.queue.name] = consumer.queue
        else:
            ch.default_prefetch = prefetch

    def _dispatch_dirty(self) -> None:
        dirty = self._dirty_queues
        while dirty:
            _name, queue = dirty.popitem()
            self._dispatch(queue)

    def _dispatch(self, queue: Queue) -> None:
        if not self.delivering:
            return
        consumers = queue.consumers
        while consumers and queue.has_ready():
            n = len(consumers)
            start = queue.rr
            chosen = None
            for k in range(n):
                idx = (start + k) % n
                c = consumers[idx]
                if c.can_take():
                    chosen = c
                    queue.rr = (idx + 1) % n
                    break
            if chosen is None:
                return
            entry = self._pop_live(queue)
            if entry is None:
                return
            self._deliver(chosen, queue, entry)

    def _deliver(self, consumer: Consumer, queue: Queue, entry: Entry) -> None:
        ch = consumer.channel
        tag = ch.next_tag
        ch.next_tag += 1
        message = entry.message
        redelivered = entry.delivered
        queue.delivered += 1
        self.stats["delivered"] += 1
        if redelivered:
            queue.redelivered += 1
        ch.credit -= len(message.body) + DELIVERY_OVERHEAD_BYTES
        lease_id = None
        if consumer.no_ack:
            queue.acked += 1
            self._settle_entry(queue, entry)
        else:
            if not redelivered:
                entry.delivered = True
                if queue.persistent_log and message.persistent:
                    self._delivered_marks.setdefault(queue.qid, []).append(message.seq)
            deadline = self.clock() + consumer.ack_timeout_s
            ch.deliveries[tag] = Delivery(tag, entry, queue, consumer, deadline)
            self._push_timer(deadline, ch.id, tag)
            consumer.unacked += 1
            ch.unacked += 1
            queue.unacked += 1
            if consumer.lease_s is not None:
                lease_id = self._lease_id(ch.id, tag)
        self._effects.append(Deliver(ch.id, consumer.tag, tag, redelivered, message, lease_id))

    # ------------------------------------------------------------------- settling

    def ack(self, channel_id: int, delivery_tag: int, multiple: bool = False) -> int:
        """Acknowledge one delivery (or every one up to the tag); return how many.
        Raises ChannelError for an unknown or expired tag (the channel must close)."""
        ch = self._channel(channel_id)
        deliveries = self._take_deliveries(ch, delivery_tag, multiple)
        for d in deliveries:
            self._finish_delivery(ch, d)
            d.queue.acked += 1
            self._settle_entry(d.queue, d.entry)
        self.stats["acked"] += len(deliveries)
        return len(deliveries)

    def nack(self, channel_id: int, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> int:
        """Reject one delivery (or every one up to the tag): requeue it in its original
        position, or drop it. Raises ChannelError for an unknown or expired tag."""
        ch = self._channel(channel_id)
        deliveries = self._take_deliveries(ch, delivery_tag, multiple)
        if requeue:
            self._requeue_deliveries(ch, deliveries, taken=True)
        else:
            for d in deliveries:
                self._finish_delivery(ch, d)
                self._settle_entry(d.queue, d.entry)
        return len(deliveries)

    def reject(self, channel_id: int, delivery_tag: int, requeue: bool = True) -> int:
        return self.nack(channel_id, delivery_tag, False, requeue)

    def touch(self, channel_id: int, delivery_tag: int) -> None:
        """Reset the ack timeout of a delivery still being worked on.
        Raises ChannelError for an unknown or expired tag."""
        ch = self._channel(channel_id)
        d = self._lookup_delivery(ch, delivery_tag)
        assert d.consumer is not None or ch.id == REST_CHANNEL
        timeout = d.consumer.ack_timeout_s if d.consumer is not None else self.default_lease_s
        self._reset_deadline(ch, d, self.clock() + timeout)

    def _reset_deadline(self, ch: Channel, d: Delivery, deadline: float) -> None:
        d.deadline = deadline
        self._push_timer(deadline, ch.id, d.tag)

    def _push_timer(self, deadline: float, channel_id: int, tag: int) -> None:
        """Schedule a deadline. Settled or touched deliveries leave stale entries
        behind (skipped when popped); once stale ones could dominate, the heap is
        rebuilt from the live deliveries, so its size follows the unacked count
        rather than delivery rate x ack timeout (amortised O(1) per push)."""
        timers = self._timers
        heapq.heappush(timers, (deadline, channel_id, tag))
        if len(timers) >= self._timers_compact_at:
            live = [
                (d.deadline, ch.id, d.tag)
                for ch in self.channels.values()
                for d in ch.deliveries.values()
                if d.deadline is not None
            ]
            heapq.heapify(live)
            self._timers = live
            self._timers_compact_at = max(_TIMERS_COMPACT_MIN, 2 * len(live))

    def _lookup_delivery(self, ch: Channel, tag: int) -> Delivery:
        if not isinstance(tag, int) or isinstance(tag, bool):
            raise ChannelError("delivery_tag must be an integer", code="invalid_argument")
        d = ch.deliveries.get(tag)
        if d is None:
            if tag in ch.expired:
                raise ChannelError(
                    f"delivery tag {tag} expired (not acked within its ack timeout) and went back to its queue",
                    code="delivery_expired",
                )
            raise ChannelError(f"unknown delivery tag {tag}", code="unknown_delivery_tag")
        return d

    def _take_deliveries(self, ch: Channel, tag: int, multiple: bool) -> list[Delivery]:
        """Remove and return the deliveries an ack/nack names (validated first, so a bad
        tag changes nothing)."""
        if multiple:
            if not isinstance(tag, int) or isinstance(tag, bool):
                raise ChannelError("delivery_tag must be an integer", code="invalid_argument")
            if tag != 0:
                self._lookup_delivery(ch, tag)
            taken = []
            for t in ch.deliveries:
                if tag and t > tag:
                    break
                taken.append(t)
            return [ch.deliveries.pop(t) for t in taken]
        d = self._lookup_delivery(ch, tag)
        del ch.deliveries[tag]
        return [d]

    def _finish_delivery(self, ch: Channel, d: Delivery) -> None:
        """Bookkeeping common to every end of a delivery (already removed from ch)."""
        ch.unacked -= 1
        queue = d.queue
        if not queue.deleted:
            queue.unacked -= 1
        consumer = d.consumer
        if consumer is not None:
            consumer.unacked -= 1
            if not queue.deleted and consumer.channel.consumers.get(consumer.tag) is consumer:
                self._dirty_queues[queue.name] = queue
        if ch.prefetch:
            for c in ch.consumers.values():
                self._dirty_queues[c.queue.name] = c.queue

    def _requeue_deliveries(self, ch: Channel, deliveries: list[Delivery], *, taken: bool = False) -> None:
        for d in deliveries:
            if not taken:
                ch.deliveries.pop(d.tag, None)
            self._finish_delivery(ch, d)
            queue = d.queue
            if queue.deleted:
                continue
            d.entry.delivered = True
            queue.requeue(d.entry)
            if queue.consumers:
                self._dirty_queues[queue.name] = queue
            if queue.getters:
                self._getter_checks[queue.name] = queue

    # --------------------------------------------------------------------- leases

    def _lease_id(self, channel_id: int, tag: int) -> str:
        return f"{self.boot_id}-{channel_id}-{tag}"

    def _parse_lease(self, lease_id: Any) -> tuple[Channel, Delivery]:
        if not isinstance(lease_id, str):
            raise InvalidArgument("lease ids must be strings")
        boot, _, rest = lease_id.rpartition("-")
        boot, _, chan = boot.rpartition("-")
        # Only the exact spelling the broker handed out names a lease: "01" or
        # non-ASCII digits would otherwise alias (or crash int()) and let one
        # request settle the same delivery twice.
        if (
            boot != self.boot_id
            or not (chan.isascii() and chan.isdigit() and rest.isascii() and rest.isdigit())
            or lease_id != self._lease_id(int(chan), int(rest))
        ):
            raise NotFound(f"unknown lease {lease_id!r} (expired, settled, or from before a restart)")
        ch = self.channels.get(int(chan))
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
        queue = self._queue(queue_name)
        if lease_s is None:
            lease_s = self.default_lease_s
        if not 0 < lease_s <= self.max_lease_s:
            raise InvalidArgument(f"lease must be between 0 and {self.max_lease_s:g} seconds")
        ch = self.channels[REST_CHANNEL]
        out: list[tuple[str, Delivery, bool]] = []
        deadline = self.clock() + lease_s
        while len(out) < max_count:
            entry = self._pop_live(queue)
            if entry is None:
                break
            tag = ch.next_tag
            ch.next_tag += 1
            redelivered = entry.delivered
            queue.delivered += 1
            self.stats["delivered"] += 1
            if redelivered:
                queue.redelivered += 1
            else:
                entry.delivered = True
                if queue.persistent_log and entry.message.persistent:
                    self._delivered_marks.setdefault(queue.qid, []).append(entry.message.seq)
            d = Delivery(tag, entry, queue, None, deadline)
            ch.deliveries[tag] = d
            ch.unacked += 1
            queue.unacked += 1
            self._push_timer(deadline, REST_CHANNEL, tag)
            out.append((self._lease_id(REST_CHANNEL, tag), d, redelivered))
        return out

    def ack_leases(self, lease_ids: list[Any], queue: str | None = None) -> int:
        """Ack leases (all validated first: an unknown id changes nothing).

        With ``queue``, every lease must belong to that queue. Raises NotFound."""
        pairs = self._leases(lease_ids, queue)
        for ch, d in pairs:
            del ch.deliveries[d.tag]
            self._finish_delivery(ch, d)
            d.queue.acked += 1
            self.stats["acked"] += 1
            self._settle_entry(d.queue, d.entry)
        return len(pairs)

    def nack_leases(self, lease_ids: list[Any], requeue: bool = True, queue: str | None = None) -> int:
        """Return leases to their queue (or drop them). Raises NotFound."""
        pairs = self._leases(lease_ids, queue)
        for ch, d in pairs:
            del ch.deliveries[d.tag]
            if requeue:
                self._requeue_deliveries(ch, [d], taken=True)
            else:
                self._finish_delivery(ch, d)
                self._settle_entry(d.queue, d.entry)
        return len(pairs)

    def extend_leases(self, lease_ids: list[Any], lease_s: float, queue: str | None = None) -> int:
        """Give leases ``lease_s`` more seconds from now. Raises NotFound, InvalidArgument."""
        if not 0 < lease_s <= self.max_lease_s:
            raise InvalidArgument(f"lease must be between 0 and {self.max_lease_s:g} seconds")
        pairs = self._leases(lease_ids, queue)
        deadline = self.clock() + lease_s
        for ch, d in pairs:
            self._reset_deadline(ch, d, deadline)
        return len(pairs)

    def _leases(self, lease_ids: list[Any], queue: str | None = None) -> list[tuple[Channel, Delivery]]:
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

    def park_getter(self, queue_name: str) -> None:
        """A long-poll waits for messages on this queue (wake it with ``QueueReady``)."""
        self._queue(queue_name).getters += 1

    def unpark_getter(self, queue_name: str) -> None:
        queue = self.queues.get(queue_name)
        if queue is not None and queue.getters:
            queue.getters -= 1

    # --------------------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        """When :meth:`advance` next has work to do (None: no timer pending)."""
        timers = self._timers
        while timers:
            deadline, channel_id, tag = timers[0]
            ch = self.channels.get(channel_id)
            d = ch.deliveries.get(tag) if ch is not None else None
            if d is None or d.deadline != deadline:
                heapq.heappop(timers)
                continue
            return deadline
        return None

    def earliest_timer(self) -> float | None:
        """The earliest scheduled deadline, possibly stale (cheap; for wake-ups)."""
        return self._timers[0][0] if self._timers else None

    def advance(self) -> None:
        """Time passed: deliveries and leases past their deadline go back to their queue."""
        now = self.clock()
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, channel_id, tag = heapq.heappop(timers)
            ch = self.channels.get(channel_id)
            d = ch.deliveries.get(tag) if ch is not None else None
            if ch is None or d is None or d.deadline != deadline:
                continue
            self._requeue_deliveries(ch, [d])
            consumer = d.consumer
            if consumer is not None:
                ch.expired[tag] = None
                if len(ch.expired) > _EXPIRED_MEMORY:
                    del ch.expired[next(iter(ch.expired))]
                if consumer.lease_s is None:
                    self._effects.append(DeliveryExpired(ch.id, consumer.tag, tag))

    # ------------------------------------------------------------ confirms release

    def _release_confirms(self) -> None:
        durable = self.durable_lsn
        for ch in self._confirm_dirty.values():
            for tag, multiple, ack, reason in ch.confirms.release(durable):
                self._effects.append(Confirm(ch.id, tag, multiple, ack, reason))
                if not ack:
                    self.stats["nacked"] += 1
        self._confirm_dirty.clear()

    # ------------------------------------------------------------ introspection

    def totals(self) -> dict[str, int]:
        ready = unacked = 0
        for q in self.queues.values():
            ready += q.ready_count()
            unacked += q.unacked
        return {
            "exchanges": len(self.exchanges),
            "queues": len(self.queues),
            "channels": len(self.channels) - 1,
            "consumers": sum(len(ch.consumers) for ch in self.channels.values()),
            "messages_ready": ready,
            "messages_unacked": unacked,
        }

    # ------------------------------------------------------ recovery and snapshots

    def begin_recovery(self) -> None:
        """Enter replay mode: records applied with :meth:`replay` rebuild state."""
        self._replay = {}
        self._replay_messages = {}
        self._replay_dedup_digests = array("Q")
        self._replay_dedup_ms = array("q")
        # publishes older than the window are not remembered (they would expire at once)
        window_s = self.dedup.window_s
        self._replay_dedup_from = self.wall_clock() - window_s if window_s > 0 else math.inf

    def replay(self, rtype: int, payload: bytes, lsn: int = 0) -> None:
        """Apply one logged record during recovery (idempotent)."""
        state = self._replay
        assert state is not None, "replay outside recovery"
        if lsn > self.last_lsn:
            self.last_lsn = lsn
        T = rec.RecordType
        if rtype == _ENQUEUE and lsn:
            # A logged publish: the queues index it by LSN; its body stays on disk.
            seq, wall_s, qids, exchange_utf8, id_utf8 = rec.peek_enqueue(payload)
            if seq >= self._next_seq:
                self._next_seq = seq + 1
            loc = lsn << 1
            for qid in qids:
                entries = state.get(qid)
                if entries is not None:
                    entries.add(seq, loc, update=True)
            if id_utf8 is not None and wall_s >= self._replay_dedup_from:
                # loaded into the window in one go at the end of recovery
                self._replay_dedup_digests.append(digest_utf8(exchange_utf8, id_utf8))
                self._replay_dedup_ms.append(round(wall_s * 1000.0))
        elif rtype == T.ENQUEUE:
            # A message written whole into a checkpoint (checkpoints before QUEUE_REFS):
            # there is no log record to page it out to, so it is kept in memory.
            r = rec.decode_enqueue(payload)
            if r.seq >= self._next_seq:
                self._next_seq = r.seq + 1
            message = self._replay_messages.get(r.seq)
            for qid in r.qids:
                entries = state.get(qid)
                if entries is None or r.seq in entries:
                    continue
                if message is None:
                    message = Message(
                        r.seq, r.exchange, r.routing_key, r.body, r.properties, r.expires_at, owned=True
                    )
                    self._replay_messages[r.seq] = message
                queue = self._queues_by_id[qid]
                expires = r.expires_at
                if queue.message_ttl_s is not None and r.wall_s:
                    # wall_s is 0 in checkpoints, whose expires_at already holds the TTL
                    q_exp = r.wall_s + queue.message_ttl_s
                    expires = q_exp if expires is None else min(expires, q_exp)
                entries.add_whole(r.seq, Entry(message, False, expires))
            if r.message_id is not None:
                self.dedup.remember(r.exchange, r.message_id, r.wall_s, 0)
        elif rtype == T.QUEUE_REFS:
            qid, pairs = rec.decode_refs(payload)
            entries = state.get(qid)
            if entries is not None:
                it = iter(pairs)
                top = 0
                add = entries.add
                for seq, loc in zip(it, it):
                    add(seq, loc, update=False)
                    if seq > top:
                        top = seq
                if top >= self._next_seq:
                    self._next_seq = top + 1
        elif rtype == T.SETTLE:
            qid, seqs = rec.decode_seqs(payload)
            entries = state.get(qid)
            if entries is not None:
                for seq in seqs:
                    entries.settle(seq)
        elif rtype == T.DELIVERED:
            qid, seqs = rec.decode_seqs(payload)
            entries = state.get(qid)
            if entries is not None:
                for seq in seqs:
                    entries.mark_delivered(seq)
        elif rtype == T.DECLARE_QUEUE:
            d = rec.decode_json(payload)
            qid = d["qid"]
            if qid >= self._next_qid:
                self._next_qid = qid + 1
            if qid in self._queues_by_id:
                return
            replaced = self.queues.get(d["name"])
            if replaced is not None:
                self._drop_replay_queue(replaced)
            queue = Queue(qid, d["name"], True, None, d.get("auto_delete", False), d.get("arguments", {}))
            self.queues[queue.name] = queue
            self._queues_by_id[qid] = queue
            state[qid] = ReplayIndex()
        elif rtype == T.DELETE_QUEUE:
            d = rec.decode_json(payload)
            deleted = self._queues_by_id.get(d["qid"])
            if deleted is not None:
                self._drop_replay_queue(deleted)
        elif rtype == T.DECLARE_EXCHANGE:
            d = rec.decode_json(payload)
            if d["name"] in self.exchanges and not self.exchanges[d["name"]].builtin:
                old_ex = self.exchanges[d["name"]]
                if old_ex.settings() == (d["type"], True, d.get("auto_delete", False), d.get("internal", False), d.get("arguments", {})):
                    return
                self._delete_exchange(old_ex)
            if d["name"] not in self.exchanges:
                self.exchanges[d["name"]] = Exchange(
                    d["name"], d["type"], True, d.get("auto_delete", False),
                    d.get("internal", False), d.get("arguments", {}),
                )
        elif rtype == T.DELETE_EXCHANGE:
            d = rec.decode_json(payload)
            ex = self.exchanges.get(d["name"])
            if ex is not None and not ex.builtin:
                self._delete_exchange(ex)
        elif rtype in (T.BIND, T.UNBIND):
            d = rec.decode_json(payload)
            src = self.exchanges.get(d["exchange"])
            to_exchange = "to_exchange" in d
            dname = d["to_exchange"] if to_exchange else d["queue"]
            if src is None or (dname not in (self.exchanges if to_exchange else self.queues)):
                return
            key = ("x" if to_exchange else "q", dname)
            if rtype == T.BIND:
                if src.table.add(key, d["routing_key"], d.get("arguments", {})):
                    target: Any = self.exchanges[dname] if to_exchange else self.queues[dname]
                    target.bound_from.add(src.name)
            else:
                if src.table.remove(key, d["routing_key"], d.get("arguments", {})):
                    # as unbind() does live: keep bound_from in step with the table
                    if not any(bk[0] == key for bk in src.table.bindings):
                        self._forget_binding_dest(src.name, key)
        elif rtype == T.DEDUP_DIGESTS:
            self.dedup.load_payload(payload)
        elif rtype == T.DEDUP_BATCH:  # checkpoints written before DEDUP_DIGESTS
            exchange, window = rec.decode_dedup_batch(payload)
            remember = self.dedup.remember
            for message_id, wall in window:
                remember(exchange, message_id, wall, 0)
        elif rtype == T.DEDUP:  # one entry a record: checkpoints written before DEDUP_BATCH
            exchange, message_id, wall = rec.decode_dedup(payload)
            self.dedup.remember(exchange, message_id, wall, 0)
        elif rtype == T.META:
            d = rec.decode_json(payload)
            self._next_seq = max(self._next_seq, d.get("next_seq", 1))
            self._next_qid = max(self._next_qid, d.get("next_qid", 1))
        else:
            raise ValueError(f"unknown record type {rtype}")

    def _drop_replay_queue(self, queue: Queue) -> None:
        assert self._replay is not None
        self._replay.pop(queue.qid, None)
        for source_name in list(queue.bound_from):
            source = self.exchanges.get(source_name)
            if source is not None:
                source.table.remove_destination(("q", queue.name))
        del self.queues[queue.name]
        del self._queues_by_id[queue.qid]

    def finish_recovery(self, last_lsn: int, *, assume_delivered: bool = False) -> None:
        """Leave replay mode: queues take their recovered contents in original order.
        Messages that were delivered and unacked at the crash come back redelivered.

        ``assume_delivered`` (after an unclean stop): mark every recovered message
        redelivered. Delivered marks are logged lazily (a delivery does not wait for an
        fsync), so after a crash the log cannot tell which messages a consumer saw;
        AMQP's ``redelivered`` means "may have been delivered before", and a message
        that was delivered, or even acked, must not come back looking fresh."""
        state = self._replay
        assert state is not None
        for qid, entries in state.items():
            self._restore_queue(self._queues_by_id[qid], entries, assume_delivered)
        self._replay = None
        self._replay_messages = {}
        self.last_lsn = max(self.last_lsn, last_lsn)
        self.durable_lsn = self.last_lsn
        self._first_pending_lsn = self.last_lsn + 1
        self.dedup.load_entries(self._replay_dedup_digests, self._replay_dedup_ms)
        self._replay_dedup_digests = array("Q")
        self._replay_dedup_ms = array("q")
        self.dedup.prune(self.wall_clock())

    def _restore_queue(self, queue: Queue, entries: ReplayIndex, assume_delivered: bool) -> None:
        """Give a queue its recovered messages in sequence order: those indexed by LSN
        stay paged out (read back when their turn comes), those recovered whole (from a
        checkpoint of an older format) stay in memory. The in-memory part must precede
        the paged-out one, so messages indexed by LSN that precede a whole one, or any
        when there is no log to read, are read back at once."""
        logged = entries.logged()
        if logged is not None and self.read_log is not None:
            seqs, locs = logged
            if assume_delivered:
                locs = mark_all_delivered(locs)
            queue.paged.extend(seqs, locs)
            return
        last_whole = max((seq for seq, item in entries.extra.items() if type(item) is not int), default=0)
        if self.read_log is None:
            last_whole = 1 << 63
        paged = queue.paged
        pending: list[tuple[int, int]] = []
        for seq, item in entries.items():
            if type(item) is int:
                loc = item | 1 if assume_delivered else item
                if seq < last_whole:
                    pending.append((seq, loc))
                else:
                    paged.append(seq, loc)
            else:
                assert isinstance(item, Entry)
                if pending:
                    queue.ready.extend(self._read_entries(queue, pending))
                    pending = []
                if assume_delivered:
                    item.delivered = True
                queue.ready.append(item)
        if pending:
            queue.ready.extend(self._read_entries(queue, pending))

    def snapshot(self, chunk_entries: int = 4096) -> tuple[int, Iterator[list[tuple[int, bytes]]]]:
        """A checkpoint of the durable state, as (LSN covered, chunks of records).

        The chunks are produced lazily so the caller can interleave them with
        serving; state may change between chunks. That is safe because replay is
        idempotent: the checkpoint holds every effect of records up to the LSN, plus
        possibly some later ones, which replaying the log after the LSN re-applies
        harmlessly. Call ``take_effects()`` first so the LSN covers every record.
        """
        covered = self.last_lsn
        return covered, self._snapshot_chunks(chunk_entries)

    def _snapshot_chunks(self, chunk_entries: int) -> Iterator[list[tuple[int, bytes]]]:
        T = rec.RecordType
        head: list[tuple[int, bytes]] = []
        for ex in list(self.exchanges.values()):
            if ex.durable and not ex.builtin:
                head.append((T.DECLARE_EXCHANGE, rec.encode_json(ex.info())))
        queues = [q for q in self.queues.values() if q.persistent_log]
        for q in queues:
            head.append((T.DECLARE_QUEUE, rec.encode_json(_queue_record(q))))
        for ex in list(self.exchanges.values()):
            if not ex.durable:
                continue
            for (dest, key, _f), args in ex.table.bindings.items():
                if self._binding_durable(ex, dest):
                    head.append((T.BIND, rec.encode_json(_binding_record(ex.name, dest, key, args))))
        # One consistent cut of every queue's messages (ready, requeued and unacked),
        # taken in the same step as the head. Looking at the unacked deliveries and
        # at each queue at different times would lose a message delivered in
        # between: its ENQUEUE record is before the covered LSN, so only the
        # checkpoint can carry it. Only references are copied here; records are
        # encoded lazily, chunk by chunk.
        unacked: dict[int, list[Entry]] = {}
        for ch in list(self.channels.values()):
            for d in ch.deliveries.values():
                if d.queue.persistent_log:
                    unacked.setdefault(d.queue.qid, []).append(d.entry)
        cut: list[tuple[Queue, list[Entry], list[tuple[array[int], int, int]]]] = []
        for q in queues:
            entries = [e for _s, e in q.requeued]
            entries.extend(q.ready)
            entries.extend(q.tail)
            entries.extend(unacked.get(q.qid, ()))
            cut.append((q, entries, q.paged.cut()))
        del unacked
        yield head
        per_record = 2 * chunk_entries
        for q, entries, paged_cut in cut:
            if q.deleted:
                continue  # its DELETE_QUEUE record follows the covered LSN
            qid = q.qid
            # Messages are referenced by the LSN of their ENQUEUE record, whose segment
            # the log keeps while it is referenced (QUEUE_REFS): bodies are not copied.
            for chunk_array, start, stop in paged_cut:
                for lo in range(start, stop, per_record):
                    yield [(T.QUEUE_REFS, rec.encode_refs(qid, chunk_array[lo : min(stop, lo + per_record)]))]
            for lo in range(0, len(entries), chunk_entries):
                chunk: list[tuple[int, bytes]] = []
                refs = array("q")
                delivered: list[int] = []
                for e in entries[lo : lo + chunk_entries]:
                    m = e.message
                    if not m.persistent:
                        continue
                    if m.lsn:
                        refs.append(m.seq)
                        refs.append(locator(m.lsn, e.delivered))
                        continue
                    # recovered whole from an older checkpoint: no record to refer to
                    chunk.append(
                        (
                            T.ENQUEUE,
                            rec.encode_enqueue(
                                m.seq, 0.0, e.expires_at, [qid], m.exchange, m.routing_key,
                                None, m.properties, m.body,
                            ),
                        )
                    )
                    if e.delivered:
                        delivered.append(m.seq)
                if refs:
                    chunk.append((T.QUEUE_REFS, rec.encode_refs(qid, refs)))
                if delivered:
                    chunk.append((T.DELIVERED, rec.encode_seqs(qid, delivered)))
                if chunk:
                    yield chunk
        tail = [
            (T.DEDUP_DIGESTS, payload) for payload in self.dedup.checkpoint_payloads(DEDUP_BATCH_ENTRIES)
        ]
        tail.append(
            (T.META, rec.encode_json({"next_seq": self._next_seq, "next_qid": self._next_qid}))
        )
        yield tail


def _logged_message(result: tuple[int, bytes] | str, seq: int, lsn: int) -> rec.EnqueueRecord | str:
    """Message ``seq``'s ENQUEUE record as read back from LSN ``lsn``, or why it is not."""
    if isinstance(result, str):
        return result
    if result[0] != rec.RecordType.ENQUEUE:
        return f"record {lsn} is of type {result[0]}, not a message"
    try:
        r = rec.decode_enqueue(result[1])
    except (ValueError, IndexError, UnicodeDecodeError, struct_error) as exc:
        return f"record {lsn} does not decode: {exc}"
    if r.seq != seq:
        return f"record {lsn} holds message {r.seq}, not {seq}"
    return r


def _check_arguments(arguments: Any) -> dict[str, Any]:
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        raise InvalidArgument("arguments must be an object")
    check_json_value(arguments, "arguments")
    return arguments


def _queue_record(queue: Queue) -> dict[str, Any]:
    return {
        "qid": queue.qid,
        "name": queue.name,
        "auto_delete": queue.auto_delete,
        "arguments": queue.arguments,
    }


def _binding_record(source: str, dest: Any, routing_key: str, arguments: dict[str, Any]) -> dict[str, Any]:
    kind, name = dest
    record: dict[str, Any] = {"exchange": source, "routing_key": routing_key, "arguments": arguments}
    record["queue" if kind == "q" else "to_exchange"] = name
    return record

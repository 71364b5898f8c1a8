"""Topology: exchanges, queues and bindings, and routing a message to its queues.

Declares, deletes and looks up exchanges, queues and bindings, validates their
arguments, logs the durable ones (DECLARE_*/DELETE_*/BIND/UNBIND records), and routes
a message through exchange-to-exchange bindings to the set of queues it reaches.

The methods here belong to :class:`~broker.core.broker.Broker`; they share its state
(:class:`~broker.core.state.BrokerState`).
"""

from __future__ import annotations

from typing import Any

from . import records as rec
from .effects import (
    ConsumerCancelled,
    QueueReady,
)
from .entities import Exchange, Queue
from .errors import (
    AccessRefused,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
    Unavailable,
)
from .message import check_json_value
from .names import check_name, check_routing_key
from .routing import EXCHANGE_TYPES
from .state import (
    BUILTIN_EXCHANGES,
    DEFAULT_EXCHANGE,
    EXCHANGE_ARGUMENTS,
    QUEUE_ARGUMENTS,
    REST_CHANNEL,
    BrokerState,
)

__all__ = ["TopologyMixin"]


class TopologyMixin(BrokerState):
    """Topology (see the module docstring)."""

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
        _check_entity_arguments("exchange", arguments, EXCHANGE_ARGUMENTS)
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
        if not passive:
            # Validated before comparing with an existing queue: an invalid declaration
            # is the same error (InvalidArgument) whether or not the queue exists.
            _check_entity_arguments("queue", arguments, QUEUE_ARGUMENTS)
            if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
                raise InvalidArgument("x-dead-letter-routing-key needs x-dead-letter-exchange")
            if exclusive and channel_id == REST_CHANNEL:
                raise InvalidArgument("exclusive queues belong to a channel: declare them on one")
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
            self._touch_queue(existing)
            return existing, False
        if passive:
            raise NotFound(f"no queue {name!r}")
        if not generated:
            # only the broker may create amq.* queues (amq.gen-* included)
            check_name("queue", name)
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
        self._touch_queue(queue)
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
            self._count_marks.pop(queue.qid, None)
            self._delay_marks.pop(queue.qid, None)
            self._append(rec.RecordType.DELETE_QUEUE, rec.encode_json({"qid": queue.qid}))
        return count

    def purge_queue(self, name: str, *, channel_id: int = REST_CHANNEL) -> int:
        """Drop every ready or delayed message of a queue (not the unacked ones); return
        the count.

        Raises: NotFound; Unavailable (``storage_failed``) while the log cannot be
        written and the queue logs its messages: a purge whose records cannot be
        written would come undone at the next start, so it is not reported done."""
        queue = self._queue(name, channel_id)
        self._check_settles_writable(queue, "purge")
        entries, paged_seqs = queue.clear_ready()
        self._page_out_due.pop(queue.name, None)
        if queue.persistent_log:
            seqs = [e.message.seq for e in entries if e.message.persistent]
            seqs.extend(paged_seqs)
            if seqs:
                self._settles.setdefault(queue.qid, []).extend(seqs)
        return len(entries) + len(paged_seqs)

    def _check_settles_writable(self, queue: Queue, what: str) -> None:
        """Raises Unavailable when settling ``queue``'s messages cannot be logged now."""
        if not self.storage_ok and queue.persistent_log:
            raise Unavailable(
                f"cannot {what} on queue {queue.name!r}: the log cannot be written "
                f"({self.storage_reason}); it would come undone at the next start",
                code="storage_failed",
            )

    def queue_info(self, queue: Queue) -> dict[str, Any]:
        ready = queue.ready_count()
        info = {
            "name": queue.name,
            "durable": queue.durable,
            "exclusive": queue.exclusive_owner is not None,
            "auto_delete": queue.auto_delete,
            "arguments": queue.arguments,
            "messages": ready + queue.unacked,
            "messages_ready": ready,
            "messages_unacked": queue.unacked,
            "messages_delayed": len(queue.delayed),
            "consumers": len(queue.consumers),
            "message_stats": {
                "published": queue.published,
                "delivered": queue.delivered,
                "acked": queue.acked,
                "redelivered": queue.redelivered,
                "dead_lettered": dict(queue.dead_lettered),
            },
        }
        if queue.max_priority is not None:
            # a priority queue's ready messages by priority level (levels holding any)
            info["messages_ready_by_priority"] = {
                str(level): len(lane) for level, lane in enumerate(queue.lanes) if lane
            }
        return info

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
            if not found and not pending:
                # routed nowhere: its alternate exchange, if any, takes it (RabbitMQ)
                alternate = ex.arguments.get("alternate-exchange")
                if alternate is not None and alternate not in visited:
                    visited.add(alternate)
                    target = self.exchanges.get(alternate)
                    if target is not None:
                        if target.name == DEFAULT_EXCHANGE:
                            queue = self.queues.get(routing_key)
                            if queue is not None:
                                found[queue.name] = queue
                        else:
                            pending.append(target)
        return list(found.values())



def _check_entity_arguments(kind: str, arguments: dict[str, Any], known: dict[str, Any]) -> None:
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

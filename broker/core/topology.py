"""Topology: exchanges and bindings, and routing a message to its queues.

Declares, deletes and looks up exchanges and bindings, validates their arguments, logs
the durable ones (DECLARE_EXCHANGE/DELETE_EXCHANGE/BIND/UNBIND records), and routes a
message through exchange-to-exchange bindings to the set of queues it reaches: with one
routing key (:meth:`Topology.route`), or, for a publish, with the keys of its ``CC``
and ``BCC`` headers too (:meth:`Topology.route_publish`, senderselected.py). Queues
themselves belong to the queue store (queues.py); a binding names one, and a deleted
queue's bindings go with it (:meth:`Topology.queue_deleted`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import records as rec
from .constants import (
    BUILTIN_EXCHANGES,
    DEFAULT_EXCHANGE,
    EXCHANGE_ARGUMENTS,
    REST_CHANNEL,
    check_arguments,
    check_entity_arguments,
)
from .entities import Exchange, Queue
from .errors import (
    AccessRefused,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    Unavailable,
)
from .log import MessageLog
from .names import check_name, check_routing_key
from .queues import QueueStore
from .routing import EXCHANGE_TYPES, Dest, routing_type
from .senderselected import publish_keys, without_bcc

__all__ = ["Topology", "binding_record"]

#: Exchange types that route a message of several routing keys by its own key alone:
#: fanout and headers ignore keys, and a consistent-hash exchange sends each message
#: to exactly one queue (RabbitMQ hashes the keys together; ackbus hashes the
#: publish's own key, so CC and BCC do not move a message to another queue). An
#: x-delayed-message exchange counts as the type it routes as (``routing_type``).
_ONE_KEY_TYPES = frozenset({"fanout", "headers", "x-consistent-hash"})


class Topology:
    """Exchanges, bindings and routing (see the module docstring). Owns ``exchanges``;
    reads the queues of ``queues``; logs through ``log``."""

    def __init__(self, queues: QueueStore, log: MessageLog, *, max_exchanges: int) -> None:
        self._store = queues
        self._queues = queues.queues  # (the store's dict, read by every route)
        self._log = log
        self._max_exchanges = max_exchanges
        self.exchanges: dict[str, Exchange] = {}
        #: False in a cluster, where etcd decides it for every node
        #: (:meth:`auto_delete_exchanges_here`)
        self._auto_deletes = True
        for name, etype in BUILTIN_EXCHANGES.items():
            self.exchanges[name] = Exchange(name, etype, True, False, False, {}, builtin=True)

    def declare_exchange(
        self,
        name: object,
        type: object = "direct",
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: object = None,
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
        name = check_name("exchange", name, allow_reserved=True)
        arguments = check_arguments(arguments)
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise NotFound(f"no exchange {name!r}")
            return existing, False
        if not isinstance(type, str) or type not in EXCHANGE_TYPES:
            raise InvalidArgument(
                f"exchange type must be one of {', '.join(EXCHANGE_TYPES)}, not {type!r}"
            )
        routing_type(type, arguments)  # (x-delayed-message: its x-delayed-type, required)
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
        check_entity_arguments("exchange", arguments, EXCHANGE_ARGUMENTS)
        if len(self.exchanges) - len(BUILTIN_EXCHANGES) >= self._max_exchanges:
            raise Unavailable(f"exchange limit reached ({self._max_exchanges})", code="limit_reached")
        if durable and not self._log.storage_ok:
            raise Unavailable(f"storage is failing: {self._log.storage_reason}", code="storage_failed")
        exchange = Exchange(name, type, durable, auto_delete, internal, arguments)
        self.exchanges[name] = exchange
        if durable:
            self._log.append(rec.RecordType.DECLARE_EXCHANGE, rec.encode_json(exchange.info()))
        return exchange, True

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Delete an exchange and every binding from or to it.

        Raises NotFound, AccessRefused (built-in exchange), PreconditionFailed (if_unused).
        """
        exchange = self.exchange(name)
        if exchange.builtin:
            raise AccessRefused(f"exchange {name or 'amq.default'!r} is built in and cannot be deleted")
        if if_unused and exchange.table.bindings:
            raise PreconditionFailed(f"exchange {name!r} has bindings")
        self.remove_exchange(exchange)

    def remove_exchange(self, exchange: Exchange) -> None:
        for (dest, _key, _f), _args in list(exchange.table.bindings.items()):
            self.forget_binding_dest(exchange.name, dest)
        exchange.table.bindings.clear()
        for source_name in list(exchange.bound_from):
            source = self.exchanges.get(source_name)
            if source is not None:
                source.table.remove_destination(("x", exchange.name))
                self._maybe_auto_delete_exchange(source)
        del self.exchanges[exchange.name]
        if exchange.durable:
            self._log.append(rec.RecordType.DELETE_EXCHANGE, rec.encode_json({"name": exchange.name}))

    def forget_binding_dest(self, source: str, dest: Any) -> None:
        kind, dname = dest
        if kind == "q":
            queue = self._queues.get(dname)
            if queue is not None:
                queue.bound_from.discard(source)
        else:
            target = self.exchanges.get(dname)
            if target is not None:
                target.bound_from.discard(source)

    def exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange {name!r}")
        return exchange

    def auto_delete_exchanges_here(self, on: bool) -> None:
        """Whether an auto-delete exchange goes with its last binding in this core
        (the default). A cluster turns it off: its nodes share the exchanges and
        bindings, kept by etcd, and the exchange is deleted there with its last
        binding, for every node at once; one node's own bindings (to exclusive
        queues) do not keep it."""
        self._auto_deletes = on

    def _maybe_auto_delete_exchange(self, exchange: Exchange) -> None:
        # Not during replay: it sees only durable bindings (one to a transient queue
        # may have kept the exchange alive), and every auto-delete that happened
        # live is in the log as its own DELETE_EXCHANGE record.
        if self._log.replaying or not self._auto_deletes:
            return
        if exchange.auto_delete and not exchange.table.bindings and not exchange.builtin:
            self.remove_exchange(exchange)

    def queue_deleted(self, queue: Queue) -> None:
        """``queue`` is gone: the bindings to it go too (and exchanges that
        auto-delete with their last binding)."""
        for source_name in list(queue.bound_from):
            source = self.exchanges.get(source_name)
            if source is not None:
                source.table.remove_destination(("q", queue.name))
                self._maybe_auto_delete_exchange(source)
        queue.bound_from.clear()

    def bind(
        self,
        source: str,
        destination: str,
        routing_key: Any = "",
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
            self._queues[destination].bound_from.add(source)
        if self.binding_durable(src, key):
            self._log.append(
                rec.RecordType.BIND,
                rec.encode_json(binding_record(source, key, routing_key, arguments)),
            )
        return True

    def unbind(
        self,
        source: str,
        destination: str,
        routing_key: Any = "",
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
            self.forget_binding_dest(source, key)
        if self.binding_durable(src, key):
            self._log.append(
                rec.RecordType.UNBIND,
                rec.encode_json(binding_record(source, key, routing_key, arguments)),
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
        arguments = check_arguments(arguments)
        src = self.exchange(source)
        if to_exchange:
            self.exchange(destination)
            key = ("x", destination)
        else:
            self._store.queue(destination, channel_id)
            key = ("q", destination)
        return src, key, key, arguments

    def binding_durable(self, src: Exchange, key: tuple[str, str]) -> bool:
        if self._log.replaying or not src.durable:
            return False
        kind, name = key
        if kind == "q":
            queue = self._queues.get(name)
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
        bindings without looping on cycles (:meth:`route_keys` with one key)."""
        if exchange.name == DEFAULT_EXCHANGE:
            queue = self._queues.get(routing_key)
            return [queue] if queue is not None else []
        return self.route_keys(exchange, [routing_key], headers)

    def route_publish(self, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None) -> list[Queue]:
        """The queues a publish reaches: :meth:`route`, or, when its headers carry
        ``CC`` or ``BCC`` (sender-selected distribution, senderselected.py), with
        every key they name as well (:meth:`route_keys`), a headers exchange
        matching the headers without ``BCC`` (as RabbitMQ, which strips it first)."""
        if headers and ("CC" in headers or "BCC" in headers):
            return self.route_keys(exchange, publish_keys(routing_key, headers), without_bcc(headers))
        return self.route(exchange, routing_key, headers)

    def route_keys(self, exchange: Exchange, keys: list[str], headers: dict[str, Any] | None) -> list[Queue]:
        """:meth:`route` with several routing keys (``keys[0]`` the publish's own): a
        queue any key reaches, once. Every exchange on the way, an alternate exchange
        included, matches every key (RabbitMQ passes them all along); the default
        exchange takes each key as a queue name."""
        if not keys:
            return []
        if exchange.name == DEFAULT_EXCHANGE:
            return self._queues_named(keys)
        found: dict[str, Queue] = {}
        visited = {exchange.name}
        pending = [exchange]
        while pending:
            ex = pending.pop()
            for kind, name in _matches(ex, keys, headers):
                if kind == "q":
                    if name not in found:
                        queue = self._queues.get(name)
                        if queue is not None:
                            found[name] = queue
                elif name not in visited:
                    visited.add(name)
                    target = self.exchanges.get(name)
                    if target is not None:
                        pending.append(target)
            if not found and not pending:
                # no key routed anywhere: the alternate exchange, if any, takes them all
                alternate = ex.arguments.get("alternate-exchange")
                if alternate is not None and alternate not in visited:
                    visited.add(alternate)
                    target = self.exchanges.get(alternate)
                    if target is not None:
                        if target.name == DEFAULT_EXCHANGE:
                            return self._queues_named(keys)
                        pending.append(target)
        return list(found.values())

    def _queues_named(self, keys: list[str]) -> list[Queue]:
        """The default exchange's routing of several keys: the queues they name."""
        queues = self._queues
        return [queues[key] for key in dict.fromkeys(keys) if key in queues]


def _matches(exchange: Exchange, keys: list[str], headers: dict[str, Any] | None) -> Iterable[Dest]:
    """The destinations ``exchange``'s own bindings give a message of several routing
    keys (each once, in a dict's keys)."""
    table = exchange.table
    if len(keys) == 1 or routing_type(exchange.type, exchange.arguments) in _ONE_KEY_TYPES:
        return table.match(keys[0], headers)
    dests: dict[Dest, None] = {}
    for key in keys:
        dests.update(dict.fromkeys(table.match(key, headers)))
    return dests



def binding_record(source: str, dest: Any, routing_key: str, arguments: dict[str, Any]) -> dict[str, Any]:
    kind, name = dest
    record: dict[str, Any] = {"exchange": source, "routing_key": routing_key, "arguments": arguments}
    record["queue" if kind == "q" else "to_exchange"] = name
    return record

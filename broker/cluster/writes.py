"""Metadata changes made on this node: validated here, decided by an etcd transaction,
applied everywhere by the watch.

Every change is one txn that compares before it writes (``create_revision == 0`` for
"absent", ``mod_revision == seen`` for "unchanged since read"), so two nodes racing
to declare one queue differently cannot both win: the loser's txn fails and returns
the winner's definition, and the error it reports is built from that definition alone
(the same text on every node). Before answering, the writer waits until this node's
view has reached the txn's revision (read-your-writes). Input is validated first
against a scratch core, so etcd never holds a definition the cores would refuse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from broker.cluster.etcd import EtcdClient
from broker.cluster.etcdproto import (
    CompareCreate,
    CompareMod,
    Op,
    OpDelete,
    OpGet,
    OpPut,
)
from broker.cluster.mirror import core_arguments
from broker.cluster.view import (
    LEADER_LOCATOR,
    MASTER_LOCATOR,
    ClusterKeys,
    ClusterView,
    binding_digest,
    canonical,
)
from broker.core import (
    BUILTIN_EXCHANGES,
    AccessRefused,
    Broker,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)

__all__ = ["LOCATORS", "MetadataWriter", "placement", "queue_settings_message"]

#: Each placement argument's values and the placement they ask for: this node
#: (``client-local``) or the live node owning the fewest queues (``balanced``).
#: RabbitMQ's older leader spellings and its classic ``min-masters`` and ``random``
#: all spread queues out, so they are ``balanced`` here.
LOCATORS = {
    LEADER_LOCATOR: {"client-local": "client-local", "balanced": "balanced", "random": "balanced", "least-leaders": "balanced"},
    MASTER_LOCATOR: {"client-local": "client-local", "min-masters": "balanced", "random": "balanced"},
}


def placement(arguments: dict[str, Any]) -> str:
    """The placement a declare asks for: ``x-queue-leader-locator``, else the classic
    ``x-queue-master-locator``, else ``balanced``. A value neither knows is refused."""
    chosen = None
    for argument, values in LOCATORS.items():
        if argument in arguments:
            value = arguments[argument]
            if not isinstance(value, str) or value not in values:
                raise InvalidArgument(f"{argument} must be one of {', '.join(values)}, not {value!r}")
            chosen = chosen or values[value]
    return chosen or "balanced"


def _scratch() -> Broker:
    """A throw-away core, for validating a change exactly as the cores will."""
    return Broker(clock=lambda: 0.0, wall_clock=lambda: 0.0)


def queue_settings_message(name: str, d: dict[str, Any]) -> str:
    return (
        f"queue {name!r} exists with other settings (durable={d['durable']}, "
        f"auto_delete={d['auto_delete']}, arguments={core_arguments(d['arguments'])})"
    )


def _local_message(name: str, d: dict[str, Any]) -> str:
    return (f"queue {name!r} is an exclusive or server-named queue of a connection to node {d.get('owner')!r}: "
            "cannot obtain exclusive access to locked queue")


def _exchange_settings_message(name: str, d: dict[str, Any]) -> str:
    return (
        f"exchange {name!r} exists with other settings (type={d['type']}, durable={d['durable']}, "
        f"auto_delete={d['auto_delete']}, internal={d['internal']}, arguments={d['arguments']})"
    )


class MetadataWriter:
    """Declares, deletes and binds through etcd for the node ``node_name``.

    ``wait_seen(revision)`` returns once this node's view has applied ``revision``
    (raising ``Unavailable`` when it cannot in time). Every method raises the core's
    errors (``PreconditionFailed``, ``NotFound``, ``InvalidArgument``,
    ``AccessRefused``) and ``EtcdUnavailable``.
    """

    def __init__(
        self,
        client: EtcdClient,
        keys: ClusterKeys,
        view: ClusterView,
        node_name: str,
        wait_seen: Callable[[int], Awaitable[None]],
    ) -> None:
        self.client = client
        self.keys = keys
        self.view = view
        self.node_name = node_name
        self.wait_seen = wait_seen

    # ------------------------------------------------------------------- placement

    def place(self, locator: str) -> str:
        """The owner of a new queue: this node (``client-local``) or the live node
        owning the fewest queues (``balanced``; ties by name)."""
        live = sorted(self.view.live_nodes())
        if locator == "client-local" or not live:
            return self.node_name
        counts = self.view.queue_counts()
        return min(live, key=lambda node: (counts.get(node, 0), node))

    def place_replicas(self, first: str, arguments: dict[str, Any], durable: bool, auto_delete: bool) -> list[str]:
        """The replicas of a new quorum queue: ``first`` (its placement) and the live
        nodes owning the fewest queues. ``x-quorum-initial-group-size``: how many
        (default 3, or every node when fewer; odd, at most the number of nodes)."""
        if not durable or auto_delete:
            raise InvalidArgument("a quorum queue must be durable and not auto_delete")
        live = sorted(self.view.live_nodes())
        size = arguments.get("x-quorum-initial-group-size")
        if size is None:
            size = min(3, len(live))
            size -= 1 - size % 2
        if not isinstance(size, int) or size < 1 or size % 2 == 0:
            raise InvalidArgument("x-quorum-initial-group-size must be an odd number (1, 3, 5...)")
        if size > len(live):
            raise InvalidArgument(f"x-quorum-initial-group-size {size} is more than the {len(live)} live nodes")
        counts = self.view.queue_counts()
        others = sorted((n for n in live if n != first), key=lambda n: (counts.get(n, 0), n))
        return ([first] if first in live else []) + others[: size - (1 if first in live else 0)]

    # ---------------------------------------------------------------------- queues

    async def declare_queue(
        self, name: str, *, durable: bool, auto_delete: bool, arguments: dict[str, Any], passive: bool = False
    ) -> tuple[dict[str, Any], bool]:
        """The queue's definition and whether this call created it."""
        key = self.keys.meta("queues", name)
        if passive:
            _revision, found = await self.client.get(key)
            if found is None:
                raise NotFound(f"no queue {name!r}")
            await self.wait_seen(found.mod_revision)
            return dict(found.json()), False
        locator = placement(arguments)
        _scratch().declare_queue(name, durable=durable, auto_delete=auto_delete, arguments=core_arguments(arguments))
        d: dict[str, Any] = {"durable": durable, "auto_delete": auto_delete, "arguments": arguments, "owner": self.place(locator)}
        puts: list[Op] = [OpPut(key, canonical(d))]
        if arguments.get("x-queue-type") == "quorum":
            d["replicas"] = self.place_replicas(d["owner"], arguments, durable, auto_delete)
            d["owner"] = d["replicas"][0]
            puts = [OpPut(key, canonical(d)), OpPut(self.keys.replica("isr", name), canonical({"isr": sorted(d["replicas"])}))]
        existing = await self._create(key, puts)
        if existing is None:
            return d, True
        if existing.get("local"):
            raise ResourceLocked(_local_message(name, existing))
        if (existing["durable"], existing["auto_delete"], core_arguments(existing["arguments"])) != (
            durable,
            auto_delete,
            core_arguments(arguments),
        ):
            raise PreconditionFailed(queue_settings_message(name, existing))
        return existing, False

    async def delete_queue(self, name: str, *, local_check: Callable[[], None] | None = None) -> dict[str, Any]:
        """Delete queue ``name`` and its bindings; returns its last definition.
        ``local_check`` runs after the read and may refuse (if_unused / if_empty on
        the owner)."""
        key = self.keys.meta("queues", name)
        _revision, found = await self.client.get(key)
        if found is None:
            raise NotFound(f"no queue {name!r}")
        if local_check is not None:
            local_check()
        touching = set(self.view.bindings_touching("queues", name))
        deletes = [OpDelete(key), OpDelete(self.keys.replica("isr", name)), OpDelete(self.keys.replica("leaders", name))] + [
            OpDelete(self.keys.meta("bindings", digest)) for digest in touching
        ] + self._auto_deleted_exchanges(touching)
        result = await self.client.txn([CompareMod(key, found.mod_revision)], list(deletes), [])
        if not result.succeeded:
            raise PreconditionFailed(f"queue {name!r} changed while it was being deleted: try again")
        await self.wait_seen(result.revision)
        return dict(found.json())

    # ------------------------------------------------------------------- exchanges

    async def declare_exchange(
        self,
        name: str,
        type: str,
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
        passive: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """The exchange's definition and whether this call created it."""
        if name in BUILTIN_EXCHANGES:
            raise AccessRefused(f"exchange {name or 'amq.default'!r} is built in on every node")
        key = self.keys.meta("exchanges", name)
        if passive:
            _revision, found = await self.client.get(key)
            if found is None:
                raise NotFound(f"no exchange {name!r}")
            await self.wait_seen(found.mod_revision)
            return dict(found.json()), False
        _scratch().declare_exchange(
            name, type, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments
        )
        d = {"type": type, "durable": durable, "auto_delete": auto_delete, "internal": internal, "arguments": arguments}
        existing = await self._create(key, [OpPut(key, canonical(d))])
        if existing is None:
            return d, True
        if existing != d:
            raise PreconditionFailed(_exchange_settings_message(name, existing))
        return existing, False

    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        if name in BUILTIN_EXCHANGES:
            raise AccessRefused(f"exchange {name or 'amq.default'!r} is built in and cannot be deleted")
        key = self.keys.meta("exchanges", name)
        _revision, found = await self.client.get(key)
        if found is None:
            raise NotFound(f"no exchange {name!r}")
        touching = self.view.bindings_touching("exchanges", name)
        if if_unused and any(b["source"] == name for b in touching.values()):
            raise PreconditionFailed(f"exchange {name!r} has bindings")
        deletes: list[Op] = [OpDelete(key), OpDelete(self.keys.replica("isr", name)), OpDelete(self.keys.replica("leaders", name))]
        deletes += [OpDelete(self.keys.meta("bindings", digest)) for digest in touching]
        deletes += self._auto_deleted_exchanges(set(touching), {name})
        result = await self.client.txn([CompareMod(key, found.mod_revision)], list(deletes), [])
        if not result.succeeded:
            raise PreconditionFailed(f"exchange {name!r} changed while it was being deleted: try again")
        await self.wait_seen(result.revision)

    async def register_local_queue(
        self, name: str, *, durable: bool, auto_delete: bool, exclusive: bool, arguments: dict[str, Any], lease: int
    ) -> None:
        """Put a queue that lives in this node's core alone (exclusive or server-named,
        made there) in etcd, held by this node's ``lease``, so that every node routes
        to it and no other takes its name; it goes when the node does. Raises
        ResourceLocked when the cluster has a queue of that name."""
        key = self.keys.meta("queues", name)
        d = {"durable": durable, "auto_delete": auto_delete, "arguments": arguments, "owner": self.node_name,
             "local": True, "exclusive": exclusive}
        result = await self.client.txn([CompareCreate(key)], [OpPut(key, canonical(d), lease=lease)], [OpGet(key)])
        if not result.succeeded:
            found = result.ranges[0][0].json()
            raise ResourceLocked(
                _local_message(name, found) if found.get("local") else
                f"queue {name!r} exists in the cluster (node {found.get('owner')!r}): cannot obtain exclusive access to locked queue"
            )
        await self.wait_seen(result.revision)

    # -------------------------------------------------------------------- bindings

    async def bind(
        self, source: str, destination: str, routing_key: str, arguments: dict[str, Any], *, to_exchange: bool,
        lease: int = 0,
    ) -> bool:
        """Bind; returns False when the binding existed already. ``lease``: the binding
        goes with it (one to a queue of this node's alone: :meth:`register_local_queue`)."""
        compares, scratch = await self._binding_ends(source, destination, to_exchange)
        scratch.bind(source, destination, routing_key, arguments, to_exchange=to_exchange)
        b = {
            "source": source,
            "destination": destination,
            "to_exchange": to_exchange,
            "routing_key": routing_key,
            "arguments": arguments,
        }
        key = self.keys.meta("bindings", binding_digest(b))
        result = await self.client.txn(list(compares), [OpGet(key), OpPut(key, canonical(b), lease=lease)], [])
        if not result.succeeded:
            raise PreconditionFailed("the exchange or destination changed while binding: try again")
        await self.wait_seen(result.revision)
        return not result.ranges[0]

    async def unbind(
        self, source: str, destination: str, routing_key: str, arguments: dict[str, Any], *, to_exchange: bool
    ) -> None:
        if source == "":
            raise AccessRefused("the default exchange cannot be bound or unbound")
        b = {
            "source": source,
            "destination": destination,
            "to_exchange": to_exchange,
            "routing_key": routing_key,
            "arguments": arguments,
        }
        digest = binding_digest(b)
        key = self.keys.meta("bindings", digest)
        result = await self.client.txn([CompareCreate(key)], [], [OpDelete(key), *self._auto_deleted_exchanges({digest})])
        if result.succeeded:  # create_revision 0: absent
            raise NotFound("no such binding")
        await self.wait_seen(result.revision)

    def _auto_deleted_exchanges(self, removed: set[str], deleted: set[str] | None = None) -> list[Op]:
        """The deletes of the auto-delete exchanges left without a binding from them once
        the bindings ``removed`` (digests) are gone, and of the bindings to those (which
        may leave another bare, in turn); ``deleted``: exchanges going anyway. etcd's
        bindings decide, for the whole cluster (RabbitMQ's rule; the cores leave it to
        this: ``auto_delete_exchanges_here``). ``removed`` grows with those bindings."""
        deleted = set(deleted or ())
        bindings = self.view.entries["bindings"]
        ops: list[Op] = []
        looked: set[str] = set()
        while True:
            sources = {bindings[d][0]["source"] for d in removed if d in bindings} - deleted - looked
            if not sources:
                return ops
            looked |= sources
            for source in sorted(sources):
                d = self.view.get("exchanges", source)
                if d is None or not d.get("auto_delete") or source in BUILTIN_EXCHANGES:
                    continue
                if any(b["source"] == source and digest not in removed for digest, (b, _rev) in bindings.items()):
                    continue  # another binding keeps it
                deleted.add(source)
                ops.append(OpDelete(self.keys.meta("exchanges", source)))
                for digest in self.view.bindings_touching("exchanges", source):
                    if digest not in removed:
                        removed.add(digest)
                        ops.append(OpDelete(self.keys.meta("bindings", digest)))

    async def _create(self, key: bytes, puts: list[Any]) -> dict[str, Any] | None:
        """Write ``puts`` if ``key`` does not exist yet (one compare transaction): None
        when it was created, else what ``key`` holds. Either way this node's view has
        applied it before the answer (read-your-writes): the creating revision, or the
        revision the found value was last written at (the transaction's own revision
        may belong to a key this node does not watch)."""
        result = await self.client.txn([CompareCreate(key)], puts, [OpGet(key)])
        if result.succeeded:
            await self.wait_seen(result.revision)
            return None
        found = result.ranges[0][0]
        await self.wait_seen(found.mod_revision)
        return dict(found.json())

    async def _binding_ends(
        self, source: str, destination: str, to_exchange: bool
    ) -> tuple[list[CompareMod], Broker]:
        """The compares that keep both ends of a binding in place, and a scratch core
        holding them (to validate the binding as the cores will)."""
        scratch = _scratch()
        compares = []
        ends = [("exchanges", source), ("exchanges" if to_exchange else "queues", destination)]
        for kind, name in ends:
            if kind == "exchanges" and name in BUILTIN_EXCHANGES:
                continue
            _revision, found = await self.client.get(self.keys.meta(kind, name))
            if found is None:
                raise NotFound(f"no {kind[:-1]} {name!r}")
            compares.append(CompareMod(found.key, found.mod_revision))
            d = found.json()
            if kind == "exchanges":
                if name not in scratch.exchanges:
                    scratch.declare_exchange(
                        name, d["type"], durable=d["durable"], internal=d["internal"], arguments=d["arguments"]
                    )
            else:
                scratch.declare_queue(name, durable=d["durable"], arguments=core_arguments(d["arguments"]), reserved_ok=True)
        return compares, scratch

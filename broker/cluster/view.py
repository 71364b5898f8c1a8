"""What a node knows of the cluster: its etcd keys, their meaning, and its copy of them.

Every key lives under ``/<cluster_name>/`` (``ClusterKeys``):

- ``nodes/<name>``: a live node (``name``, ``url``, ``since``, ``pid``), put with the
  node's lease, so it vanishes when the lease lapses;
- ``known/<name>``: every node that ever joined (``name``, ``url``), no lease: the dead
  are still listed;
- ``meta/exchanges/<name>``, ``meta/queues/<name>`` (with its ``owner``),
  ``meta/bindings/<digest>``, ``meta/users/<name>``, ``meta/tokens/<id>``: the
  cluster-wide metadata;
- ``replicas/leaders/<queue>``, ``replicas/isr/<queue>``: a quorum queue's leader (put
  once, with the leader's lease: its create revision is the leader's epoch) and its
  in-sync set (``leader.py``).

Names are percent-encoded in keys (a queue may be called ``a/b``). :class:`ClusterView`
is a node's copy of all of it at one revision, kept current by a watch and replaced by
a range read after a gap; applying a batch returns what changed, old and new value, so
the mirror can undo a delete whose value the watch does not carry. Pure: no IO.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, unquote

import orjson

from broker.cluster.etcdproto import KeyValue, WatchBatch

__all__ = ["Change", "ClusterKeys", "ClusterView", "LEADER_LOCATOR", "MASTER_LOCATOR", "binding_digest", "canonical", "is_replicated"]

#: The queue argument naming how its owner is chosen (RabbitMQ's name and values).
LEADER_LOCATOR: Final = "x-queue-leader-locator"
#: RabbitMQ's placement argument for classic queues, taken when the first is absent.
MASTER_LOCATOR: Final = "x-queue-master-locator"
KINDS: Final = ("exchanges", "queues", "bindings", "users", "tokens")
#: a quorum queue's leader and in-sync set (``replicas/<kind>/<queue>``)
REPLICA_KINDS: Final = ("leaders", "isr")


def canonical(value: Any) -> bytes:
    """``value`` as JSON with sorted keys: equal definitions are equal bytes, so a txn
    can compare them."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def binding_digest(binding: dict[str, Any]) -> str:
    """A binding's key: the digest of everything that makes it one binding."""
    return hashlib.sha256(canonical(binding)).hexdigest()[:32]


def is_replicated(d: dict[str, Any] | None) -> bool:
    """Whether queue definition ``d`` (etcd's; None: no such queue) is a replicated
    (quorum) queue, which lives on its replicas rather than on its owner alone."""
    return d is not None and d.get("arguments", {}).get("x-queue-type") == "quorum"


@dataclass(frozen=True)
class ClusterKeys:
    """The etcd keys of one cluster (``cluster_name``)."""

    cluster_name: str

    @property
    def root(self) -> bytes:
        return f"/{self.cluster_name}/".encode()

    def node(self, name: str) -> bytes:
        return self.root + b"nodes/" + quote(name, safe="").encode()

    def known(self, name: str) -> bytes:
        return self.root + b"known/" + quote(name, safe="").encode()

    def meta(self, kind: str, name: str) -> bytes:
        return self.root + f"meta/{kind}/".encode() + quote(name, safe="").encode()

    def replica(self, kind: str, queue: str) -> bytes:
        return self.root + f"replicas/{kind}/".encode() + quote(queue, safe="").encode()

    def parse(self, key: bytes) -> tuple[str, str] | None:
        """(``nodes``/``known``/a metadata kind, name) of one of this cluster's keys."""
        if not key.startswith(self.root):
            return None
        parts = key[len(self.root) :].decode(errors="replace").split("/")
        if len(parts) == 2 and parts[0] in ("nodes", "known"):
            return parts[0], unquote(parts[1])
        if len(parts) == 3 and parts[0] == "meta" and parts[1] in KINDS:
            return parts[1], unquote(parts[2])
        if len(parts) == 3 and parts[0] == "replicas" and parts[1] in REPLICA_KINDS:
            return parts[1], unquote(parts[2])
        return None


@dataclass(frozen=True)
class Change:
    """One key's change: its kind and name, the value before and after (None: absent)."""

    kind: str
    name: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None


def _decode(value: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class ClusterView:
    """A node's copy of its cluster's keys, at ``revision`` (the last one applied)."""

    def __init__(self, keys: ClusterKeys) -> None:
        self.keys = keys
        self.revision = 0
        #: kind -> name -> (value, mod_revision)
        self.entries: dict[str, dict[str, tuple[dict[str, Any], int]]] = {
            kind: {} for kind in ("nodes", "known", *KINDS, *REPLICA_KINDS)
        }
        #: kind -> name -> create_revision: which incarnation of a key this is (a key
        #: deleted and put again, e.g. a queue deleted and declared again under the same
        #: name, is created anew at a later revision even when its value is the same)
        self.created: dict[str, dict[str, int]] = {kind: {} for kind in self.entries}

    def reset(self, revision: int, kvs: list[KeyValue]) -> list[Change]:
        """Replace everything with a range read at ``revision``; returns every change."""
        fresh: dict[str, dict[str, tuple[dict[str, Any], int]]] = {kind: {} for kind in self.entries}
        created: dict[str, dict[str, int]] = {kind: {} for kind in self.entries}
        for kv in kvs:
            where = self.keys.parse(kv.key)
            value = _decode(kv.value)
            if where is not None and value is not None:
                fresh[where[0]][where[1]] = (value, kv.mod_revision)
                created[where[0]][where[1]] = kv.create_revision
        changes = []
        for kind, old_items in self.entries.items():
            new_items = fresh[kind]
            for name in old_items.keys() | new_items.keys():
                old, new = old_items.get(name), new_items.get(name)
                if old is None or new is None or old[0] != new[0]:
                    changes.append(Change(kind, name, old and old[0], new and new[0]))
        self.entries = fresh
        self.created = created
        self.revision = max(self.revision, revision)
        return changes

    def apply(self, batch: WatchBatch) -> list[Change]:
        """Apply a watch message's events; returns what changed."""
        changes = []
        for event in batch.events:
            where = self.keys.parse(event.kv.key)
            if where is None:
                continue
            kind, name = where
            items = self.entries[kind]
            old = items.get(name)
            if event.deleted:
                self.created[kind].pop(name, None)
                if old is not None:
                    del items[name]
                    changes.append(Change(kind, name, old[0], None))
                continue
            value = _decode(event.kv.value)
            if value is None:
                continue
            items[name] = (value, event.kv.mod_revision)
            self.created[kind][name] = event.kv.create_revision
            changes.append(Change(kind, name, old and old[0], value))
        if batch.events:
            # Not the header's revision: a watcher still catching up gets batches
            # headed with the store's current revision before it has seen all of it.
            self.revision = max(self.revision, *(e.kv.mod_revision for e in batch.events))
        elif not (batch.created or batch.canceled or batch.compacted):
            self.revision = max(self.revision, batch.revision)  # a progress notice: all sent
        return changes

    # ----------------------------------------------------------------- derived

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        found = self.entries[kind].get(name)
        return found[0] if found else None

    def values(self, kind: str) -> list[dict[str, Any]]:
        return [value for value, _rev in self.entries[kind].values()]

    def revision_of(self, kind: str, name: str) -> int:
        """The mod revision of a key (0: absent)."""
        found = self.entries[kind].get(name)
        return found[1] if found else 0

    def created_revision(self, kind: str, name: str) -> int:
        """The create revision of a key: its incarnation, the same across puts until
        it is deleted (0: absent, or unknown)."""
        return self.created[kind].get(name, 0)

    def live_nodes(self) -> dict[str, dict[str, Any]]:
        return {name: value for name, (value, _rev) in self.entries["nodes"].items()}

    def serving_node(self, queue: str, d: dict[str, Any]) -> str | None:
        """The node that serves queue ``queue`` (definition ``d``): its owner, or for a
        replicated queue (``x-queue-type: quorum``) its leader (None: none now)."""
        if not is_replicated(d):
            return str(d.get("owner"))
        leader = self.get("leaders", queue)
        return str(leader.get("node")) if leader is not None else None

    def queue_counts(self) -> dict[str, int]:
        """How many queues each node owns (a connection's own, ``local``, left out)."""
        counts: dict[str, int] = {}
        for value in self.values("queues"):
            if value.get("local"):
                continue
            owner = str(value.get("owner"))
            counts[owner] = counts.get(owner, 0) + 1
        return counts

    def bindings_touching(self, kind: str, name: str) -> dict[str, dict[str, Any]]:
        """Bindings (by digest) whose source or destination is exchange/queue ``name``."""
        found = {}
        for digest, (b, _rev) in self.entries["bindings"].items():
            if kind == "exchanges" and (b["source"] == name or (b["to_exchange"] and b["destination"] == name)):
                found[digest] = b
            elif kind == "queues" and not b["to_exchange"] and b["destination"] == name:
                found[digest] = b
        return found

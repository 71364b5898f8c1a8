"""Users, their permissions and their API tokens, cluster-wide.

In etcd a user is its core record (``meta/users/<name>``: name, password hash, tags,
permissions) and a token its record (``meta/tokens/<id>``: id, user, digest of the
secret, times, description): never a password or a token's secret. The writer changes
them with compare txns (``mod_revision`` of what it read), validated first against a
scratch core; the mirror applies them to each node's core, which the authenticator
reads as it does on a single node, so permissions apply the same on every node.

Seeding: a node that joins a cluster with no users in etcd brings its own (a broker
that serves beyond loopback needs one, made offline with ``python -m broker users
add``); after that, etcd is the source of truth and users are managed over REST.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.cluster.etcd import EtcdClient
from broker.cluster.etcdproto import CompareCreate, CompareMod, OpDelete, OpPut
from broker.cluster.view import ClusterKeys, ClusterView, canonical
from broker.core import (
    Broker,
    ErrorReply,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
)

__all__ = ["UserMirror", "UserWriter", "seed_users"]

log = logging.getLogger("ackbus.cluster")


def _scratch() -> Broker:
    return Broker(clock=lambda: 0.0, wall_clock=lambda: 0.0)


class UserMirror:
    """Applies user and token changes to ``core``; ``errors`` collects refusals."""

    def __init__(self, core: Broker, errors: Any) -> None:
        self.core = core
        self.errors = errors

    def _attempt(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except ErrorReply as exc:
            self.errors.append(f"{what}: {exc.message}")
            log.warning("cluster user change not applied", extra={"fields": {"what": what, "error": exc.message}})

    def put_user(self, d: dict[str, Any]) -> None:
        existing = self.core.users.get(d["name"])
        if existing is not None and existing.record() == {**d, "tags": list(d["tags"])}:
            return
        self._attempt(
            f"user {d['name']!r}",
            self.core.put_user,
            d["name"],
            password=d["password"],
            tags=d["tags"],
            permissions=d["permissions"],
        )

    def delete_user(self, name: str) -> None:
        if self.core.users.get(name) is not None:
            self._attempt(f"delete user {name!r}", self.core.delete_user, name)

    def put_token(self, d: dict[str, Any]) -> None:
        if d["id"] in self.core.users.tokens:
            return
        if d["expires_s"] is not None and d["expires_s"] <= self.core.wall_clock():
            return  # expired: nothing to keep
        self._attempt(
            f"token {d['id']!r}",
            self.core.add_token,
            d["id"],
            d["user"],
            d["digest"],
            expires_s=d["expires_s"],
            description=d["description"],
        )

    def revoke_token(self, token_id: str) -> None:
        if token_id in self.core.users.tokens:
            self._attempt(f"revoke token {token_id!r}", self.core.revoke_token, token_id)

    def reconcile(self, view: ClusterView) -> None:
        for name in [n for n in self.core.users.users if view.get("users", n) is None]:
            self.delete_user(name)
        for token_id in [t for t in self.core.users.tokens if view.get("tokens", t) is None]:
            self.revoke_token(token_id)
        for d in view.values("users"):
            self.put_user(d)
        for d in view.values("tokens"):
            self.put_token(d)


async def seed_users(client: EtcdClient, keys: ClusterKeys, view: ClusterView, core: Broker) -> bool:
    """When etcd holds no user and ``core`` does, write the core's users and tokens
    (each only if still absent). Returns whether anything was written."""
    if view.entries["users"] or not len(core.users):
        return False
    ops: list[Any] = []
    compares: list[Any] = []
    for user in core.users.users.values():
        key = keys.meta("users", user.name)
        compares.append(CompareCreate(key))
        ops.append(OpPut(key, canonical(user.record())))
    for token in core.users.tokens.values():
        key = keys.meta("tokens", token.id)
        compares.append(CompareCreate(key))
        ops.append(OpPut(key, canonical(token.record())))
    result = await client.txn(compares, ops, [])
    if result.succeeded:
        log.info("seeded the cluster with this node's users", extra={"fields": {"users": len(core.users)}})
    return result.succeeded


class UserWriter:
    """User and token changes through etcd (see the module docstring). Raises the
    core's errors and ``EtcdUnavailable``."""

    def __init__(
        self, client: EtcdClient, keys: ClusterKeys, view: ClusterView, wait_seen: Callable[[int], Awaitable[None]]
    ) -> None:
        self.client = client
        self.keys = keys
        self.view = view
        self.wait_seen = wait_seen

    async def _read_user(self, name: str) -> tuple[Any, dict[str, Any] | None]:
        _revision, found = await self.client.get(self.keys.meta("users", name))
        return found, (dict(found.json()) if found is not None else None)

    async def put_user(
        self, name: str, *, password: str | None, tags: list[str], permissions: dict[str, str] | None
    ) -> tuple[dict[str, Any], bool]:
        """Create or replace; ``password`` None keeps the current hash, ``permissions``
        None the current permissions. Returns the user's record and whether it was
        created."""
        found, current = await self._read_user(name)
        if current is None and password is None:
            raise InvalidArgument("a new user needs a password (tokens can be added later)")
        if current is not None:
            password = password if password is not None else current["password"]
            permissions = permissions if permissions is not None else current["permissions"]
        scratch = _scratch()
        scratch.put_user(name, password=password, tags=tags, permissions=permissions)
        record = scratch.users.users[name].record()
        key = self.keys.meta("users", name)
        compare = CompareMod(key, found.mod_revision) if found is not None else CompareCreate(key)
        result = await self.client.txn([compare], [OpPut(key, canonical(record))], [])
        if not result.succeeded:
            raise PreconditionFailed(f"user {name!r} changed meanwhile: try again")
        await self.wait_seen(result.revision)
        return record, current is None

    async def set_permissions(self, name: str, permissions: dict[str, str]) -> dict[str, Any]:
        found, current = await self._read_user(name)
        if current is None:
            raise NotFound(f"no user {name!r}")
        record, _created = await self.put_user(
            name, password=current["password"], tags=current["tags"], permissions=permissions
        )
        return record

    async def delete_user(self, name: str) -> None:
        found, current = await self._read_user(name)
        if found is None:
            raise NotFound(f"no user {name!r}")
        deletes = [OpDelete(found.key)] + [
            OpDelete(self.keys.meta("tokens", d["id"])) for d in self.view.values("tokens") if d["user"] == name
        ]
        result = await self.client.txn([CompareMod(found.key, found.mod_revision)], list(deletes), [])
        if not result.succeeded:
            raise PreconditionFailed(f"user {name!r} changed meanwhile: try again")
        await self.wait_seen(result.revision)

    async def add_token(
        self, token_id: str, user: str, digest: str, *, now_s: float, expires_s: float | None, description: str
    ) -> dict[str, Any]:
        found, current = await self._read_user(user)
        if current is None:
            raise NotFound(f"no user {user!r}")
        scratch = Broker(clock=lambda: 0.0, wall_clock=lambda: now_s)
        scratch.put_user(user, password=current["password"], tags=current["tags"], permissions=current["permissions"])
        for d in self.view.values("tokens"):
            if d["user"] == user and (d["expires_s"] is None or d["expires_s"] > now_s):
                scratch.add_token(d["id"], user, d["digest"], expires_s=d["expires_s"], description=d["description"])
        token = scratch.add_token(token_id, user, digest, expires_s=expires_s, description=description)
        key = self.keys.meta("tokens", token_id)
        result = await self.client.txn(
            [CompareMod(found.key, found.mod_revision), CompareCreate(key)], [OpPut(key, canonical(token.record()))], []
        )
        if not result.succeeded:
            raise PreconditionFailed(f"user {user!r} changed meanwhile: try again")
        await self.wait_seen(result.revision)
        return token.record()

    async def revoke_token(self, token_id: str) -> None:
        key = self.keys.meta("tokens", token_id)
        result = await self.client.txn([CompareCreate(key)], [], [OpDelete(key)])
        if result.succeeded:
            raise NotFound(f"no token {token_id[:32]!r}")
        await self.wait_seen(result.revision)

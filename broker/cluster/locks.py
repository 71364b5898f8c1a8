"""Cluster mode's locks: held in etcd, one place for the whole cluster, whichever
node is asked (docs/cluster.md, "Locks and schedules").

A held lock is the key ``/<cluster>/locks/<name>`` (owner, ttl, times), put with an
etcd lease of its TTL (rounded up to whole seconds: etcd's unit), so it vanishes when
its holder stops refreshing it, whichever node it asked. Its **fencing token is the
key's ``create_revision``**: the etcd revision of the acquire, which only grows across
the cluster and its nodes' restarts; a refresh re-puts the key (a new lease for the
new TTL) under a compare on that revision, so the token stays. An acquire is one txn
(``create_revision == 0``: free); one that may wait polls until the lock is free or
its ``wait_s`` runs out (waiters are not served in arrival order in cluster mode).
Release deletes the key under the same compare. The answers have the single node's
shape (``GET /locks/{name}``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, ParamSpec, TypeVar
from urllib.parse import quote, unquote

import orjson
import trio

from broker.cluster.etcd import EtcdClient
from broker.cluster.etcdproto import (
    CompareCreate,
    EtcdError,
    KeyValue,
    OpDelete,
    OpGet,
    OpPut,
)
from broker.cluster.view import ClusterKeys, canonical
from broker.core import (
    InvalidArgument,
    LockBusy,
    NotLockHolder,
    Unavailable,
    check_lock_ttl,
    check_lock_wait,
    check_name,
    check_owner,
    iso_utc,
)

__all__ = ["ClusterLocks"]

P = ParamSpec("P")
T = TypeVar("T")

#: How often a waiting acquire looks again.
POLL_S: Final = 0.1


def _token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidArgument("token must be a positive integer (the fencing token of the acquire)")
    return token


def _etcd_errors(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """An etcd failure becomes ``503 etcd_unavailable`` (a core error every protocol
    renders)."""

    @functools.wraps(method)
    async def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except EtcdError as exc:
            raise Unavailable(f"etcd is unreachable, so locks cannot be used now: {exc.message}", code="etcd_unavailable") from None

    return guarded


class ClusterLocks:
    """Locks in etcd (see the module docstring)."""

    def __init__(self, client: EtcdClient, keys: ClusterKeys) -> None:
        self.client = client
        self.prefix = keys.root + b"locks/"

    def _key(self, name: str) -> bytes:
        return self.prefix + quote(name, safe="").encode()

    @staticmethod
    def _info(name: str, kv: KeyValue | None) -> dict[str, Any]:
        if kv is None:
            return {
                "name": name, "held": False, "owner": None, "token": None, "acquired_at": None,
                "expires_at": None, "ttl_s": None, "expires_in_s": None, "waiters": [],
            }
        d = orjson.loads(kv.value)
        return {
            "name": name,
            "held": True,
            "owner": d["owner"],
            "token": kv.create_revision,
            "acquired_at": iso_utc(d["acquired"]),
            "expires_at": iso_utc(d["expires"]),
            "ttl_s": d["ttl_s"],
            "expires_in_s": round(max(0.0, d["expires"] - time.time()), 3),
            "waiters": [],
        }

    async def _put_held(
        self, name: str, owner: str, ttl_s: float, acquired: float, compare: CompareCreate
    ) -> tuple[bool, KeyValue | None, int]:
        """The txn that puts the held lock under ``compare``: (succeeded, the key as
        it is after, the lease used)."""
        lease = await self.client.lease_grant(max(1, math.ceil(ttl_s)))
        now = time.time()
        value = canonical({"owner": owner, "ttl_s": ttl_s, "acquired": acquired or now, "expires": now + ttl_s, "lease": lease})
        key = self._key(name)
        result = await self.client.txn([compare], [OpPut(key, value, lease), OpGet(key)], [OpGet(key)])
        ranges = result.ranges[-1] if result.ranges else []
        found = ranges[0] if ranges else None
        if not result.succeeded:
            await self._revoke(lease)
        return result.succeeded, found, lease

    async def _revoke(self, lease: int) -> None:
        try:
            await self.client.lease_revoke(lease)
        except EtcdError:
            pass  # it lapses by itself

    @_etcd_errors
    async def acquire(self, name: str, owner: object, ttl_s: object, wait_s: object) -> dict[str, Any]:
        """The lock, granted; raises ``LockBusy`` (held by another after ``wait_s``)."""
        check_name("lock", name)
        holder = check_owner(owner)
        ttl = check_lock_ttl(ttl_s)
        deadline = trio.current_time() + check_lock_wait(wait_s)
        while True:
            granted, found, _lease = await self._put_held(name, holder, ttl, 0.0, CompareCreate(self._key(name)))
            if granted:
                return self._info(name, found)
            if found is not None and orjson.loads(found.value).get("owner") == holder:
                # held by this owner already: granted again, same token, new TTL (as on a single node)
                d = orjson.loads(found.value)
                again, now_found, _lease = await self._put_held(
                    name, holder, ttl, float(d["acquired"]), CompareCreate(found.key, found.create_revision)
                )
                if again:
                    await self._revoke(int(d["lease"]))
                    return self._info(name, now_found)
                continue
            if trio.current_time() >= deadline:
                info = self._info(name, found)
                raise LockBusy(f"lock {name!r} is held by {info['owner']!r}", info)
            await trio.sleep(min(POLL_S, max(0.0, deadline - trio.current_time())))

    async def _held(self, name: str, owner: object, token: object, what: str) -> tuple[KeyValue, dict[str, Any]]:
        check_name("lock", name)
        holder = check_owner(owner)
        fencing = _token(token)
        _rev, found = await self.client.get(self._key(name))
        if found is None or found.create_revision != fencing or orjson.loads(found.value).get("owner") != holder:
            raise NotLockHolder(f"cannot {what} lock {name!r}: {holder!r} with token {fencing} does not hold it", self._info(name, found))
        return found, orjson.loads(found.value)

    @_etcd_errors
    async def refresh(self, name: str, owner: object, token: object, ttl_s: object) -> dict[str, Any]:
        found, d = await self._held(name, owner, token, "refresh")
        ttl = check_lock_ttl(ttl_s) if ttl_s is not None else float(d["ttl_s"])
        ok, now_found, _lease = await self._put_held(name, d["owner"], ttl, float(d["acquired"]), CompareCreate(found.key, found.create_revision))
        if not ok:
            raise NotLockHolder(f"cannot refresh lock {name!r}: it was lost meanwhile", self._info(name, now_found))
        await self._revoke(int(d["lease"]))
        return self._info(name, now_found)

    @_etcd_errors
    async def release(self, name: str, owner: object, token: object) -> dict[str, Any]:
        found, d = await self._held(name, owner, token, "release")
        result = await self.client.txn([CompareCreate(found.key, found.create_revision)], [OpDelete(found.key)], [OpGet(found.key)])
        if not result.succeeded:
            ranges = result.ranges[0] if result.ranges else []
            raise NotLockHolder(f"cannot release lock {name!r}: it was lost meanwhile", self._info(name, ranges[0] if ranges else None))
        await self._revoke(int(d["lease"]))
        return self._info(name, None)

    @_etcd_errors
    async def info(self, name: str) -> dict[str, Any]:
        check_name("lock", name)
        _rev, found = await self.client.get(self._key(name))
        return self._info(name, found)

    @_etcd_errors
    async def infos(self) -> list[dict[str, Any]]:
        _rev, kvs = await self.client.get_prefix(self.prefix)
        return [self._info(unquote(kv.key[len(self.prefix) :].decode()), kv) for kv in sorted(kvs, key=lambda kv: kv.key)]

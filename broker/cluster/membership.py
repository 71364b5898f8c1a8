"""A node's membership: its key under ``nodes/``, held by an etcd lease kept alive.

The lease is etcd's clock, not ours: when keepalives stop getting through, etcd may
expire the lease (and another process may take the name) before this node hears of
it. So the node counts itself out at ``last acknowledged keepalive + TTL - margin``
by its own monotonic clock, measured from when the acknowledged keepalive was *sent*
(etcd renewed it later than that, never earlier). Past that instant it reports its
membership as lost, and goes on renewing the same lease: when etcd answers that it
still has it, the lease never expired there, so nothing it holds (the node's key, a
quorum queue's leadership) went to anyone else, and the node is a member again with
it. When etcd answers that the lease is gone, the node registers afresh; if by then
another process holds the name, this one must not serve: :class:`NodeNameTaken` ends
it.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

import orjson
import trio

from broker.cluster.etcd import EtcdClient
from broker.cluster.etcdproto import (
    CompareCreate,
    EtcdError,
    EtcdUnavailable,
    OpGet,
    OpPut,
)
from broker.cluster.view import ClusterKeys

__all__ = ["Membership", "NodeNameTaken"]

log = logging.getLogger("ackbus.cluster")

#: the first retry of a renewal etcd did not answer (then doubling)
RETRY_FIRST_S = 0.1


class NodeNameTaken(Exception):
    """Another live process is registered under this node name."""


class Membership:
    """Registers node ``name`` at ``url`` and keeps its lease alive (see the module
    docstring). ``alive_until`` is the monotonic instant past which the node must
    consider its lease lost."""

    def __init__(self, client: EtcdClient, keys: ClusterKeys, name: str, url: str, ttl_s: int) -> None:
        self.client = client
        self.keys = keys
        self.name = name
        self.url = url
        self.ttl_s = ttl_s
        self.margin_s = max(0.5, ttl_s * 0.2)
        self.lease = 0
        self.since = time.time()
        self.alive_until = 0.0
        self.registrations = 0
        #: called after a registration with a new lease that follows a lost one (what
        #: the old lease held in etcd is gone: the node puts it back)
        self.on_rejoined: Callable[[], None] = lambda: None
        #: tells this process's own stale key (an old lease it counted lost) from
        #: another process's
        self.incarnation = secrets.token_hex(8)

    @property
    def registered(self) -> bool:
        return self.lease != 0 and trio.current_time() < self.alive_until

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "since": self.since,
            "pid": os.getpid(),
            "incarnation": self.incarnation,
        }

    async def register(self) -> None:
        """Take the name with a fresh lease. Raises NodeNameTaken when a live process
        holds it; EtcdUnavailable when etcd cannot be reached."""
        for _attempt in range(2):
            if await self._try_register():
                return

    async def _try_register(self) -> bool:
        sent = trio.current_time()
        lease = await self.client.lease_grant(self.ttl_s)
        key = self.keys.node(self.name)
        self.since = time.time()
        result = await self.client.txn(
            [CompareCreate(key)],
            [OpPut(key, orjson.dumps(self.record()), lease=lease), OpPut(self.keys.known(self.name), orjson.dumps({"name": self.name, "url": self.url}))],
            [OpGet(key)],
        )
        if not result.succeeded:
            await self.client.lease_revoke(lease)
            found = result.ranges[0][0] if result.ranges and result.ranges[0] else None
            other = found.json() if found is not None else {}
            if found is not None and other.get("incarnation") == self.incarnation:
                await self.client.lease_revoke(found.lease)  # our own stale key: drop it
                return False
            raise NodeNameTaken(
                f"node name {self.name!r} is already in use by a live process (url {other.get('url')}, "
                f"pid {other.get('pid')}); a node whose process is gone frees its name within "
                f"cluster_lease_ttl_s ({self.ttl_s} s)"
            )
        self.lease = lease
        self.alive_until = sent + self.ttl_s - self.margin_s
        self.registrations += 1
        log.info("joined the cluster", extra={"fields": {"node": self.name, "url": self.url, "lease": lease}})
        return True

    async def keep_alive(self, on_change: Any) -> None:
        """Renew the lease every third of its TTL, forever; re-register once etcd says
        it is gone (see the module docstring). A renewal etcd did not answer is tried
        again at once (from 0.1 s, doubling up to the third of the TTL while none
        answers): the etcd client tries another endpoint first, and waiting the whole
        third would leave the margin too thin for one unanswered call to cost nothing
        (the lease counted lost, this node's leaderships with it).
        ``on_change(error or None)`` reports whether etcd answered."""
        interval = max(0.2, self.ttl_s / 3)
        wait = interval
        retry = RETRY_FIRST_S
        counted_lost = False
        while True:
            await trio.sleep(wait)
            wait = interval
            sent = trio.current_time()
            try:
                if self.lease == 0:
                    await self._rejoin()
                else:
                    ttl = await self.client.lease_keepalive(self.lease)
                    if ttl <= 0:
                        log.warning("membership lease expired in etcd", extra={"fields": {"node": self.name}})
                        await self._rejoin()
                    else:
                        if counted_lost:
                            log.info("membership lease renewed: still held in etcd", extra={"fields": {"node": self.name}})
                        self.alive_until = sent + ttl - self.margin_s
                counted_lost = False
            except EtcdUnavailable as exc:
                on_change(exc.message)
                if trio.current_time() >= self.alive_until and not counted_lost:
                    log.warning("membership lease counted lost", extra={"fields": {"node": self.name}})
                    counted_lost = True
                wait, retry = min(interval, retry), min(interval, retry * 2)
                continue
            except EtcdError as exc:
                on_change(exc.message)
                continue
            retry = RETRY_FIRST_S
            on_change(None)

    async def _rejoin(self) -> None:
        self.lease = 0
        await self.register()
        self.on_rejoined()

    async def leave(self) -> None:
        """Revoke the lease (the node key goes with it): shown dead at once."""
        if self.lease:
            lease, self.lease = self.lease, 0
            try:
                await self.client.lease_revoke(lease)
            except EtcdError:
                pass  # it lapses by itself within the TTL

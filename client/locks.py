"""Named locks: ``async with conn.lock("nightly-report", ttl_s=30) as lock:``.

The block runs only while the broker holds the lock for this owner. A background task
refreshes it (every third of its time to live); if the lock is lost - a refresh is
refused (it expired, another owner has it), or no refresh gets through before the
lock would expire - the body is cancelled, the structured-concurrency way, and the block raises
:class:`LockLost`. The body never keeps running without its lock as far as this
process can tell: it is cancelled a safety margin *before* the broker's expiry, as
measured from before the acquire was sent.

``lock.token`` is the lock's fencing token: it grows with every acquisition of any
lock, across broker restarts too. Hand it to the storage the block writes to, which
refuses writes carrying a token lower than the highest it has seen (see
docs/coordination.md).

Uses REST calls on keep-alive connections of its own (the acquire may wait in line as
long as ``wait_s``), so it needs no channel.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import anyio
import orjson

from ._nursery import open_service_nursery
from .endpoint import Endpoint, StreamOpener
from .errors import ClientError
from .transport import RestClient, error_from_response

__all__ = ["HeldLock", "LockHeld", "LockLost", "hold_lock", "default_owner"]

#: Cancel the body this long before the expiry (at most; a tenth of the ttl for short ones).
SAFETY_MARGIN_S = 1.0


class LockHeld(ClientError):
    """The lock is held by another owner (and ``wait_s`` ran out). ``info``: the lock
    as the broker showed it (``owner``, ``expires_at``, ``waiters``)."""

    def __init__(self, name: str, info: dict[str, Any]) -> None:
        super().__init__(f"lock {name!r} is held by {info.get('owner')!r} until {info.get('expires_at')}")
        self.name = name
        self.info = info


class LockLost(ClientError):
    """The lock was lost while its block ran: a refresh was refused, or none got
    through before it would expire. The block's body was cancelled."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"lock {name!r} lost: {reason}")
        self.name = name
        self.reason = reason


@dataclass
class HeldLock:
    """A lock this process holds: its name, owner and fencing ``token``."""

    name: str
    owner: str
    token: int
    ttl_s: float
    #: the broker's last answer about it (acquired_at, expires_at...)
    info: dict[str, Any]
    #: event-loop time after which it may have expired (a margin earlier than the broker's)
    deadline: float = 0.0


def default_owner() -> str:
    """``host/pid-N/xxxxxx``: unique per process and per lock block."""
    return f"{socket.gethostname()}/pid-{os.getpid()}/{secrets.token_hex(3)}"


class _Locks:
    def __init__(self, rest: RestClient, name: str) -> None:
        self.rest = rest
        self.path = f"/locks/{quote(name, safe='')}"
        self.name = name

    async def call(self, verb: str, body: dict[str, Any]) -> tuple[int, Any]:
        response = await self.rest.request(
            "POST", f"{self.path}/{verb}", body=orjson.dumps(body), headers=[("Content-Type", "application/json")]
        )
        if response.status == 409:
            return 409, response.json()
        if not 200 <= response.status < 300:
            raise error_from_response(response)
        return response.status, response.json()


@asynccontextmanager
async def hold_lock(
    endpoint: Endpoint,
    opener: StreamOpener,
    name: str,
    *,
    ttl_s: float = 30.0,
    wait_s: float = 0.0,
    owner: str | None = None,
    request_timeout_s: float = 30.0,
) -> AsyncIterator[HeldLock]:
    """Hold lock ``name`` for the block (see the module docstring); made by
    ``Connection.lock``.

    Raises:
        LockHeld: held by another owner, still after ``wait_s``.
        LockLost: lost while the block ran (its body was cancelled).
        BrokerRequestError: bad arguments (``ttl_s``, ``wait_s``, name).
        ConnectionLost: the broker could not be reached for the acquire.
    """
    owner = owner or default_owner()
    margin = min(SAFETY_MARGIN_S, ttl_s / 10)
    rest = RestClient(endpoint, opener, timeout_s=wait_s + request_timeout_s)
    locks = _Locks(rest, name)
    try:
        sent_at = anyio.current_time()
        status, info = await locks.call("acquire", {"owner": owner, "ttl_s": ttl_s, "wait_s": wait_s})
        if status == 409:
            raise LockHeld(name, info.get("lock") or {})
        lock = HeldLock(name, owner, int(info["token"]), ttl_s, info)
        # When it may expire: counted from when the acquire was sent; a waited one was
        # granted at some point in between, and the broker says how long it had left
        # then (the margin covers the time its answer took to arrive).
        if wait_s:
            lock.deadline = anyio.current_time() + float(info.get("expires_in_s") or ttl_s) - margin
        else:
            lock.deadline = sent_at + ttl_s - margin
        lost: list[str] = []
        try:
            async with open_service_nursery() as nursery:
                body = anyio.CancelScope()
                nursery.start_soon(_keep, locks, lock, margin, lost, body)
                with body:
                    yield lock
                nursery.cancel_scope.cancel()
            if lost:
                raise LockLost(name, lost[0])
        finally:
            if not lost:
                with anyio.CancelScope(shield=True), anyio.move_on_after(request_timeout_s):
                    try:
                        await locks.call("release", {"owner": owner, "token": lock.token})
                    except ClientError:
                        pass  # it expires on its own
    finally:
        with anyio.CancelScope(shield=True):
            await rest.aclose()


async def _keep(locks: _Locks, lock: HeldLock, margin: float, lost: list[str], body: anyio.CancelScope) -> None:
    """Refresh ``lock`` every third of its ttl; on loss, say why and cancel ``body``."""
    every = lock.ttl_s / 3
    next_at = anyio.current_time() + every
    while True:
        await anyio.sleep_until(next_at)
        reason = None
        # retry until the lock may have expired
        with anyio.CancelScope(deadline=lock.deadline) as scope:
            while True:
                sent_at = anyio.current_time()
                try:
                    status, info = await locks.call(
                        "refresh", {"owner": lock.owner, "token": lock.token, "ttl_s": lock.ttl_s}
                    )
                except ClientError as exc:  # (ConnectionLost included): try again
                    reason = f"refresh failed: {exc}"
                    await anyio.sleep(min(1.0, every / 4))
                    continue
                if status == 409:
                    reason = "refresh refused: " + str(info.get("message", "not the holder"))
                    break
                lock.info = info
                lock.deadline = sent_at + lock.ttl_s - margin
                reason = None
                break
        if scope.cancelled_caught:
            reason = f"no refresh got through before it would expire ({reason or 'no answer'})"
        if reason is not None:
            lost.append(reason)
            body.cancel()
            return
        next_at = anyio.current_time() + every

"""Named locks: acquire (waiting in line if asked), refresh, release, list, read
(``/locks``). See docs/coordination.md.

An acquire, refresh or release answers only once its record is durable: a fencing
token a client has seen is never handed out again, even after a crash. A refused one
(held by another, or not held by the caller) is a 409 whose body also carries the
lock as it is (``lock``: holder, expiry, waiters)."""

from __future__ import annotations

from typing import Any

import trio

from broker.api.fields import (
    LOCK_ACQUIRE_FIELDS,
    LOCK_REFRESH_FIELDS,
    LOCK_RELEASE_FIELDS,
)
from broker.api.permissions import access_for
from broker.api.rest.fields import RestContext, body_fields
from broker.api.rest.leases import wait_or_disconnect
from broker.core import LockBusy, LockGranted, NotLockHolder, Unavailable
from broker.http import ClientDisconnected, Request, Response

#: How much longer than its wait_s a parked acquire waits for the core's answer
#: (which comes on time: this is only a safety net).
_WAIT_SLACK_S = 5.0


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("POST", "/locks/{name}/acquire", acquire)
    ctx.add("POST", "/locks/{name}/refresh", refresh)
    ctx.add("POST", "/locks/{name}/release", release)
    ctx.add("GET", "/locks", list_locks)
    ctx.add("GET", "/locks/{name}", get_lock)


async def _refused(response: Response, exc: LockBusy | NotLockHolder) -> None:
    body: dict[str, Any] = dict(exc.to_json())
    body["lock"] = exc.info
    await response.send_json(exc.status, body)


async def acquire(ctx: RestContext, request: Request, response: Response) -> None:
    gateway = ctx.gateway
    gateway.check_ready()
    name = request.path_params["name"]
    access_for(request).require("lock", name)
    f = await body_fields(request, LOCK_ACQUIRE_FIELDS)
    owner = f.obj.get("owner")
    ttl_s = f.obj.get("ttl_s", 30)
    wait_s = f.obj.get("wait_s", 0)  # (the core checks all three)
    try:
        info, parked = await gateway.acquire_lock(name, owner, ttl_s, wait_s)
    except LockBusy as exc:
        await _refused(response, exc)
        return
    if parked is None:
        assert info is not None
        await response.send_json(200, info)
        return
    waiter_id, wait = parked
    present = False
    try:
        deadline = trio.current_time() + float(wait_s) + _WAIT_SLACK_S
        present = await wait_or_disconnect(request, [wait.event], deadline)
    finally:  # (also when cancelled: the broker shuts down)
        gateway.end_lock_wait(waiter_id, wait, caller_left=not present)
    if not present:
        raise ClientDisconnected("the client left while waiting for a lock")
    if wait.answer is None and gateway.shutting_down:
        raise Unavailable("the broker is shutting down", code="shutting_down")
    answer = wait.answer
    if isinstance(answer, LockGranted):
        await response.send_json(200, answer.info)
        return
    info = answer.info if answer is not None else ctx.views.lock_info(name)
    busy = LockBusy(f"lock {name!r} is still held by {info.get('owner')!r} after waiting {wait_s} s", info)
    await _refused(response, busy)


async def refresh(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    access_for(request).require("lock", name)
    f = await body_fields(request, LOCK_REFRESH_FIELDS)
    owner, token, ttl_s = f.obj.get("owner"), f.obj.get("token"), f.obj.get("ttl_s")
    try:
        info = await ctx.gateway.run_durable(lambda core: core.lock_refresh(name, owner, token, ttl_s))
    except NotLockHolder as exc:
        await _refused(response, exc)
        return
    await response.send_json(200, info)


async def release(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    access_for(request).require("lock", name)
    f = await body_fields(request, LOCK_RELEASE_FIELDS)
    owner, token = f.obj.get("owner"), f.obj.get("token")
    try:
        info = await ctx.gateway.run_durable(lambda core: core.lock_release(name, owner, token))
    except NotLockHolder as exc:
        await _refused(response, exc)
        return
    await response.send_json(200, info)


async def list_locks(ctx: RestContext, request: Request, response: Response) -> None:
    await response.send_json(200, {"locks": ctx.views.lock_infos()})


async def get_lock(ctx: RestContext, request: Request, response: Response) -> None:
    await response.send_json(200, ctx.views.lock_info(request.path_params["name"]))

"""Named locks: acquire (waiting in line if asked), refresh, release, list, read
(``/locks``). See docs/coordination.md.

An acquire, refresh or release answers only once its record is durable: a fencing
token a client has seen is never handed out again, even after a crash. A refused one
(held by another, or not held by the caller) is a 409 whose body also carries the
lock as it is (``lock``: holder, expiry, waiters)."""

from __future__ import annotations

from typing import Any

import trio

from broker.api.permissions import access_for
from broker.api.rest.fields import RestContext, body_fields
from broker.api.rest.leases import _wait_or_disconnect
from broker.core import REST_CHANNEL, LockBusy, LockGranted, NotLockHolder, Unavailable
from broker.http import ClientDisconnected

#: How much longer than its wait_s a parked acquire waits for the core's answer
#: (which comes on time: this is only a safety net).
_WAIT_SLACK_S = 5.0


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core = ctx.runtime, ctx.core

    async def refused(response: Any, exc: LockBusy | NotLockHolder) -> None:
        body: dict[str, Any] = dict(exc.to_json())
        body["lock"] = exc.info
        await response.send_json(exc.status, body)

    @ctx.route("POST", "/locks/{name}/acquire")
    async def acquire(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        access_for(request).require("lock", name)
        f = await body_fields(request, {"owner", "ttl_s", "wait_s"})
        owner = f.obj.get("owner")
        ttl_s = f.obj.get("ttl_s", 30)
        wait_s = f.obj.get("wait_s", 0)  # (the core checks all three)
        try:
            info, waiter_id = core.lock_acquire(REST_CHANNEL, name, owner, ttl_s, wait_s)
        except LockBusy as exc:
            await refused(response, exc)
            return
        if info is not None:
            await runtime.wait_durable()
            await response.send_json(200, info)
            return
        wait = runtime.lock_wait(waiter_id)
        runtime.pump()
        present = False
        try:
            deadline = trio.current_time() + float(wait_s) + _WAIT_SLACK_S
            present = await _wait_or_disconnect(request, [wait.event], deadline)
        finally:  # (also when cancelled: the broker shuts down)
            runtime.forget_lock_wait(waiter_id)
            core.lock_cancel_wait(waiter_id)
            if not present and isinstance(wait.answer, LockGranted):
                # granted as the caller left: free it for the next in line
                _release_quietly(core, wait.answer.info)
            runtime.pump()
        if not present:
            raise ClientDisconnected("the client left while waiting for a lock")
        if wait.answer is None and runtime.shutting_down:
            raise Unavailable("the broker is shutting down", code="shutting_down")
        answer = wait.answer
        if isinstance(answer, LockGranted):
            await response.send_json(200, answer.info)
            return
        info = answer.info if answer is not None else core.lock_info(name)
        busy = LockBusy(f"lock {name!r} is still held by {info.get('owner')!r} after waiting {wait_s} s", info)
        await refused(response, busy)

    @ctx.route("POST", "/locks/{name}/refresh")
    async def refresh(request: Any, response: Any) -> None:
        runtime.check_ready()
        access_for(request).require("lock", request.path_params["name"])
        f = await body_fields(request, {"owner", "token", "ttl_s"})
        try:
            info = core.lock_refresh(
                request.path_params["name"], f.obj.get("owner"), f.obj.get("token"), f.obj.get("ttl_s")
            )
        except NotLockHolder as exc:
            await refused(response, exc)
            return
        await runtime.wait_durable()
        await response.send_json(200, info)

    @ctx.route("POST", "/locks/{name}/release")
    async def release(request: Any, response: Any) -> None:
        runtime.check_ready()
        access_for(request).require("lock", request.path_params["name"])
        f = await body_fields(request, {"owner", "token"})
        try:
            info = core.lock_release(request.path_params["name"], f.obj.get("owner"), f.obj.get("token"))
        except NotLockHolder as exc:
            await refused(response, exc)
            return
        await runtime.wait_durable()
        await response.send_json(200, info)

    @ctx.route("GET", "/locks")
    async def list_locks(request: Any, response: Any) -> None:
        await response.send_json(200, {"locks": core.lock_list()})

    @ctx.route("GET", "/locks/{name}")
    async def get_lock(request: Any, response: Any) -> None:
        await response.send_json(200, core.lock_info(request.path_params["name"]))


def _release_quietly(core: Any, info: dict[str, Any]) -> None:
    try:
        core.lock_release(info["name"], info["owner"], info["token"])
    except NotLockHolder:
        pass

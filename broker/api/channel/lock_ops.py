"""The channel's lock ops (``lock_acquire``, ``lock_refresh``, ``lock_release``,
``lock_info``): held in the core on a single node, in etcd for the whole cluster
(``ClusterLocksPort``). A lock that is busy or not held is a ``refused`` event; the
channel goes on.
"""

from __future__ import annotations

from typing import Any

import trio

from broker.api.channel.opfields import echo_id, get_field, reply
from broker.api.channel.session import ServedChannel
from broker.core import ErrorReply, LockBusy, NotLockHolder
from broker.runtime import ClusterLocksPort

__all__ = ["LOCK_OPS"]


def _refused(op: dict[str, Any], exc: LockBusy | NotLockHolder) -> dict[str, Any]:
    """A ``refused`` event: the op was declined, the channel goes on."""
    return reply(op, "refused", op=op.get("op"), error=exc.code, message=exc.message, lock=exc.info)


async def _op_lock_acquire(s: ServedChannel, op: dict[str, Any]) -> None:
    """Acquire a lock: ``ok`` at once, or once it is granted after waiting in line
    (other ops go on meanwhile; the answer echoes the op's ``id``), or ``refused``."""
    echo, op_id = echo_id(op)
    name = get_field(op, "lock", str, None) or ""
    s.access.require("lock", name)
    cid = s.channel_id
    owner, ttl_s, wait_s = op.get("owner"), op.get("ttl_s", 30), op.get("wait_s", 0)
    ref = {"id": op_id} if echo else {}
    cluster = s.runtime.cluster
    if cluster is not None:  # held in etcd for the whole cluster
        s.batch.flush()
        if isinstance(wait_s, (int, float)) and not isinstance(wait_s, bool) and wait_s > 0 and s.tasks is not None:
            s.tasks.start_soon(_cluster_lock_wait, s, op, cluster.locks, (name, owner, ttl_s, wait_s))
            return  # other ops go on meanwhile, as on a single node
        try:
            granted = await cluster.locks.acquire(name, owner, ttl_s, wait_s)
        except LockBusy as exc:
            s.send_event(_refused(op, exc))
            return
        s.send_event(reply(op, "ok", op="lock_acquire", lock=granted))
        return
    try:
        info, _waiter = await s.batch.run_durable(
            lambda core: core.lock_acquire(cid, name, owner, ttl_s, wait_s, ref=ref)
        )
    except LockBusy as exc:
        s.send_event(_refused(op, exc))
        return
    if info is not None:
        s.send_event(reply(op, "ok", op="lock_acquire", lock=info))


async def _cluster_lock_wait(s: ServedChannel, op: dict[str, Any], locks: ClusterLocksPort, args: tuple[Any, ...]) -> None:
    """A cluster lock acquire that may wait, answered when it ends (its ``id`` echoed);
    a grant the channel can no longer be told of is released."""
    name, owner = args[0], args[1]
    try:
        granted = await locks.acquire(*args)
    except LockBusy as exc:
        if not s.finished:
            s.send_event(_refused(op, exc))
        return
    except ErrorReply as exc:  # etcd unreachable, a bad field: refused, the channel goes on
        if not s.finished:
            s.send_event(reply(op, "refused", op="lock_acquire", error=exc.code, message=exc.message, lock=None))
        return
    if s.finished:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await locks.release(name, owner, granted["token"])
            except ErrorReply:
                pass  # it lapses with its TTL
        return
    s.send_event(reply(op, "ok", op="lock_acquire", lock=granted))


async def _op_lock_refresh(s: ServedChannel, op: dict[str, Any]) -> None:
    name = get_field(op, "lock", str, None) or ""
    s.access.require("lock", name)
    owner, token, ttl_s = op.get("owner"), op.get("token"), op.get("ttl_s")
    cluster = s.runtime.cluster
    try:
        if cluster is not None:
            info = await cluster.locks.refresh(name, owner, token, ttl_s)
        else:
            info = await s.batch.run_durable(lambda core: core.lock_refresh(name, owner, token, ttl_s))
    except NotLockHolder as exc:
        s.send_event(_refused(op, exc))
        return
    s.send_event(reply(op, "ok", op="lock_refresh", lock=info))


async def _op_lock_release(s: ServedChannel, op: dict[str, Any]) -> None:
    name = get_field(op, "lock", str, None) or ""
    s.access.require("lock", name)
    owner, token = op.get("owner"), op.get("token")
    cluster = s.runtime.cluster
    try:
        if cluster is not None:
            info = await cluster.locks.release(name, owner, token)
        else:
            info = await s.batch.run_durable(lambda core: core.lock_release(name, owner, token))
    except NotLockHolder as exc:
        s.send_event(_refused(op, exc))
        return
    s.send_event(reply(op, "ok", op="lock_release", lock=info))


async def _op_lock_info(s: ServedChannel, op: dict[str, Any]) -> None:
    name = get_field(op, "lock", str, None) or ""
    cluster = s.runtime.cluster
    info = await cluster.locks.info(name) if cluster is not None else s.views.lock_info(name)
    s.send_event(reply(op, "ok", op="lock_info", lock=info))


#: Op name -> its handler, for ``ops.OPS``.
LOCK_OPS = {
    "lock_acquire": _op_lock_acquire,
    "lock_refresh": _op_lock_refresh,
    "lock_release": _op_lock_release,
    "lock_info": _op_lock_info,
}

"""Long-poll gets and the leases they hand out: get, ack, nack, extend
(``/queues/{name}/get`` and friends). A lease that is not acked in time returns its
message to the queue."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from broker.api.codec import message_json
from broker.api.permissions import Access, access_for
from broker.api.rest.fields import RestContext, body_fields
from broker.core import (
    AccessRefused,
    Broker,
    ErrorReply,
    InvalidArgument,
    NotFound,
    check_delay,
)
from broker.http import ClientDisconnected, Request, Response
from broker.runtime import CommandGateway


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("POST", "/queues/{name}/get", get_messages, query=frozenset({"max", "wait", "lease"}))
    ctx.add("POST", "/get", get_any)
    ctx.add("POST", "/queues/{name}/ack", ack_leases)
    ctx.add("POST", "/queues/{name}/nack", nack_leases)
    ctx.add("POST", "/queues/{name}/extend", extend_leases)


def _check_queue(ctx: RestContext, name: str) -> None:
    if not ctx.views.queue_exists(name):
        raise NotFound(f"no queue {name!r}")


async def get_messages(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    opts = ctx.options
    name = request.path_params["name"]
    access_for(request).require("get", name)
    max_count = request.query.get_int("max", 1, min_value=1, max_value=1000)
    # A longer wait is capped, not refused (docs/operations.md, max_wait_s): the
    # answer is the same as for a wait that found nothing.
    wait_s = min(request.query.get_float("wait", 0.0, min_value=0.0), opts.max_wait_s)
    lease_s = request.query.get_float("lease", opts.default_lease_s, min_value=0.001, max_value=opts.max_lease_s)
    await request.read_body()
    leases = await _long_poll(
        ctx.gateway, request, [name], wait_s, lambda core: core.get(name, max_count, lease_s)
    )
    await response.send_json(200, {"messages": leased_json(leases)})


GET_ANY_FIELDS = frozenset({"queues", "max", "wait", "lease", "weights"})


def get_any_fields(request: Request, f: Any, max_wait_s: float, default_lease_s: float) -> tuple[list[Any], int, float, float, Any]:
    """``POST /get``'s body, checked: (queues, max, wait (capped), lease, weights);
    ``get`` on every queue is required of the caller."""
    names = f.list("queues")
    access = access_for(request)
    for queue_name in names:
        if isinstance(queue_name, str):  # the core refuses the others
            access.require("get", queue_name)
    max_count = f.number("max", 1, minimum=1)
    if max_count is None or max_count != int(max_count) or max_count > 1000:
        raise InvalidArgument("field max must be an integer 1..1000")
    wait = f.number("wait", 0.0, minimum=0.0)
    lease = f.number("lease", default_lease_s, minimum=0.001)
    assert wait is not None and lease is not None
    return names, int(max_count), min(wait, max_wait_s), lease, f.obj.get("weights")


async def get_any(ctx: RestContext, request: Request, response: Response) -> None:
    """One long poll over several queues, in order of preference."""
    ctx.gateway.check_ready()
    opts = ctx.options
    f = await body_fields(request, GET_ANY_FIELDS)
    names, max_count, wait_s, lease, weights = get_any_fields(request, f, opts.max_wait_s, opts.default_lease_s)
    await response.send_json(200, await poll_any(ctx.gateway, request, names, max_count, wait_s, lease, weights))


async def poll_any(
    gateway: CommandGateway, request: Request, names: list[Any], max_count: int, wait_s: float, lease: float, weights: Any
) -> dict[str, Any]:
    """The answer of ``POST /get`` over this core's queues ``names``."""
    answered_by: str | None = None

    def take(core: Broker) -> list[tuple[str, Any, bool]]:
        nonlocal answered_by
        answered_by, got = core.get_any(names, max_count, lease, weights)
        return got

    leases = await _long_poll(gateway, request, names, wait_s, take)
    body: dict[str, Any] = {"messages": leased_json(leases)}
    if answered_by is not None:
        body["queue"] = answered_by
    return body


async def ack_leases(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    f = await body_fields(request, {"lease_ids"})
    lease_ids = f.list("lease_ids")
    access_for(request).require("settle", name)
    _check_queue(ctx, name)
    count = ctx.gateway.run(lambda core: core.ack_leases(lease_ids, queue=name))
    await response.send_json(200, {"acked": count})


async def nack_leases(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    f = await body_fields(request, {"lease_ids", "requeue", "delay_s"})
    lease_ids, requeue = f.list("lease_ids"), f.bool("requeue", True)
    delay_s = check_delay(f.obj["delay_s"]) if f.obj.get("delay_s") is not None else None
    access_for(request).require("settle", name)
    _check_queue(ctx, name)
    count = ctx.gateway.run(lambda core: core.nack_leases(lease_ids, requeue=requeue, queue=name, delay_s=delay_s))
    await response.send_json(200, {"nacked": count})


async def extend_leases(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    f = await body_fields(request, {"lease_ids", "lease"})
    lease_ids = f.list("lease_ids")
    lease_s = f.number("lease", ctx.options.default_lease_s, minimum=0.001)
    assert lease_s is not None
    access_for(request).require("settle", name)
    _check_queue(ctx, name)
    count = ctx.gateway.run(lambda core: core.extend_leases(lease_ids, lease_s, queue=name))
    await response.send_json(200, {"extended": count, "lease": lease_s})


def leased_json(leases: list[tuple[str, Any, bool]]) -> list[dict[str, Any]]:
    messages = []
    for lease_id, d, redelivered in leases:
        message = d.entry.message
        m = message_json(message, d.entry.deliveries - 1)
        m.update(
            lease_id=lease_id,
            exchange=message.exchange,
            routing_key=message.routing_key,
            redelivered=redelivered,
            queue=d.queue.name,
        )
        messages.append(m)
    return messages


class _PollGuard:
    """A parked long-poll get as its user's open session (``broker.api.auth``): wakes
    it with the error to answer when the credentials go, or ``read`` on one of its
    queues."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.error: ErrorReply | None = None
        self.event = trio.Event()

    def revoke(self, error: ErrorReply) -> None:
        self.error = error
        self.event.set()

    def recheck(self, access: Access) -> None:
        for name in self.names:
            if isinstance(name, str) and not access.allows("read", name):
                self.revoke(AccessRefused(f"read permission on queue {name!r} was revoked for user {access.username!r}"))
                return


async def _long_poll(
    gateway: CommandGateway,
    request: Request,
    names: list[str],
    wait_s: float,
    take: Callable[[Broker], list[Any]],
) -> list[Any]:
    """Run ``take`` (a core command) until it gives something or ``wait_s`` passed,
    parked between tries on every queue of ``names`` (no polling: a queue that gets
    messages wakes it; the event is set before the wait starts, so no wake-up is lost).
    Raises ClientDisconnected when the client leaves meanwhile: it must not be handed
    leases (its messages would stay invisible until the leases expired); and the
    revocation's error (CredentialsRevoked, AccessRefused) when the user's credentials
    or ``read`` go meanwhile, before taking anything more."""
    deadline = trio.current_time() + wait_s
    principal = request.principal
    guard = _PollGuard(names)
    if principal is not None:
        principal.open_session(guard)
    try:
        while True:
            if guard.error is not None:
                raise guard.error
            got = gateway.run(take)
            if got or trio.current_time() >= deadline:
                return got
            events = gateway.park_getters(names)
            events.append(guard.event)
            try:
                if not await wait_or_disconnect(request, events, deadline):
                    raise ClientDisconnected("the client left during a long-poll get")
            finally:
                gateway.unpark_getters(names)
            if guard.error is not None:
                raise guard.error
            if gateway.shutting_down:
                return got
    finally:
        if principal is not None:
            principal.close_session(guard)


async def wait_or_disconnect(request: Request, events: list[trio.Event], deadline: float) -> bool:
    """Wait for any of ``events`` until ``deadline``; return False if the client closed
    the connection first (True when an event fired or the time passed)."""
    gone = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal gone
            await request.wait_disconnected()
            gone = True
            nursery.cancel_scope.cancel()

        async def fired(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        for event in events:
            nursery.start_soon(fired, event)
        await trio.sleep_until(deadline)
        nursery.cancel_scope.cancel()
    return not gone

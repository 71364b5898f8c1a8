"""Long-poll gets and the leases they hand out: get, ack, nack, extend
(``/queues/{name}/get`` and friends). A lease that is not acked in time returns its
message to the queue."""

from __future__ import annotations

from typing import Any

import trio

from broker.api.codec import message_json
from broker.api.rest.fields import RestContext, body_fields
from broker.core import NotFound, check_delay
from broker.http import ClientDisconnected


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core, opts = ctx.runtime, ctx.core, ctx.options

    def check_queue(name: str) -> None:
        if name not in core.queues:
            raise NotFound(f"no queue {name!r}")

    @ctx.route("POST", "/queues/{name}/get", query=frozenset({"max", "wait", "lease"}))
    async def get_messages(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        max_count = request.query.get_int("max", 1, min_value=1, max_value=1000)
        # A longer wait is capped, not refused (docs/operations.md, max_wait_s): the
        # answer is the same as for a wait that found nothing.
        wait_s = min(request.query.get_float("wait", 0.0, min_value=0.0), opts.max_wait_s)
        lease_s = request.query.get_float(
            "lease", opts.default_lease_s, min_value=0.001, max_value=opts.max_lease_s
        )
        await request.read_body()
        deadline = trio.current_time() + wait_s
        while True:
            leases = core.get(name, max_count, lease_s)
            runtime.pump()
            if leases or trio.current_time() >= deadline:
                break
            # Park until a message arrives or the wait is over: no polling. Meanwhile
            # watch the connection: a client that left must not be handed leases
            # (its messages would stay invisible until the leases expired).
            event = runtime.queue_event(name)
            core.park_getter(name)
            try:
                if not await _wait_or_disconnect(request, event, deadline):
                    raise ClientDisconnected("the client left during a long-poll get")
            finally:
                core.unpark_getter(name)
            if runtime.shutting_down:
                break
        messages = []
        for lease_id, d, redelivered in leases:
            m = message_json(d.entry.message, d.entry.deliveries - 1)
            m.update(
                lease_id=lease_id,
                exchange=d.entry.message.exchange,
                routing_key=d.entry.message.routing_key,
                redelivered=redelivered,
            )
            messages.append(m)
        await response.send_json(200, {"messages": messages})

    @ctx.route("POST", "/queues/{name}/ack")
    async def ack_leases(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await body_fields(request, {"lease_ids"})
        lease_ids = f.list("lease_ids")
        check_queue(request.path_params["name"])
        count = core.ack_leases(lease_ids, queue=request.path_params["name"])
        runtime.pump()
        await response.send_json(200, {"acked": count})

    @ctx.route("POST", "/queues/{name}/nack")
    async def nack_leases(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await body_fields(request, {"lease_ids", "requeue", "delay_s"})
        lease_ids, requeue = f.list("lease_ids"), f.bool("requeue", True)
        delay_s = check_delay(f.obj["delay_s"]) if f.obj.get("delay_s") is not None else None
        check_queue(request.path_params["name"])
        count = core.nack_leases(lease_ids, requeue=requeue, queue=request.path_params["name"], delay_s=delay_s)
        runtime.pump()
        await response.send_json(200, {"nacked": count})

    @ctx.route("POST", "/queues/{name}/extend")
    async def extend_leases(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await body_fields(request, {"lease_ids", "lease"})
        lease_ids = f.list("lease_ids")
        lease_s = f.number("lease", opts.default_lease_s, minimum=0.001)
        assert lease_s is not None
        check_queue(request.path_params["name"])
        count = core.extend_leases(lease_ids, lease_s, queue=request.path_params["name"])
        runtime.pump()
        await response.send_json(200, {"extended": count, "lease": lease_s})


async def _wait_or_disconnect(request: Any, event: trio.Event, deadline: float) -> bool:
    """Wait for ``event`` until ``deadline``; return False if the client closed the
    connection first (True when the event fired or the time passed)."""
    gone = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal gone
            await request.wait_disconnected()
            gone = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        with trio.move_on_at(deadline):
            await event.wait()
        nursery.cancel_scope.cancel()
    return not gone

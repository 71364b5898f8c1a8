"""Schedules: create or replace, list, read, delete, pause and resume
(``/schedules``). See docs/coordination.md.

A schedule publishes its message (``body`` or ``body_b64``, ``properties``) to an
exchange with a routing key at every tick of its timing: ``cron`` (five fields, with a
``timezone``), ``interval_s`` (from ``start``), or one time ``at``. Changes answer once
their record is durable."""

from __future__ import annotations

from typing import Any

from broker.api.codec import body_from_json
from broker.api.permissions import access_for
from broker.api.rest.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    RestContext,
    body_fields,
    exchange_name,
)
from broker.core import (
    TIMING_FIELDS,
    InvalidArgument,
    PayloadTooLarge,
    check_properties,
)

_PUT_FIELDS = {
    "exchange", "routing_key", "body", "body_b64", "properties", "missed", "max_missed", "paused",
} | set(TIMING_FIELDS)


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core, opts = ctx.runtime, ctx.core, ctx.options

    @ctx.route("PUT", "/schedules/{name}")
    async def put_schedule(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await body_fields(request, _PUT_FIELDS)
        if "body" in f.obj and "body_b64" in f.obj:
            raise InvalidArgument("give body or body_b64, not both")
        body = body_from_json(f.obj)
        if len(body) > opts.max_body_bytes:
            raise PayloadTooLarge(f"message body over {opts.max_body_bytes} bytes")
        max_missed = f.obj.get("max_missed", 100)
        exchange = exchange_name(f.str("exchange", ""))
        access_for(request).require(
            "declare_schedule", request.path_params["name"], source=exchange or DEFAULT_EXCHANGE_ALIAS
        )
        info, changed = core.put_schedule(
            request.path_params["name"],
            exchange=exchange,
            routing_key=f.str("routing_key", ""),
            body=body,
            properties=check_properties(f.obj.get("properties")),
            timing={k: f.obj[k] for k in TIMING_FIELDS if k in f.obj},
            missed=f.str("missed", "latest"),
            max_missed=max_missed,
            paused=f.bool("paused", False),
        )
        if changed:
            await runtime.wait_durable()
        await response.send_json(200, {**info, "changed": changed})

    @ctx.route("GET", "/schedules")
    async def list_schedules(request: Any, response: Any) -> None:
        await response.send_json(200, {"schedules": core.schedule_list()})

    @ctx.route("GET", "/schedules/{name}")
    async def get_schedule(request: Any, response: Any) -> None:
        await response.send_json(200, core.schedule_info(request.path_params["name"]))

    @ctx.route("DELETE", "/schedules/{name}")
    async def delete_schedule(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        access_for(request).require("delete_schedule", name)
        core.delete_schedule(name)
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name})

    async def set_paused(request: Any, response: Any, paused: bool) -> None:
        runtime.check_ready()
        await request.read_body()
        access_for(request).require("delete_schedule", request.path_params["name"])
        info = core.pause_schedule(request.path_params["name"], paused)
        await runtime.wait_durable()
        await response.send_json(200, info)

    @ctx.route("POST", "/schedules/{name}/pause")
    async def pause(request: Any, response: Any) -> None:
        await set_paused(request, response, True)

    @ctx.route("POST", "/schedules/{name}/resume")
    async def resume(request: Any, response: Any) -> None:
        await set_paused(request, response, False)

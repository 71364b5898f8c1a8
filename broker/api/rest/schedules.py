"""Schedules: create or replace, list, read, delete, pause and resume
(``/schedules``). See docs/coordination.md.

A schedule publishes its message (``body`` or ``body_b64``, ``properties``) to an
exchange with a routing key at every tick of its timing: ``cron`` (five fields, with a
``timezone``), ``interval_s`` (from ``start``), or one time ``at``. Changes answer once
their record is durable."""

from __future__ import annotations

from broker.api.codec import body_from_json
from broker.api.permissions import access_for
from broker.api.rest.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    RestContext,
    body_fields,
    exchange_name,
)
from broker.api.userid import check_user_id
from broker.core import (
    TIMING_FIELDS,
    InvalidArgument,
    PayloadTooLarge,
    check_properties,
)
from broker.http import Request, Response

PUT_FIELDS = {
    "exchange", "routing_key", "body", "body_b64", "properties", "missed", "max_missed", "paused",
} | set(TIMING_FIELDS)


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("PUT", "/schedules/{name}", put_schedule)
    ctx.add("GET", "/schedules", list_schedules)
    ctx.add("GET", "/schedules/{name}", get_schedule)
    ctx.add("DELETE", "/schedules/{name}", delete_schedule)
    ctx.add("POST", "/schedules/{name}/pause", pause)
    ctx.add("POST", "/schedules/{name}/resume", resume)


async def put_schedule(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    opts = ctx.options
    name = request.path_params["name"]
    f = await body_fields(request, PUT_FIELDS)
    if "body" in f.obj and "body_b64" in f.obj:
        raise InvalidArgument("give body or body_b64, not both")
    body = body_from_json(f.obj)
    if len(body) > opts.max_body_bytes:
        raise PayloadTooLarge(f"message body over {opts.max_body_bytes} bytes")
    max_missed = f.obj.get("max_missed", 100)
    exchange = exchange_name(f.str("exchange", ""))
    access = access_for(request)
    access.require("declare_schedule", name, source=exchange or DEFAULT_EXCHANGE_ALIAS)
    routing_key = f.str("routing_key", "")
    properties = check_properties(f.obj.get("properties"))
    if properties is not None:  # its messages name their publisher: the schedule's maker
        check_user_id(properties.get("user_id"), access)
    timing = {k: f.obj[k] for k in TIMING_FIELDS if k in f.obj}
    missed, paused = f.str("missed", "latest"), f.bool("paused", False)
    info, changed = await ctx.gateway.run_durable(
        lambda core: core.put_schedule(
            name, exchange=exchange, routing_key=routing_key, body=body, properties=properties,
            timing=timing, missed=missed, max_missed=max_missed, paused=paused,
        )
    )
    await response.send_json(200, {**info, "changed": changed})


async def list_schedules(ctx: RestContext, request: Request, response: Response) -> None:
    await response.send_json(200, {"schedules": ctx.views.schedule_infos()})


async def get_schedule(ctx: RestContext, request: Request, response: Response) -> None:
    await response.send_json(200, ctx.views.schedule_info(request.path_params["name"]))


async def delete_schedule(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    access_for(request).require("delete_schedule", name)
    await ctx.gateway.run_durable(lambda core: core.delete_schedule(name))
    await response.send_json(200, {"deleted": name})


async def _set_paused(ctx: RestContext, request: Request, response: Response, paused: bool) -> None:
    ctx.gateway.check_ready()
    await request.read_body()
    name = request.path_params["name"]
    access_for(request).require("delete_schedule", name)
    info = await ctx.gateway.run_durable(lambda core: core.pause_schedule(name, paused))
    await response.send_json(200, info)


async def pause(ctx: RestContext, request: Request, response: Response) -> None:
    await _set_paused(ctx, request, response, True)


async def resume(ctx: RestContext, request: Request, response: Response) -> None:
    await _set_paused(ctx, request, response, False)

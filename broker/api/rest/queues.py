"""Queues: declare, delete, list, read, purge (``/queues/{name}``)."""

from __future__ import annotations

from typing import Any

from broker.api.permissions import access_for
from broker.api.rest.fields import RestContext, body_fields
from broker.api.rest.listing import LIST_QUERY, list_page
from broker.core import NotFound


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core = ctx.runtime, ctx.core

    @ctx.route("PUT", "/queues/{name}")
    async def put_queue(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        f = await body_fields(request, {"durable", "exclusive", "auto_delete", "arguments", "passive"})
        if not f.bool("passive", False):
            access_for(request).require_declare("declare_queue", name, f.obj.get("arguments"))
        queue, created = core.declare_queue(
            name,
            durable=f.bool("durable", True),
            exclusive=f.bool("exclusive", False),
            auto_delete=f.bool("auto_delete", False),
            arguments=f.dict("arguments"),
            passive=f.bool("passive", False),
        )
        if created and queue.durable:
            await runtime.wait_durable()
        await response.send_json(201 if created else 200, core.queue_info(queue))

    @ctx.route("DELETE", "/queues/{name}", query=frozenset({"if_unused", "if_empty"}))
    async def delete_queue(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        access_for(request).require("delete_queue", name)
        count = core.delete_queue(
            name,
            if_unused=request.query.get_bool("if_unused", False),
            if_empty=request.query.get_bool("if_empty", False),
        )
        runtime.pump()
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name, "messages": count})

    @ctx.route("GET", "/queues", query=LIST_QUERY)
    async def list_queues(request: Any, response: Any) -> None:
        await response.send_json(200, await list_page(core, request.query))

    @ctx.route("GET", "/queues/{name}")
    async def get_queue(request: Any, response: Any) -> None:
        name = request.path_params["name"]
        queue = core.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue {name!r}")
        await response.send_json(200, core.queue_info(queue))

    @ctx.route("POST", "/queues/{name}/purge")
    async def purge(request: Any, response: Any) -> None:
        runtime.check_ready()
        access_for(request).require("purge", request.path_params["name"])
        count = core.purge_queue(request.path_params["name"])
        runtime.pump()
        await response.send_json(200, {"purged": count})

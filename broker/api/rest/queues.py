"""Queues: declare, delete, list, read, purge (``/queues/{name}``)."""

from __future__ import annotations

from broker.api.fields import QUEUE_DECLARE_FIELDS, decode_queue_declare
from broker.api.permissions import access_for
from broker.api.rest.fields import RestContext, body_fields
from broker.api.rest.listing import LIST_QUERY, list_page
from broker.core import NotFound
from broker.http import Request, Response


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("PUT", "/queues/{name}", put_queue)
    ctx.add("DELETE", "/queues/{name}", delete_queue, query=frozenset({"if_unused", "if_empty"}))
    ctx.add("GET", "/queues", list_queues, query=LIST_QUERY)
    ctx.add("GET", "/queues/{name}", get_queue)
    ctx.add("POST", "/queues/{name}/purge", purge)


async def put_queue(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    d = decode_queue_declare(await body_fields(request, QUEUE_DECLARE_FIELDS))
    if not d.passive:
        access_for(request).require_declare("declare_queue", name, d.arguments)
    queue, created = await ctx.gateway.run_durable(
        lambda core: core.declare_queue(
            name, durable=d.durable, exclusive=d.exclusive, auto_delete=d.auto_delete,
            arguments=d.arguments, passive=d.passive,
        )
    )
    info = ctx.views.queue_info(queue.name)
    if info is None:  # pragma: no cover - an exclusive queue deleted before the answer
        raise NotFound(f"no queue {name!r}")
    await response.send_json(201 if created else 200, info)


async def delete_queue(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    access_for(request).require("delete_queue", name)
    if_unused = request.query.get_bool("if_unused", False)
    if_empty = request.query.get_bool("if_empty", False)
    count = await ctx.gateway.run_durable(
        lambda core: core.delete_queue(name, if_unused=if_unused, if_empty=if_empty)
    )
    await response.send_json(200, {"deleted": name, "messages": count})


async def list_queues(ctx: RestContext, request: Request, response: Response) -> None:
    await response.send_json(200, await list_page(ctx.views, request.query))


async def get_queue(ctx: RestContext, request: Request, response: Response) -> None:
    name = request.path_params["name"]
    info = ctx.views.queue_info(name)
    if info is None:
        raise NotFound(f"no queue {name!r}")
    await response.send_json(200, info)


async def purge(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    access_for(request).require("purge", name)
    count = ctx.gateway.run(lambda core: core.purge_queue(name))
    await response.send_json(200, {"purged": count})

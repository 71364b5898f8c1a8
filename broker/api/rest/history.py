"""The last minutes of rates and depths, for charts that do not start empty:
``GET /overview/history`` and ``GET /queues/{name}/history`` (the runtime's
``RateHistory``: a sample every 5 s, ten minutes of them)."""

from __future__ import annotations

from broker.api.rest.fields import RestContext
from broker.core import NotFound
from broker.http import Request, Response


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("GET", "/overview/history", overview_history)
    ctx.add("GET", "/queues/{name}/history", queue_history)


async def overview_history(ctx: RestContext, request: Request, response: Response) -> None:
    await response.send_json(200, ctx.gateway.runtime.history.broker_json())


async def queue_history(ctx: RestContext, request: Request, response: Response) -> None:
    name = request.path_params["name"]
    if not ctx.views.queue_exists(name):
        raise NotFound(f"no queue {name!r}")
    await response.send_json(200, ctx.gateway.runtime.history.queue_json(name))

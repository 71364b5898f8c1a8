"""An operator's view of a queue's messages: browse them without consuming them, and
redrive them out of a dead-letter queue (``/queues/{name}/messages``, ``/redrive``)."""

from __future__ import annotations

from typing import Any

from broker.api.codec import message_json
from broker.api.permissions import access_for
from broker.api.rest.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    RestContext,
    body_fields,
    exchange_name,
)
from broker.core import MAX_BROWSE, MAX_REDRIVE, InvalidArgument
from broker.http import Request, Response


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("GET", "/queues/{name}/messages", browse, query=frozenset({"limit", "after"}))
    ctx.add("POST", "/queues/{name}/redrive", redrive)


async def browse(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    access_for(request).require("browse", name)
    limit = request.query.get_int("limit", 100, min_value=1, max_value=MAX_BROWSE)
    after = request.query.get_int("after", 0, min_value=0, max_value=(1 << 63) - 1)
    # a command, not a view: reading paged-out bodies may raise an alarm (an effect)
    browsed = ctx.gateway.run(lambda core: core.browse(name, limit, after))
    messages = []
    for seq, state, entry, unreadable, due in browsed:
        item: dict[str, Any] = {"seq": seq, "state": state}
        if entry is None:
            item.update(delivery_count=0, unreadable=unreadable)
        else:
            message = entry.message
            # delivery_count: deliveries so far (an unacked one included)
            item.update(message_json(message))
            item.update(
                delivery_count=entry.deliveries,
                exchange=message.exchange,
                routing_key=message.routing_key,
                expires_at=entry.expires_at,
                enqueued_at=message.enqueued_at or None,
            )
            headers = (message.properties or {}).get("headers") or {}
            if "x-death" in headers:
                item["x_death"] = headers["x-death"]
        if due is not None:
            item["due_at"] = due
        messages.append(item)
    last = browsed[-1][0] if browsed else after
    await response.send_json(200, {"messages": messages, "next_after": last})


async def redrive(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    f = await body_fields(request, {"count", "exchange", "routing_key"})
    exchange = f.opt_str("exchange")
    # Without an exchange, messages go back to their queues through the default one.
    access_for(request).require("redrive", name, target=exchange or DEFAULT_EXCHANGE_ALIAS)
    count = f.obj.get("count", MAX_REDRIVE)
    if not isinstance(count, int) or isinstance(count, bool):
        raise InvalidArgument(f"field count must be an integer 1..{MAX_REDRIVE}")
    routing_key = f.opt_str("routing_key")
    if routing_key is not None and exchange is None:
        raise InvalidArgument("routing_key needs exchange")
    target = exchange_name(exchange) if exchange is not None else None
    moved, stopped = await ctx.gateway.run_durable(
        lambda core: core.redrive(name, count, exchange=target, routing_key=routing_key)
    )
    body: dict[str, Any] = {"moved": moved}
    if stopped is not None:
        body["stopped"] = stopped
    await response.send_json(200, body)

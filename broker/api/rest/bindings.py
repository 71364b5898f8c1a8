"""Bindings: bind, unbind, list (``/bindings``)."""

from __future__ import annotations

from broker.api.fields import (
    BINDING_FIELDS,
    DEFAULT_EXCHANGE_ALIAS,
    Binding,
    decode_binding,
)
from broker.api.permissions import access_for
from broker.api.rest.fields import RestContext, body_fields
from broker.http import Request, Response


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("POST", "/bindings", bind)
    ctx.add("DELETE", "/bindings", unbind)
    ctx.add("GET", "/bindings", list_bindings)


async def bind(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    b = decode_binding(await body_fields(request, BINDING_FIELDS))
    authorize_binding(request, "bind", b)
    created = await ctx.gateway.run_durable(
        lambda core: core.bind(b.source, b.destination, b.routing_key, b.arguments, to_exchange=b.to_exchange)
    )
    await response.send_json(201 if created else 200, {"bound": True, "created": created})


async def unbind(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    b = decode_binding(await body_fields(request, BINDING_FIELDS))
    authorize_binding(request, "unbind", b)
    await ctx.gateway.run_durable(
        lambda core: core.unbind(b.source, b.destination, b.routing_key, b.arguments, to_exchange=b.to_exchange)
    )
    await response.send_json(200, {"unbound": True})


async def list_bindings(ctx: RestContext, request: Request, response: Response) -> None:
    await response.send_json(200, {"bindings": ctx.views.bindings()})


def authorize_binding(request: Request, operation: str, b: Binding) -> None:
    """Write on the destination, read on the source (exchanges by their path names)."""
    access_for(request).require(
        operation,
        (b.destination or DEFAULT_EXCHANGE_ALIAS) if b.to_exchange else b.destination,
        source=b.source or DEFAULT_EXCHANGE_ALIAS,
    )

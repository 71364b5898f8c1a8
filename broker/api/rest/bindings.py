"""Bindings: bind, unbind, list (``/bindings``)."""

from __future__ import annotations

from typing import Any

from broker.api.permissions import access_for
from broker.api.rest.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    RestContext,
    body_fields,
    exchange_name,
)
from broker.core import InvalidArgument


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core = ctx.runtime, ctx.core

    async def binding_args(request: Any) -> tuple[str, str, str, dict[str, Any], bool]:
        f = await body_fields(request, {"exchange", "queue", "to_exchange", "routing_key", "arguments"})
        source = exchange_name(f.str("exchange"))
        queue = f.opt_str("queue")
        to_exchange = f.opt_str("to_exchange")
        if (queue is None) == (to_exchange is None):
            raise InvalidArgument("give exactly one of queue and to_exchange")
        dest = queue if queue is not None else exchange_name(to_exchange or "")
        return source, dest, f.str("routing_key", ""), f.dict("arguments"), to_exchange is not None

    @ctx.route("POST", "/bindings")
    async def bind(request: Any, response: Any) -> None:
        runtime.check_ready()
        source, dest, key, args, to_x = await binding_args(request)
        _authorize(request, "bind", source, dest, to_x)
        created = core.bind(source, dest, key, args, to_exchange=to_x)
        await runtime.wait_durable()
        await response.send_json(201 if created else 200, {"bound": True, "created": created})

    @ctx.route("DELETE", "/bindings")
    async def unbind(request: Any, response: Any) -> None:
        runtime.check_ready()
        source, dest, key, args, to_x = await binding_args(request)
        _authorize(request, "unbind", source, dest, to_x)
        core.unbind(source, dest, key, args, to_exchange=to_x)
        await runtime.wait_durable()
        await response.send_json(200, {"unbound": True})

    @ctx.route("GET", "/bindings")
    async def list_bindings(request: Any, response: Any) -> None:
        await response.send_json(200, {"bindings": core.list_bindings()})


def _authorize(request: Any, operation: str, source: str, dest: str, to_exchange: bool) -> None:
    """Write on the destination, read on the source (exchanges by their path names)."""
    access_for(request).require(
        operation,
        (dest or DEFAULT_EXCHANGE_ALIAS) if to_exchange else dest,
        source=source or DEFAULT_EXCHANGE_ALIAS,
    )

"""Exchanges: declare, delete, list, read, and publish to one (``/exchanges``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.api.codec import properties_from_headers
from broker.api.permissions import access_for
from broker.api.rest.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    RestContext,
    body_fields,
    exchange_name,
)
from broker.core import (
    EXCHANGE_TYPES,
    MAX_DELAY_S,
    AccessRefused,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
)


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core, opts = ctx.runtime, ctx.core, ctx.options

    @ctx.route("PUT", "/exchanges/{name}")
    async def put_exchange(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = exchange_name(request.path_params["name"])
        f = await body_fields(request, {"type", "durable", "auto_delete", "internal", "arguments", "passive"})
        if not f.bool("passive", False):
            access_for(request).require_declare(
                "declare_exchange", name or DEFAULT_EXCHANGE_ALIAS, f.obj.get("arguments")
            )
        etype = f.str("type", "direct")
        if etype not in EXCHANGE_TYPES:
            raise InvalidArgument(f"type must be one of {', '.join(EXCHANGE_TYPES)}")
        exchange, created = core.declare_exchange(
            name,
            etype,
            durable=f.bool("durable", True),
            auto_delete=f.bool("auto_delete", False),
            internal=f.bool("internal", False),
            arguments=f.dict("arguments"),
            passive=f.bool("passive", False),
        )
        if created and exchange.durable:
            await runtime.wait_durable()
        await response.send_json(201 if created else 200, _exchange_info(exchange))

    @ctx.route("DELETE", "/exchanges/{name}", query=frozenset({"if_unused"}))
    async def delete_exchange(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = exchange_name(request.path_params["name"])
        access_for(request).require("delete_exchange", name or DEFAULT_EXCHANGE_ALIAS)
        core.delete_exchange(name, if_unused=request.query.get_bool("if_unused", False))
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name or DEFAULT_EXCHANGE_ALIAS})

    @ctx.route("GET", "/exchanges")
    async def list_exchanges(request: Any, response: Any) -> None:
        await response.send_json(
            200, {"exchanges": [_exchange_info(x) for x in core.exchanges.values()]}
        )

    @ctx.route("GET", "/exchanges/{name}")
    async def get_exchange(request: Any, response: Any) -> None:
        name = exchange_name(request.path_params["name"])
        exchange = core.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange {name!r}")
        info = _exchange_info(exchange)
        info["bindings"] = [b for b in core.list_bindings() if b["exchange"] == name]
        await response.send_json(200, info)

    @ctx.route("POST", "/exchanges/{name}/publish", query=frozenset({"routing_key", "mandatory", "delay"}))
    async def publish(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = exchange_name(request.path_params["name"])
        access_for(request).require("publish", name or DEFAULT_EXCHANGE_ALIAS)
        routing_key = request.query.get_str("routing_key", "")  # the core checks it
        mandatory = request.query.get_bool("mandatory", False)
        delay_s = request.query.get_float("delay", 0.0, min_value=0.0, max_value=MAX_DELAY_S) or None
        properties = properties_from_headers(_utf8_headers(request.headers.items()))
        body = await request.read_body()
        if len(body) > opts.max_body_bytes:  # pragma: no cover - the server enforces it first
            raise PayloadTooLarge(f"message body over {opts.max_body_bytes} bytes")
        exchange = core.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange {name!r}")
        if exchange.internal:
            # The core would nack it, but no retry can succeed: a client error, not 503.
            raise AccessRefused(f"exchange {name!r} is internal: publish to it is refused")
        ack, reason, routed, returned = await runtime.publish_and_confirm(
            name, routing_key, body, properties, mandatory, delay_s
        )
        if not ack:
            await response.send_json(
                503,
                {
                    "error": "nack",
                    "message": f"message not taken: {reason}",
                    "confirm": "nack",
                    "reason": reason or "",
                },
            )
            return
        if returned:
            await response.send_json(
                404,
                {
                    "error": "no_route",
                    "message": f"mandatory message is unroutable: no queue is bound to "
                    f"exchange {name or DEFAULT_EXCHANGE_ALIAS!r} for routing key {routing_key!r}",
                    "confirm": "ack",
                    "routed": 0,
                },
            )
            return
        await response.send_json(200, {"confirm": "ack", "routed": routed})


def _utf8_headers(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Header values as UTF-8 text. HTTP hands over bytes (decoded as Latin-1 by the
    server, RFC 9110 section 5.5 "obs-text"); curl and every client library send
    ``-H 'X-Header-City: Zürich'`` as UTF-8, and property values are UTF-8 strings.
    Only the headers that can carry properties (``Content-*``, ``X-*``) are checked."""
    out = []
    for name, value in items:
        if not value.isascii() and name.startswith(("x-", "content-")):
            try:
                value = value.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(f"header {name} is not valid UTF-8") from None
        out.append((name, value))
    return out


def _exchange_info(exchange: Any) -> dict[str, Any]:
    info: dict[str, Any] = exchange.info()
    if info["name"] == "":
        info["name"] = DEFAULT_EXCHANGE_ALIAS
    return info

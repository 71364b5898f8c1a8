"""Exchanges: declare, delete, list, read, and publish to one (``/exchanges``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import trio

from broker.api.codec import properties_from_headers
from broker.api.errors import nack_retry_after_s, retry_after
from broker.api.fields import (
    EXCHANGE_DECLARE_FIELDS,
    deadline_ms,
    decode_exchange_declare,
)
from broker.api.permissions import access_for
from broker.api.rest.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    RestContext,
    body_fields,
    exchange_name,
)
from broker.api.userid import check_user_id
from broker.core import MAX_DELAY_S, InvalidArgument, NotFound, PayloadTooLarge
from broker.http import Request, Response


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("PUT", "/exchanges/{name}", put_exchange)
    ctx.add("DELETE", "/exchanges/{name}", delete_exchange, query=frozenset({"if_unused"}))
    ctx.add("GET", "/exchanges", list_exchanges)
    ctx.add("GET", "/exchanges/{name}", get_exchange)
    ctx.add("POST", "/exchanges/{name}/publish", publish, query=frozenset({"routing_key", "mandatory", "delay"}))


async def put_exchange(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = exchange_name(request.path_params["name"])
    d = decode_exchange_declare(await body_fields(request, EXCHANGE_DECLARE_FIELDS))
    if not d.passive:
        access_for(request).require_declare("declare_exchange", name or DEFAULT_EXCHANGE_ALIAS, d.arguments)
    exchange, created = await ctx.gateway.run_durable(
        lambda core: core.declare_exchange(
            name, d.type, durable=d.durable, auto_delete=d.auto_delete, internal=d.internal,
            arguments=d.arguments, passive=d.passive,
        )
    )
    await response.send_json(201 if created else 200, _exchange_json(exchange.info()))


async def delete_exchange(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = exchange_name(request.path_params["name"])
    access_for(request).require("delete_exchange", name or DEFAULT_EXCHANGE_ALIAS)
    if_unused = request.query.get_bool("if_unused", False)
    await ctx.gateway.run_durable(lambda core: core.delete_exchange(name, if_unused=if_unused))
    await response.send_json(200, {"deleted": name or DEFAULT_EXCHANGE_ALIAS})


async def list_exchanges(ctx: RestContext, request: Request, response: Response) -> None:
    await response.send_json(200, {"exchanges": [_exchange_json(x) for x in ctx.views.exchange_infos()]})


async def get_exchange(ctx: RestContext, request: Request, response: Response) -> None:
    name = exchange_name(request.path_params["name"])
    info = ctx.views.exchange_info(name)
    if info is None:
        raise NotFound(f"no exchange {name!r}")
    await response.send_json(200, _exchange_json(info))


async def publish(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    opts = ctx.options
    name = exchange_name(request.path_params["name"])
    access = access_for(request)
    access.require("publish", name or DEFAULT_EXCHANGE_ALIAS)
    routing_key = request.query.get_str("routing_key", "")  # the core checks it
    mandatory = request.query.get_bool("mandatory", False)
    delay_s = request.query.get_float("delay", 0.0, min_value=0.0, max_value=MAX_DELAY_S) or None
    properties = properties_from_headers(_utf8_headers(request.headers.items()))
    if properties is not None:
        check_user_id(properties.get("user_id"), access)
    deadline_header = request.headers.get("x-deadline-ms")
    deadline = None
    if deadline_header is not None:
        deadline = trio.current_time() + deadline_ms(deadline_header, "header X-Deadline-Ms") / 1000
    body = await request.read_body()
    if len(body) > opts.max_body_bytes:  # pragma: no cover - the server enforces it first
        raise PayloadTooLarge(f"message body over {opts.max_body_bytes} bytes")
    outcome = await ctx.gateway.publish_and_confirm(
        name, routing_key, body, properties, mandatory=mandatory, delay_s=delay_s, deadline=deadline
    )
    refusal = outcome.refusal()
    if refusal is not None:
        # A missing or internal exchange: no retry can succeed, a client error (the
        # same code a channel's nack carries), not 503.
        raise refusal
    if not outcome.ack:
        reason = outcome.reason
        # Refused while publishing is blocked (memory or disk alarm), or by the cluster
        # for a passing reason (an owner down, a quorum queue without a leader or
        # below its majority): when to try again.
        retry_s = outcome.retry_after_s if outcome.retry_after_s is not None else nack_retry_after_s(reason)
        retry = retry_after(retry_s) if retry_s is not None else None
        await response.send_json(
            503,
            {"error": "nack", "message": f"message not taken: {reason}", "confirm": "nack", "reason": reason or ""},
            headers=retry,
        )
        return
    if outcome.returned:
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
    await response.send_json(200, {"confirm": "ack", "routed": outcome.routed})


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


def _exchange_json(info: dict[str, Any]) -> dict[str, Any]:
    """An exchange's info with the default exchange under its path name."""
    if info["name"] == "":
        info["name"] = DEFAULT_EXCHANGE_ALIAS
    return info

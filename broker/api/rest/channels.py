"""Who is connected: list the open channels and streaming consumers, and close one
(``/channels``).

In ackbus a channel is one long-lived HTTP exchange (``POST /channel``) and a
streaming consume (``GET /queues/{name}/stream``) holds one too; both appear here, by
the id the core gave them, with the client's address, their consumers, unacked
deliveries, prefetch and counters. The counters only grow (publishes, deliveries), so
a client turns two samples into rates, as RabbitMQ's management UI does.

Closing one (``DELETE /channels/{id}``) is RabbitMQ's "force close" of a connection:
the broker tells the client why (a ``closing`` event, as at shutdown), stops reading
its operations, lets the publishes it already took get their confirms, and ends the
exchange; its unacked deliveries go back to their queues, marked redelivered.
"""

from __future__ import annotations

from typing import Any

from broker.api.permissions import access_for
from broker.api.rest.fields import RestContext, body_fields
from broker.core import InvalidArgument, NotFound
from broker.http import Request, Response

#: The reason a closed client is given when the operator gives none.
DEFAULT_CLOSE_REASON = "closed by an operator"
MAX_REASON_CHARS = 200


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("GET", "/channels", list_channels)
    ctx.add("GET", "/channels/{id}", get_channel)
    ctx.add("DELETE", "/channels/{id}", close_channel)


def _channel_info(ctx: RestContext, channel_id: int, sink: Any) -> dict[str, Any] | None:
    """The core's view of the channel, and who opened it (its sink knows)."""
    core_info = ctx.views.channel_info(channel_id)
    if core_info is None:
        return None
    info: dict[str, Any] = {
        "id": channel_id,
        "kind": getattr(sink, "kind", "channel"),
        "remote": getattr(sink, "remote", None),
        "user_agent": getattr(sink, "user_agent", None),
        # the name an AMQP client gave its connection (client property connection_name)
        "connection_name": getattr(sink, "connection_name", None),
        # who opened it, when the broker has users (the session's principal)
        "user": getattr(getattr(sink, "principal", None), "username", None),
        "opened_at": getattr(sink, "opened_at", None),
    }
    info.update(core_info)
    return info


def _channel_id(request: Request) -> int:
    text = request.path_params["id"]
    if not text.isdigit() or len(text) > 18:
        raise InvalidArgument(f"channel id must be a positive integer: {text[:40]!r}")
    return int(text)


async def list_channels(ctx: RestContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    channels = [info for cid, sink in ctx.gateway.sinks() if (info := _channel_info(ctx, cid, sink)) is not None]
    await response.send_json(200, {"channels": channels})


async def get_channel(ctx: RestContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    cid = _channel_id(request)
    sink = ctx.gateway.sink(cid)
    info = _channel_info(ctx, cid, sink) if sink is not None else None
    if info is None:
        raise NotFound(f"no open channel {cid}")
    await response.send_json(200, info)


async def close_channel(ctx: RestContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    cid = _channel_id(request)
    f = await body_fields(request, {"reason"})
    reason = f.str("reason", DEFAULT_CLOSE_REASON)
    if not reason or len(reason) > MAX_REASON_CHARS:
        raise InvalidArgument(f"reason must be 1..{MAX_REASON_CHARS} characters")
    if ctx.gateway.sink(cid) is None or not ctx.views.channel_exists(cid):
        raise NotFound(f"no open channel {cid}")
    # The shutdown path, for one channel: say why, then stop taking operations.
    ctx.gateway.close_sink(cid, reason)
    await response.send_json(200, {"closed": cid, "reason": reason})

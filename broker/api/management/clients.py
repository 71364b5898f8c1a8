"""Who is connected, in RabbitMQ's shapes: ``/api/connections`` and
``/api/connections/{name}``, ``/api/channels`` and ``/api/channels/{name}``,
``/api/consumers`` (and ``/api/consumers/%2F``).

ackbus's clients are AMQP connections (each with its channels), HTTP channels
(``POST /channel``: one long exchange, listed as a connection with one channel) and
streaming consumes (likewise). Each open one is a sink of the runtime's; the
AMQP channels of one connection share its session, which is how they are grouped.
As ackbus's ``GET /channels``, these need the ``administrator`` tag.

In a cluster each node lists its own clients (``cluster.py`` merges them): the
channels another node opened here for its clients (a relayed consumer, forwarded
publishes) are the cluster's plumbing, not connections, and are left out of the
connections and channels (the client's own connection is listed on its node).
"""

from __future__ import annotations

from typing import Any

from broker.api.management.context import VHOST, ManagementContext
from broker.api.management.errors import ObjectNotFound
from broker.api.management.node import node_name
from broker.api.management.paging import listed
from broker.api.permissions import access_for
from broker.http import Request, Response

#: RabbitMQ's protocol names, by ackbus's kind of sink.
_PROTOCOLS = {"amqp": "AMQP 0-9-1", "channel": "HTTP channel", "stream": "HTTP stream"}


def add_routes(ctx: ManagementContext) -> None:
    """Register this family's endpoints."""
    ctx.add("GET", "/connections", list_connections)
    ctx.add("GET", "/connections/{name}", get_connection)
    ctx.add("GET", "/channels", list_channels)
    ctx.add("GET", "/channels/{name}", get_channel)
    ctx.add("GET", "/consumers", list_consumers)
    ctx.add("GET", "/consumers/{vhost}", list_consumers)


def _peer(remote: str | None) -> tuple[str | None, int | None]:
    if not remote:
        return None, None
    host, _sep, port = remote.rpartition(":")
    return host.strip("[]") or None, int(port) if port.isascii() and port.isdigit() else None


def _user(sink: Any) -> str:
    return getattr(getattr(sink, "principal", None), "username", None) or ""


def _connection_name(sink: Any) -> str:
    remote = getattr(sink, "remote", None) or "local"
    kind = getattr(sink, "kind", "channel")
    # an AMQP connection is its session; an HTTP channel or stream, the sink itself
    return f"{remote} ({kind} {id(getattr(sink, 'session', sink)):x})"


def _open_sinks(ctx: ManagementContext) -> list[tuple[int, Any, dict[str, Any]]]:
    """(core channel id, sink, the core's view of it) of every open channel."""
    out = []
    for channel_id, sink in ctx.gateway.sinks():
        info = ctx.views.channel_info(channel_id)
        if info is not None:
            out.append((channel_id, sink, info))
    return out


def connection_count(ctx: ManagementContext) -> int:
    """Open client connections: AMQP connections, HTTP channels and streams."""
    return len({_connection_name(sink) for _cid, sink, _info in _client_sinks(ctx)})


def _channel_name(sink: Any, channel_id: int) -> str:
    number = getattr(sink, "number", 1)
    return f"{_connection_name(sink)} ({number})"


def _client_sinks(ctx: ManagementContext) -> list[tuple[int, Any, dict[str, Any]]]:
    """The open channels of this node's clients: not those another node opened here
    (``forwarded``: relays of its clients' consumers, its forwarded publishes)."""
    return [(cid, sink, info) for cid, sink, info in _open_sinks(ctx) if not getattr(sink, "forwarded", False)]


def connections_json(ctx: ManagementContext) -> list[dict[str, Any]]:
    """This node's client connections in RabbitMQ's shape."""
    node = node_name(ctx.runtime)
    connections: dict[str, dict[str, Any]] = {}
    for _channel_id, sink, _info in _client_sinks(ctx):
        name = _connection_name(sink)
        found = connections.get(name)
        if found is not None:
            found["channels"] += 1
            continue
        host, port = _peer(getattr(sink, "remote", None))
        connection: dict[str, Any] = {
            "name": name,
            "node": node,
            "vhost": VHOST,
            "user": _user(sink),
            "protocol": _PROTOCOLS.get(getattr(sink, "kind", ""), "HTTP channel"),
            "peer_host": host,
            "peer_port": port,
            "state": "running",
            "channels": 1,
            "client_properties": {},
        }
        product = getattr(sink, "user_agent", None)
        if product:
            connection["client_properties"]["product"] = product
        connection_name = getattr(sink, "connection_name", None)
        if connection_name:
            connection["client_properties"]["connection_name"] = connection_name
        opened_at = getattr(sink, "opened_at", None)
        if opened_at is not None:
            connection["connected_at"] = int(opened_at * 1000)
        connections[name] = connection
    return list(connections.values())


async def list_connections(ctx: ManagementContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    await response.send_json(200, listed(connections_json(ctx), request.query))


async def get_connection(ctx: ManagementContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    # (RabbitMQ answers one connection or channel whole: no columns)
    await response.send_json(200, _named(connections_json(ctx), request, "connection"))


def _named(items: list[dict[str, Any]], request: Request, kind: str) -> dict[str, Any]:
    """The item named by the path's ``name``; ObjectNotFound (404) if none is."""
    wanted = request.path_params["name"]
    for item in items:
        if item.get("name") == wanted:
            return item
    raise ObjectNotFound(f"no {kind} {wanted!r}")


def _channel_json(sink: Any, channel_id: int, info: dict[str, Any], node: str) -> dict[str, Any]:
    host, port = _peer(getattr(sink, "remote", None))
    return {
        "name": _channel_name(sink, channel_id),
        "number": getattr(sink, "number", 1),
        "node": node,
        "vhost": VHOST,
        "user": _user(sink),
        "connection_details": {"name": _connection_name(sink), "peer_host": host, "peer_port": port},
        "consumer_count": len(info["consumers"]),
        "messages_unacknowledged": info["unacked"],
        # RabbitMQ's per-consumer default (basic.qos, global=false) and channel-wide limit
        "prefetch_count": info["default_prefetch"] or 0,
        "global_prefetch_count": info["prefetch"] or 0,
        "confirm": bool(getattr(sink, "confirm", False)),
        "transactional": info["transactional"],
        "state": "running",
    }


def channels_json(ctx: ManagementContext) -> list[dict[str, Any]]:
    """This node's clients' channels in RabbitMQ's shape."""
    node = node_name(ctx.runtime)
    return [_channel_json(sink, cid, info, node) for cid, sink, info in _client_sinks(ctx)]


async def list_channels(ctx: ManagementContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    await response.send_json(200, listed(channels_json(ctx), request.query))


async def get_channel(ctx: ManagementContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    await response.send_json(200, _named(channels_json(ctx), request, "channel"))


async def list_consumers(ctx: ManagementContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    items = []
    for channel_id, sink, info in _open_sinks(ctx):
        host, port = _peer(getattr(sink, "remote", None))
        details = {
            "name": _channel_name(sink, channel_id),
            "number": getattr(sink, "number", 1),
            "connection_name": _connection_name(sink),
            "peer_host": host,
            "peer_port": port,
            "user": _user(sink),
            "node": node_name(ctx.runtime),
        }
        for consumer in info["consumers"]:
            items.append({
                "consumer_tag": consumer["consumer_tag"],
                "queue": {"name": consumer["queue"], "vhost": VHOST},
                "channel_details": details,
                "ack_required": not consumer["no_ack"],
                "exclusive": consumer["exclusive"],
                "prefetch_count": consumer["prefetch"] or 0,
                "active": True,
                "activity_status": "up",
                "arguments": {},
            })
    await response.send_json(200, listed(items, request.query))

"""The declares and deletes ``rabbitmqadmin`` and ops scripts make: queues, exchanges,
bindings, and a queue's purge (``DELETE /api/queues/%2F/{name}/contents``).

Each goes through the same permission check as ackbus's own REST route
(``broker/api/rest/queues.py``, ``exchanges.py``, ``bindings.py``) and the command
gateway's metadata calls (``declare_queue``, ``bind`` ...: the core's command, and in
cluster mode the change in etcd, as for an AMQP declare), and answers once what it
logged is durable. The answers are RabbitMQ's: ``201`` for a declare that created,
``204`` for one that found its twin, ``204`` for a delete; ``201`` with a
``Location`` for a binding.
RabbitMQ's defaults apply (a queue or exchange declared without ``durable`` is
transient, as RabbitMQ makes it; ackbus's own API makes it durable).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote

from broker.api.management.body import known_fields
from broker.api.management.context import ManagementContext
from broker.api.management.errors import ObjectNotFound
from broker.api.management.reading import (
    DEFAULT_EXCHANGE_PATH,
    all_bindings,
    exchange_path_name,
)
from broker.api.management.shapes import properties_key
from broker.api.permissions import access_for
from broker.core import REST_CHANNEL, InvalidArgument
from broker.http import Request, Response

#: The body keys each declare reads (others are ignored, as RabbitMQ does).
QUEUE_KEYS: Final = frozenset({"durable", "auto_delete", "exclusive", "arguments"})
EXCHANGE_KEYS: Final = frozenset({"type", "durable", "auto_delete", "internal", "arguments"})
BINDING_KEYS: Final = frozenset({"routing_key", "arguments"})


def add_routes(ctx: ManagementContext) -> None:
    """Register this family's endpoints."""
    ctx.add("PUT", "/queues/{vhost}/{name}", put_queue)
    ctx.add("DELETE", "/queues/{vhost}/{name}", delete_queue)
    ctx.add("DELETE", "/queues/{vhost}/{name}/contents", purge_queue)
    ctx.add("PUT", "/exchanges/{vhost}/{name}", put_exchange)
    ctx.add("DELETE", "/exchanges/{vhost}/{name}", delete_exchange)
    ctx.add("POST", "/bindings/{vhost}/e/{source}/q/{destination}", bind_queue)
    ctx.add("POST", "/bindings/{vhost}/e/{source}/e/{destination}", bind_exchange)
    ctx.add("GET", "/bindings/{vhost}/e/{source}/q/{destination}", list_pair_queue)
    ctx.add("GET", "/bindings/{vhost}/e/{source}/e/{destination}", list_pair_exchange)
    ctx.add("DELETE", "/bindings/{vhost}/e/{source}/q/{destination}/{props}", unbind_queue)
    ctx.add("DELETE", "/bindings/{vhost}/e/{source}/e/{destination}/{props}", unbind_exchange)


def _flag(request: Request, name: str) -> bool:
    """A RabbitMQ query flag (``?if-empty=true``): present and not ``false``."""
    value = request.query.get_str(name, "")
    return value not in ("", "false")


async def put_queue(ctx: ManagementContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    f = await known_fields(request, QUEUE_KEYS)
    durable = f.bool("durable", False)
    auto_delete = f.bool("auto_delete", False)
    exclusive = f.bool("exclusive", False)
    arguments = f.dict("arguments")
    if exclusive:
        # an exclusive queue belongs to a connection; the API's request has none
        raise InvalidArgument("exclusive queues cannot be declared through the management API")
    access_for(request).require_declare("declare_queue", name, arguments)
    _name, created = await ctx.gateway.declare_queue(
        REST_CHANNEL, name, durable=durable, exclusive=False, auto_delete=auto_delete, arguments=arguments,
        passive=False,
    )
    await response.send_empty(201 if created else 204)


async def delete_queue(ctx: ManagementContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    access_for(request).require("delete_queue", name)
    if not ctx.gateway.queue_exists(name):
        raise ObjectNotFound(f"no queue {name!r}")
    if_unused, if_empty = _flag(request, "if-unused"), _flag(request, "if-empty")
    await ctx.gateway.delete_queue(REST_CHANNEL, name, if_unused=if_unused, if_empty=if_empty)
    await response.send_empty(204)


async def purge_queue(ctx: ManagementContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    access_for(request).require("purge", name)
    if not ctx.views.queue_exists(name):
        raise ObjectNotFound(f"no queue {name!r}")
    ctx.gateway.run(lambda core: core.purge_queue(name))
    await response.send_empty(204)


async def put_exchange(ctx: ManagementContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = exchange_path_name(request.path_params["name"])
    f = await known_fields(request, EXCHANGE_KEYS)
    kind = f.str("type", "direct")
    durable = f.bool("durable", False)
    auto_delete = f.bool("auto_delete", False)
    internal = f.bool("internal", False)
    arguments = f.dict("arguments")
    access_for(request).require_declare("declare_exchange", name or DEFAULT_EXCHANGE_PATH, arguments)
    _name, created = await ctx.gateway.declare_exchange(
        name, kind, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments, passive=False
    )
    await response.send_empty(201 if created else 204)


async def delete_exchange(ctx: ManagementContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = exchange_path_name(request.path_params["name"])
    access_for(request).require("delete_exchange", name or DEFAULT_EXCHANGE_PATH)
    if not ctx.views.exchange_exists(name):
        raise ObjectNotFound(f"no exchange {name!r}")
    if_unused = _flag(request, "if-unused")
    await ctx.gateway.delete_exchange(name, if_unused=if_unused)
    await response.send_empty(204)


async def _bind(ctx: ManagementContext, request: Request, response: Response, to_exchange: bool) -> None:
    ctx.gateway.check_ready()
    source = exchange_path_name(request.path_params["source"])
    destination = request.path_params["destination"]
    if to_exchange:
        destination = exchange_path_name(destination)
    f = await known_fields(request, BINDING_KEYS)
    routing_key = f.str("routing_key", "")
    arguments = f.dict("arguments")
    access_for(request).require(
        "bind", (destination or DEFAULT_EXCHANGE_PATH) if to_exchange else destination,
        source=source or DEFAULT_EXCHANGE_PATH,
    )
    await ctx.gateway.bind(REST_CHANNEL, source, destination, routing_key, arguments, to_exchange=to_exchange)
    # RabbitMQ's Location: the new binding's properties key, relative to the request
    location = quote(properties_key(routing_key, arguments), safe="")
    path_dest = quote(request.path_params["destination"], safe="")
    await response.send_empty(201, headers=[("location", f"{path_dest}/{location}")])


async def bind_queue(ctx: ManagementContext, request: Request, response: Response) -> None:
    await _bind(ctx, request, response, to_exchange=False)


async def bind_exchange(ctx: ManagementContext, request: Request, response: Response) -> None:
    await _bind(ctx, request, response, to_exchange=True)


def _pair(ctx: ManagementContext, request: Request, to_exchange: bool) -> list[dict[str, object]]:
    """The bindings from the path's source to its destination (404 if either is missing)."""
    source = exchange_path_name(request.path_params["source"])
    destination = request.path_params["destination"]
    if to_exchange:
        destination = exchange_path_name(destination)
    if not ctx.views.exchange_exists(source):
        raise ObjectNotFound(f"no exchange {source!r}")
    if not (ctx.views.exchange_exists(destination) if to_exchange else ctx.views.queue_exists(destination)):
        raise ObjectNotFound(f"no {'exchange' if to_exchange else 'queue'} {destination!r}")
    kind = "exchange" if to_exchange else "queue"
    return [
        b for b in all_bindings(ctx)
        if b["source"] == source and b["destination"] == destination and b["destination_type"] == kind
    ]


async def list_pair_queue(ctx: ManagementContext, request: Request, response: Response) -> None:
    await response.send_json(200, _pair(ctx, request, False))


async def list_pair_exchange(ctx: ManagementContext, request: Request, response: Response) -> None:
    await response.send_json(200, _pair(ctx, request, True))


async def _unbind(ctx: ManagementContext, request: Request, response: Response, to_exchange: bool) -> None:
    ctx.gateway.check_ready()
    props = request.path_params["props"]
    matching = [b for b in _pair(ctx, request, to_exchange) if b["properties_key"] == props]
    if not matching or matching[0]["source"] == "":
        # (the default exchange's bindings cannot be removed: RabbitMQ says 404 too)
        raise ObjectNotFound(f"no binding {props!r}")
    binding = matching[0]
    source, destination = str(binding["source"]), str(binding["destination"])
    routing_key = str(binding["routing_key"])
    arguments = binding["arguments"]
    assert isinstance(arguments, dict)
    access_for(request).require(
        "unbind", (destination or DEFAULT_EXCHANGE_PATH) if to_exchange else destination,
        source=source or DEFAULT_EXCHANGE_PATH,
    )
    await ctx.gateway.bind(
        REST_CHANNEL, source, destination, routing_key, arguments, to_exchange=to_exchange, unbind=True
    )
    await response.send_empty(204)


async def unbind_queue(ctx: ManagementContext, request: Request, response: Response) -> None:
    await _unbind(ctx, request, response, to_exchange=False)


async def unbind_exchange(ctx: ManagementContext, request: Request, response: Response) -> None:
    await _unbind(ctx, request, response, to_exchange=True)

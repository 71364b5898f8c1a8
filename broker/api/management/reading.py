"""The monitoring reads: ``/api/overview``, ``/api/nodes``, ``/api/vhosts``,
``/api/whoami``, ``/api/queues``, ``/api/exchanges``, ``/api/bindings`` (and their
``/%2F`` and per-object forms).

Each reads the core through its views only, as ackbus's own ``GET`` routes do, and
needs what they need: an authenticated user (any, as for ``GET /queues``), nothing
more. A list is built in slices with a trio checkpoint between them, so a dashboard
polling thousands of queues never holds up publishes and deliveries for long.
"""

from __future__ import annotations

from typing import Any, Final

from trio.lowlevel import checkpoint

from broker import __version__
from broker.api.management.clients import connection_count
from broker.api.management.context import VHOST, ManagementContext
from broker.api.management.errors import ObjectNotFound
from broker.api.management.node import node_json, node_name
from broker.api.management.ownpart import (
    own_queue_names,
    own_queue_totals,
    serves_queue,
)
from broker.api.management.paging import listed, shown
from broker.api.management.rates import broker_rates, queue_rates
from broker.api.management.shapes import (
    binding_json,
    default_bindings,
    exchange_json,
    message_counts,
    queue_json,
    rate,
)
from broker.api.permissions import access_for
from broker.core import EXCHANGE_TYPES
from broker.http import Request, Response

#: Queues turned into JSON between two trio checkpoints.
QUEUES_PER_SLICE: Final = 100
#: The default exchange's name in paths.
DEFAULT_EXCHANGE_PATH: Final = "amq.default"


def add_routes(ctx: ManagementContext) -> None:
    """Register this family's endpoints."""
    ctx.add("GET", "/overview", overview)
    ctx.add("GET", "/nodes", list_nodes)
    ctx.add("GET", "/nodes/{name}", get_node)
    ctx.add("GET", "/vhosts", list_vhosts)
    ctx.add("GET", "/vhosts/{vhost}", get_vhost)
    ctx.add("GET", "/whoami", whoami)
    ctx.add("GET", "/queues", list_queues)
    ctx.add("GET", "/queues/{vhost}", list_queues)
    # Flower asks for the default vhost's queues as /api/queues/ (its "/" joined to
    # the URL): RabbitMQ answers every queue there
    ctx.add("GET", "/queues/", list_queues)
    ctx.add("GET", "/queues/{vhost}/{name}", get_queue)
    ctx.add("GET", "/queues/{vhost}/{name}/bindings", queue_bindings)
    ctx.add("GET", "/exchanges", list_exchanges)
    ctx.add("GET", "/exchanges/{vhost}", list_exchanges)
    ctx.add("GET", "/exchanges/{vhost}/{name}", get_exchange)
    ctx.add("GET", "/bindings", list_bindings)
    ctx.add("GET", "/bindings/{vhost}", list_bindings)


def exchange_path_name(name: str) -> str:
    """The core's name of the exchange a path names (``amq.default``: ``""``)."""
    return "" if name == DEFAULT_EXCHANGE_PATH else name


def _message_stats(views: Any, rates: dict[str, float]) -> dict[str, Any]:
    stats = views.stats()
    return {
        "publish": stats["published"],
        "publish_details": rate(rates.get("published", 0.0)),
        "deliver_get": stats["delivered"],
        "deliver_get_details": rate(rates.get("delivered", 0.0)),
        "ack": stats["acked"],
        "ack_details": rate(rates.get("acked", 0.0)),
        "confirm": stats["confirmed"],
        "confirm_details": rate(rates.get("confirmed", 0.0)),
        "return_unroutable": stats["returned"],
    }


def _queue_numbers(ctx: ManagementContext) -> tuple[dict[str, int], dict[str, float]]:
    """The core's totals and the broker's rates; in a cluster, the queue numbers
    among them over the queues this node serves (its part: cluster.py merges)."""
    totals = ctx.views.totals()
    rates = broker_rates(ctx.runtime.history)
    own = own_queue_totals(ctx)
    if own is not None:
        totals.update(own[0])
        rates.update(own[1])
    return totals, rates


async def overview(ctx: ManagementContext, request: Request, response: Response) -> None:
    views = ctx.views
    totals, rates = _queue_numbers(ctx)
    node = node_name(ctx.runtime)
    answer: dict[str, Any] = {
        "product_name": "ackbus",
        "product_version": __version__,
        "node": node,
        "cluster_name": node,
        "rates_mode": "basic",
        "exchange_types": [{"name": t, "enabled": True} for t in EXCHANGE_TYPES],
        "object_totals": {
            "connections": connection_count(ctx),
            "channels": totals["channels"],
            "consumers": totals["consumers"],
            "exchanges": totals["exchanges"],
            "queues": totals["queues"],
        },
        "queue_totals": message_counts(totals, rates),
        "message_stats": _message_stats(views, rates),
        "listeners": [item.json(node) for item in ctx.listeners.all()],
    }
    await response.send_json(200, shown(answer, request.query))


async def list_nodes(ctx: ManagementContext, request: Request, response: Response) -> None:
    await response.send_json(200, listed([node_json(ctx)], request.query))


async def get_node(ctx: ManagementContext, request: Request, response: Response) -> None:
    if request.path_params["name"] != node_name(ctx.runtime):
        raise ObjectNotFound(f"no node {request.path_params['name']!r}")
    await response.send_json(200, shown(node_json(ctx), request.query))


def _vhost_json(ctx: ManagementContext) -> dict[str, Any]:
    totals, rates = _queue_numbers(ctx)
    return {
        "name": VHOST,
        "description": "Default virtual host",
        "tags": [],
        "metadata": {"description": "Default virtual host", "tags": []},
        "tracing": False,
        "cluster_state": {node_name(ctx.runtime): "running"},
        **message_counts(totals, rates),
        "message_stats": _message_stats(ctx.views, rates),
    }


async def list_vhosts(ctx: ManagementContext, request: Request, response: Response) -> None:
    await response.send_json(200, listed([_vhost_json(ctx)], request.query))


async def get_vhost(ctx: ManagementContext, request: Request, response: Response) -> None:
    await response.send_json(200, shown(_vhost_json(ctx), request.query))


async def whoami(ctx: ManagementContext, request: Request, response: Response) -> None:
    access = access_for(request)
    if not access.username:  # no users exist: nobody had to authenticate
        await response.send_json(200, shown({"name": "", "tags": ["administrator"]}, request.query))
        return
    info = ctx.views.user_info(access.username) or {}
    await response.send_json(200, shown({"name": access.username, "tags": list(info.get("tags") or [])}, request.query))


def one_queue_json(ctx: ManagementContext, name: str) -> dict[str, Any] | None:
    """Queue ``name`` in RabbitMQ's shape; None if it does not exist."""
    info = ctx.views.queue_info(name)
    if info is None:
        return None
    info["messages_paged_out"] = ctx.views.queue_counter("messages_paged_out", name) or 0
    return queue_json(info, VHOST, node_name(ctx.runtime), queue_rates(ctx.runtime.history, name))


async def list_queues(ctx: ManagementContext, request: Request, response: Response) -> None:
    items = []
    for index, name in enumerate(own_queue_names(ctx)):
        if index and not index % QUEUES_PER_SLICE:
            await checkpoint()
        item = one_queue_json(ctx, name)
        if item is not None:  # (deleted meanwhile)
            items.append(item)
    await response.send_json(200, listed(items, request.query))


async def get_queue(ctx: ManagementContext, request: Request, response: Response) -> None:
    name = request.path_params["name"]
    item = one_queue_json(ctx, name)
    if item is None:
        raise ObjectNotFound(f"no queue {name!r}")
    await response.send_json(200, shown(item, request.query))


def all_bindings(ctx: ManagementContext) -> list[dict[str, Any]]:
    """Every binding, the default exchange's implicit ones first (as RabbitMQ lists);
    in a cluster, those to the queues this node answers for and between exchanges."""
    runtime = ctx.runtime
    return default_bindings(own_queue_names(ctx), VHOST) + [
        binding_json(b, VHOST) for b in ctx.views.bindings() if "queue" not in b or serves_queue(runtime, b["queue"])
    ]


async def queue_bindings(ctx: ManagementContext, request: Request, response: Response) -> None:
    name = request.path_params["name"]
    if not ctx.views.queue_exists(name):
        raise ObjectNotFound(f"no queue {name!r}")
    found = default_bindings([name], VHOST) + [
        binding_json(b, VHOST) for b in ctx.views.bindings() if b.get("queue") == name
    ]
    await response.send_json(200, listed(found, request.query))


async def list_exchanges(ctx: ManagementContext, request: Request, response: Response) -> None:
    items = [exchange_json(info, VHOST) for info in ctx.views.exchange_infos()]
    await response.send_json(200, listed(items, request.query))


async def get_exchange(ctx: ManagementContext, request: Request, response: Response) -> None:
    name = exchange_path_name(request.path_params["name"])
    info = ctx.views.exchange_info(name)
    if info is None:
        raise ObjectNotFound(f"no exchange {name!r}")
    await response.send_json(200, shown(exchange_json(info, VHOST), request.query))


async def list_bindings(ctx: ManagementContext, request: Request, response: Response) -> None:
    await response.send_json(200, listed(all_bindings(ctx), request.query))

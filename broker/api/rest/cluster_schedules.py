"""Cluster mode's ``/schedules``: kept in etcd and fired by one node of the cluster at
a time (``broker.cluster.schedules``, docs/cluster.md), with the single node's fields
and checks (``schedules.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker.api.codec import body_from_json
from broker.api.permissions import access_for
from broker.api.rest.fields import DEFAULT_EXCHANGE_ALIAS, body_fields, exchange_name
from broker.api.rest.schedules import PUT_FIELDS
from broker.api.userid import check_user_id
from broker.core import (
    TIMING_FIELDS,
    InvalidArgument,
    PayloadTooLarge,
    check_properties,
)
from broker.http import Request, Response
from broker.runtime import BrokerRuntime

if TYPE_CHECKING:
    from broker.cluster import ClusterNode

__all__ = ["add_cluster_schedule_routes"]

Handler = Callable[[Request, Response], Awaitable[None]]


def add_cluster_schedule_routes(
    route: Callable[..., None], router: Any, runtime: BrokerRuntime, node: ClusterNode
) -> None:
    """Register the routes with ``route(router, METHOD, PATTERN, handler)``."""
    schedules = node.schedules

    def ready(handler: Handler) -> Handler:
        async def run(request: Request, response: Response) -> None:
            runtime.check_ready()
            await handler(request, response)

        return run

    async def put_schedule(request: Request, response: Response) -> None:
        name = request.path_params["name"]
        f = await body_fields(request, PUT_FIELDS)
        if "body" in f.obj and "body_b64" in f.obj:
            raise InvalidArgument("give body or body_b64, not both")
        body = body_from_json(f.obj)
        if len(body) > runtime.options.max_body_bytes:
            raise PayloadTooLarge(f"message body over {runtime.options.max_body_bytes} bytes")
        exchange = exchange_name(f.str("exchange", ""))
        access = access_for(request)
        access.require("declare_schedule", name, source=exchange or DEFAULT_EXCHANGE_ALIAS)
        properties = check_properties(f.obj.get("properties"))
        if properties is not None:  # its messages name their publisher: the schedule's maker
            check_user_id(properties.get("user_id"), access)
        info = await schedules.put(
            name, exchange=exchange, routing_key=f.str("routing_key", ""), body=body,
            properties=properties,
            timing={k: f.obj[k] for k in TIMING_FIELDS if k in f.obj},
            missed=f.str("missed", "latest"), max_missed=f.obj.get("max_missed", 100), paused=f.bool("paused", False),
        )
        await response.send_json(200, {**info, "changed": True})

    async def list_schedules(request: Request, response: Response) -> None:
        await response.send_json(200, {"schedules": await schedules.infos()})

    async def get_schedule(request: Request, response: Response) -> None:
        await response.send_json(200, await schedules.info(request.path_params["name"]))

    async def delete_schedule(request: Request, response: Response) -> None:
        name = request.path_params["name"]
        access_for(request).require("delete_schedule", name)
        await schedules.delete(name)
        await response.send_json(200, {"deleted": name})

    def set_paused(paused: bool) -> Handler:
        async def handler(request: Request, response: Response) -> None:
            await request.read_body()
            name = request.path_params["name"]
            access_for(request).require("delete_schedule", name)
            await response.send_json(200, await schedules.pause(name, paused))

        return handler

    route(router, "PUT", "/schedules/{name}", ready(put_schedule))
    route(router, "GET", "/schedules", list_schedules)
    route(router, "GET", "/schedules/{name}", get_schedule)
    route(router, "DELETE", "/schedules/{name}", ready(delete_schedule))
    route(router, "POST", "/schedules/{name}/pause", ready(set_paused(True)))
    route(router, "POST", "/schedules/{name}/resume", ready(set_paused(False)))

"""RabbitMQ 3.10's health checks: ``/api/aliveness-test/%2F`` and
``/api/health/checks/...``, answered as RabbitMQ answers them: ``200
{"status": "ok"}``, or ``503 {"status": "failed", "reason": ...}``.

* ``aliveness-test``: declares the queue ``aliveness-test``, publishes a message to
  it and gets it back, through the gateway as any client would (RabbitMQ's check
  does the same); it fails when any step does.
* ``alarms`` and ``local-alarms`` (one node: the same): fail while a memory or disk
  alarm blocks publishing.
* ``virtual-hosts``: the one vhost is up once the broker has recovered.
* ``port-listener/{port}``, ``protocol-listener/{protocol}``: whether the broker
  listens there (the listeners its app recorded, ``listeners.py``).

Like every route but ``/healthz`` they need credentials once users exist (RabbitMQ's
need them too); ``/healthz`` stays ackbus's credential-free probe.
"""

from __future__ import annotations

from typing import Any, Final

import trio

from broker.api.management.context import ManagementContext
from broker.api.management.node import node_name
from broker.api.permissions import access_for
from broker.core import REST_CHANNEL, ErrorReply
from broker.http import Request, Response

#: The queue the aliveness test uses (RabbitMQ's name).
ALIVENESS_QUEUE: Final = "aliveness-test"
ALIVENESS_BODY: Final = b"test_message"
#: How long the test's publish may wait while publishing is blocked (an alarm).
ALIVENESS_WAIT_S: Final = 5.0


def add_routes(ctx: ManagementContext) -> None:
    """Register this family's endpoints."""
    ctx.add("GET", "/aliveness-test/{vhost}", aliveness)
    ctx.add("GET", "/health/checks/alarms", alarms)
    ctx.add("GET", "/health/checks/local-alarms", alarms)
    ctx.add("GET", "/health/checks/virtual-hosts", virtual_hosts)
    ctx.add("GET", "/health/checks/port-listener/{port}", port_listener)
    ctx.add("GET", "/health/checks/protocol-listener/{protocol}", protocol_listener)


async def _failed(response: Response, reason: str, **more: Any) -> None:
    await response.send_json(503, {"status": "failed", "reason": reason, **more})


async def aliveness(ctx: ManagementContext, request: Request, response: Response) -> None:
    access = access_for(request)
    access.require("declare_queue", ALIVENESS_QUEUE)
    access.require("publish", "amq.default")
    access.require("get", ALIVENESS_QUEUE)
    gateway = ctx.gateway
    try:
        gateway.check_ready()
        if not ctx.views.queue_exists(ALIVENESS_QUEUE):  # (one declared otherwise is used as it is)
            await gateway.declare_queue(
                REST_CHANNEL, ALIVENESS_QUEUE, durable=False, exclusive=False, auto_delete=False, arguments={},
                passive=False,
            )
        # a publish waits while publishing is blocked: the check fails instead
        outcome = await gateway.publish_and_confirm(
            "", ALIVENESS_QUEUE, ALIVENESS_BODY, None, deadline=trio.current_time() + ALIVENESS_WAIT_S
        )
        if not outcome.ack or not outcome.routed:
            await _failed(response, f"the test message was not taken: {outcome.reason or 'not routed'}")
            return

        def take(core: Any) -> bool:
            leases = core.get(ALIVENESS_QUEUE, 1, None)
            if leases:
                core.ack_leases([lease_id for lease_id, _d, _r in leases], queue=ALIVENESS_QUEUE)
            return bool(leases)

        if not gateway.run(take):
            await _failed(response, "the test message could not be got back")
            return
    except ErrorReply as exc:
        await _failed(response, exc.message)
        return
    await response.send_json(200, {"status": "ok"})


async def alarms(ctx: ManagementContext, request: Request, response: Response) -> None:
    flow = ctx.runtime.flow
    if flow.alarms:
        node = node_name(ctx.runtime)
        await _failed(
            response,
            "There are alarms in effect in the cluster",
            alarms=[{"node": node, "resource": kind} for kind in sorted(flow.alarms)],
        )
        return
    await response.send_json(200, {"status": "ok"})


async def virtual_hosts(ctx: ManagementContext, request: Request, response: Response) -> None:
    runtime = ctx.runtime
    if not runtime.ready:
        await _failed(response, "Some virtual hosts are down", **{"virtual-hosts": ["/"]})
        return
    await response.send_json(200, {"status": "ok"})


async def port_listener(ctx: ManagementContext, request: Request, response: Response) -> None:
    text = request.path_params["port"]
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        await _failed(response, f"invalid port: {text[:20]!r}")
        return
    port = int(text)
    ports = ctx.listeners.ports()
    if port not in ports:
        await _failed(response, "No active listener", missing=port, ports=ports)
        return
    await response.send_json(200, {"status": "ok", "port": port})


async def protocol_listener(ctx: ManagementContext, request: Request, response: Response) -> None:
    protocol = request.path_params["protocol"]
    protocols = ctx.listeners.protocols()
    if protocol.lower() not in protocols:
        await _failed(response, "No active listener", missing=protocol, protocols=protocols)
        return
    await response.send_json(200, {"status": "ok", "protocol": protocol})

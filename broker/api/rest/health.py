"""Liveness and the overview: ``GET /healthz`` and ``GET /overview``."""

from __future__ import annotations

from typing import Any

from broker.api.rest.fields import RestContext
from broker.core import BrokerViews
from broker.http import Request, Response
from broker.runtime import BrokerRuntime, build_name, disk_info, fd_info


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("GET", "/healthz", healthz, public=True)
    ctx.add("GET", "/overview", overview)


async def healthz(ctx: RestContext, request: Request, response: Response) -> None:
    status, answer = health_answer(ctx.gateway.runtime, ctx.views)
    await response.send_json(status, answer)


def health_answer(runtime: BrokerRuntime, views: BrokerViews) -> tuple[int, dict[str, Any]]:
    """``GET /healthz``'s status and body (a cluster node adds its part to it)."""
    if not runtime.ready:
        return 503, {"status": "recovering", "ready": False}
    if runtime.shutting_down:
        return 503, {"status": "shutting_down", "ready": False}
    answer: dict[str, Any] = {"status": "ok", "ready": True, "storage_ok": views.storage_ok()}
    refusal = views.publish_refusal()
    if refusal is not None:
        answer["publishes_refused"] = refusal  # the disk is nearly full
    flow = runtime.flow
    # still alive, but publishes wait and are refused (memory or disk alarm)
    answer["publishing_blocked"] = flow.blocked
    answer["memory_alarm"] = runtime.memory.alarm
    if flow.blocked:
        answer["alarms"] = dict(flow.alarms)
    blocked = views.read_blocked_queues()
    if blocked:
        # still alive and serving, but some queues wait for the log
        answer["log_read_failures"] = blocked
    return 200, answer


async def overview(ctx: RestContext, request: Request, response: Response) -> None:
    runtime = ctx.gateway.runtime
    info = runtime.overview()
    # The health of the host resources (RabbitMQ's overview shows the same three).
    info["memory"] = runtime.memory.info()
    info["disk"] = {**disk_info(runtime.options.data_dir), "alarm": "disk" in runtime.flow.alarms}
    info["file_descriptors"] = fd_info()
    info["flow"] = runtime.flow.info()
    info["build"] = build_name()  # compiled (mypyc) or interpreted: docs/benchmarks.md
    await response.send_json(200, info)

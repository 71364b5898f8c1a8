"""Liveness and the overview: ``GET /healthz`` and ``GET /overview``."""

from __future__ import annotations

from typing import Any

from broker.api.rest.fields import RestContext


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core = ctx.runtime, ctx.core

    @ctx.route("GET", "/healthz", public=True)
    async def healthz(request: Any, response: Any) -> None:
        if not runtime.ready:
            await response.send_json(503, {"status": "recovering", "ready": False})
        elif runtime.shutting_down:
            await response.send_json(503, {"status": "shutting_down", "ready": False})
        else:
            answer: dict[str, Any] = {"status": "ok", "ready": True, "storage_ok": core.storage_ok}
            if core.publish_refusal is not None:
                answer["publishes_refused"] = core.publish_refusal  # the disk is nearly full
            blocked = runtime.read_blocked_queues()
            if blocked:
                # still alive and serving, but some queues wait for the log
                answer["log_read_failures"] = blocked
            await response.send_json(200, answer)

    @ctx.route("GET", "/overview")
    async def overview(request: Any, response: Any) -> None:
        await response.send_json(200, runtime.overview())

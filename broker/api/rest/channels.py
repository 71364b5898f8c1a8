"""The open channels and streaming consumes, for operators: ``GET /channels`` and
``GET /channels/{id}`` (read-only; what rabbitmqadmin's ``list connections`` /
``list channels`` show)."""

from __future__ import annotations

from typing import Any

from broker.api.rest.fields import RestContext
from broker.core import NotFound


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core = ctx.runtime, ctx.core

    def describe(channel_id: int, sink: Any) -> dict[str, Any] | None:
        channel = core.channels.get(channel_id)
        if channel is None:
            return None
        return {
            "id": channel_id,
            "kind": getattr(sink, "kind", "stream"),
            "remote": getattr(sink, "remote", None),
            "user_agent": getattr(sink, "user_agent", None),
            "opened_at": getattr(sink, "opened_at", None),
            "published": channel.publish_seq,
            "unacked": channel.unacked,
            "prefetch": channel.prefetch,
            "transactional": channel.tx is not None,
            "consumers": [
                {"consumer_tag": c.tag, "queue": c.queue.name, "prefetch": c.prefetch,
                 "unacked": c.unacked, "no_ack": c.no_ack, "exclusive": c.exclusive}
                for c in channel.consumers.values()
            ],
        }

    @ctx.route("GET", "/channels")
    async def list_channels(request: Any, response: Any) -> None:
        items = [describe(cid, sink) for cid, sink in sorted(runtime.sinks.items())]
        await response.send_json(200, {"channels": [item for item in items if item is not None]})

    @ctx.route("GET", "/channels/{id}")
    async def show_channel(request: Any, response: Any) -> None:
        text = request.path_params["id"]
        sink = runtime.sinks.get(int(text)) if text.isdigit() else None
        item = describe(int(text), sink) if sink is not None else None
        if item is None:
            raise NotFound(f"no open channel {text!r}")
        await response.send_json(200, item)

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

#: The reason a closed client is given when the operator gives none.
DEFAULT_CLOSE_REASON = "closed by an operator"
MAX_REASON_CHARS = 200


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core = ctx.runtime, ctx.core

    def channel_info(channel_id: int, sink: Any) -> dict[str, Any] | None:
        ch = core.channels.get(channel_id)
        if ch is None:
            return None
        return {
            "id": channel_id,
            "kind": getattr(sink, "kind", "channel"),
            "remote": getattr(sink, "remote", None),
            "user_agent": getattr(sink, "user_agent", None),
            # who opened it, when the broker has users (the session's principal)
            "user": getattr(getattr(sink, "principal", None), "username", None),
            "opened_at": getattr(sink, "opened_at", None),
            "prefetch": ch.prefetch,
            "default_prefetch": ch.default_prefetch,
            "unacked": ch.unacked,
            "publishes": ch.publish_seq,
            "deliveries": ch.next_tag - 1,
            "pending_confirms": len(ch.confirms),
            "transactional": ch.tx is not None,
            "consumers": [
                {
                    "consumer_tag": c.tag,
                    "queue": c.queue.name,
                    "prefetch": c.prefetch,
                    "unacked": c.unacked,
                    "no_ack": c.no_ack,
                    "exclusive": c.exclusive,
                }
                for c in ch.consumers.values()
            ],
        }

    def channel_id(request: Any) -> int:
        text = request.path_params["id"]
        if not text.isdigit() or len(text) > 18:
            raise InvalidArgument(f"channel id must be a positive integer: {text[:40]!r}")
        return int(text)

    @ctx.route("GET", "/channels")
    async def list_channels(request: Any, response: Any) -> None:
        access_for(request).require("administer")
        channels = [
            info
            for cid, sink in list(runtime.sinks.items())
            if (info := channel_info(cid, sink)) is not None
        ]
        await response.send_json(200, {"channels": channels})

    @ctx.route("GET", "/channels/{id}")
    async def get_channel(request: Any, response: Any) -> None:
        access_for(request).require("administer")
        cid = channel_id(request)
        sink = runtime.sinks.get(cid)
        info = channel_info(cid, sink) if sink is not None else None
        if info is None:
            raise NotFound(f"no open channel {cid}")
        await response.send_json(200, info)

    @ctx.route("DELETE", "/channels/{id}")
    async def close_channel(request: Any, response: Any) -> None:
        access_for(request).require("administer")
        cid = channel_id(request)
        f = await body_fields(request, {"reason"})
        reason = f.str("reason", DEFAULT_CLOSE_REASON)
        if not reason or len(reason) > MAX_REASON_CHARS:
            raise InvalidArgument(f"reason must be 1..{MAX_REASON_CHARS} characters")
        sink = runtime.sinks.get(cid)
        if sink is None or cid not in core.channels:
            raise NotFound(f"no open channel {cid}")
        # The shutdown path, for one channel: say why, then stop taking operations.
        sink.closing(reason)
        sink.shutdown()
        runtime.pump()
        await response.send_json(200, {"closed": cid, "reason": reason})

"""Every endpoint of the HTTP API, bound to one runtime."""

from __future__ import annotations

from functools import partial
from typing import Any

from broker.api.channel import handle_channel
from broker.api.rest import add_rest_routes
from broker.api.stream import handle_stream
from broker.api.ui import add_ui_routes
from broker.http import Router
from broker.runtime import BrokerRuntime

__all__ = ["build_router"]


def build_router(runtime: BrokerRuntime, *, metrics_handler: Any = None) -> Router:
    """Every endpoint of the HTTP API, bound to ``runtime``."""
    router = Router()
    add_rest_routes(router, runtime)
    router.add("POST", "/channel", partial(handle_channel, runtime))
    # A streaming consume hands out (and may auto-ack) messages: never for a HEAD,
    # whose response would carry none of them.
    router.add("GET", "/queues/{name}/stream", partial(handle_stream, runtime), head=False)
    if metrics_handler is not None:
        router.add("GET", "/metrics", metrics_handler)
    add_ui_routes(router)  # the management UI's files (docs/ui.md)
    return router

"""Every endpoint of the HTTP API, bound to one runtime, behind one guard.

Public routes (served without credentials, docs/security.md): ``GET /healthz``,
because load balancers and orchestrators probe it without credentials and it tells
nothing but whether the broker is up, and the management UI's static files (``/``,
``/ui/...``), which hold no data: the page logs in through the API. Every other route runs the authenticator's guard
first (``broker.api.auth``); a test walks this table and fails on any other public
route.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from broker.api.auth import Authenticator
from broker.api.channel import handle_channel
from broker.api.management import Listeners, add_management_routes
from broker.api.permissions import access_for
from broker.api.rest import add_rest_routes
from broker.api.stream import handle_stream
from broker.api.ui import add_ui_routes
from broker.http import Request, Response, Router
from broker.runtime import BrokerRuntime, CommandGateway

__all__ = ["PUBLIC_ROUTES", "build_router"]

#: (method, pattern) of every route served without credentials.
PUBLIC_ROUTES = frozenset(
    {("GET", "/healthz"), ("HEAD", "/healthz")}
    # the management UI's static files (no data; the page logs in through the API)
    | {(method, path) for method in ("GET", "HEAD") for path in ("/", "/ui", "/ui/", "/ui/{file}")}
)


def build_router(
    runtime: BrokerRuntime, *, metrics_handler: Any = None, auth: Authenticator | None = None,
    listeners: Listeners | None = None,
) -> Router:
    """Every endpoint of the HTTP API, bound to ``runtime``, guarded by ``auth`` (by
    default one that serves requests without credentials while no user exists).
    ``listeners``: the sockets the broker serves, which its app records as it binds
    them (the management API shows them; none by default)."""
    if auth is None:
        auth = Authenticator(runtime.core, runtime.options, open_without_users=lambda: True)
    router = Router(guard=auth.guard)
    # The one door to the core for every route (stateless: the runtime holds the state).
    gateway = CommandGateway(runtime)
    add_rest_routes(router, runtime, auth, gateway)
    # RabbitMQ's management API under /api/ (docs/management-api.md)
    add_management_routes(router, runtime, gateway, Listeners() if listeners is None else listeners)
    router.add("POST", "/channel", partial(handle_channel, runtime, gateway=gateway))
    # A streaming consume hands out (and may auto-ack) messages: never for a HEAD,
    # whose response would carry none of them.
    router.add("GET", "/queues/{name}/stream", partial(handle_stream, gateway), head=False)
    if metrics_handler is not None:
        router.add("GET", "/metrics", partial(_administrators_only, metrics_handler))
    add_ui_routes(router)  # the management UI's files (docs/ui.md): public, the page asks for a login
    return router


async def _administrators_only(handler: Any, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    await handler(request, response)

"""What every management route shares: :class:`ManagementContext` (the gateway, the
core's views, the runtime) and its :meth:`~ManagementContext.add`, which registers a
handler behind the management API's rules:

* the one vhost is ``/`` (``%2F`` in paths): a route naming another answers 404
  ``Object Not Found``, as RabbitMQ answers for a vhost that does not exist;
* errors are answered in RabbitMQ's shape (``errors.rabbit_error``);
* unknown query parameters are ignored, not refused as ackbus's own API does: tools
  send RabbitMQ's (``columns``, ``disable_stats``, ``enable_queue_totals``,
  ``lengths_age`` ...), and RabbitMQ ignores those it does not know.

Authentication is the router's guard, as for every other route (``broker.api.auth``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from broker.api.management.errors import ObjectNotFound, rabbit_error
from broker.api.management.listeners import Listeners
from broker.core import BrokerViews
from broker.http import ClientDisconnected, Request, Response, Router
from broker.runtime import BrokerRuntime, CommandGateway, RuntimeOptions

__all__ = ["VHOST", "ManagementContext", "ManagementHandler"]

#: The one virtual host.
VHOST: Final = "/"

#: A management handler: a module-level function of what it needs and the exchange.
ManagementHandler = Callable[["ManagementContext", Request, Response], Awaitable[None]]


class ManagementContext:
    """What a management handler needs: the command gateway (every core command goes
    through it, as for the REST routes), the core's read-only views, the runtime (its
    memory, flow, history of rates) and the listeners it serves."""

    def __init__(self, router: Router, runtime: BrokerRuntime, gateway: CommandGateway, listeners: Listeners) -> None:
        self.router = router
        #: the listeners this broker serves (its app records them as it binds)
        self.listeners = listeners
        self.runtime = runtime
        self.gateway = gateway
        self.views: BrokerViews = gateway.views
        self.options: RuntimeOptions = runtime.options

    def add(self, method: str, pattern: str, handler: ManagementHandler) -> None:
        """Serve ``METHOD /api<pattern>`` with ``handler(self, request, response)``,
        behind the rules of the module docstring."""

        async def served(request: Request, response: Response) -> None:
            try:
                vhost = request.path_params.get("vhost")
                if vhost is not None and vhost != VHOST:
                    raise ObjectNotFound(f"no vhost {vhost!r}")
                await handler(self, request, response)
            except ClientDisconnected:
                raise
            except Exception as exc:
                answer = rabbit_error(exc)
                if answer is None or response.started:
                    raise
                status, body, headers = answer
                await response.send_json(status, body, headers=headers)

        self.router.add(method, "/api" + pattern, served)


"""The one-shot REST calls of the HTTP API (docs/http-api.md), a module per resource
family.

Each handler is a module-level function ``handler(ctx, request, response)`` of the
:class:`RestContext` it needs. It decodes its input completely before it touches the
core, so a bad request changes nothing; then it runs core commands through the
command gateway (``ctx.gateway.run`` / ``run_durable``: effects carried out,
durability waited for) and reads through ``ctx.views``. Core errors
(:class:`~broker.core.BrokerError`) propagate to the server, which turns them into
JSON error responses (``broker.api.errors``).
"""

from __future__ import annotations

from typing import Any

from broker.api.rest import (
    bindings,
    channels,
    cluster,
    exchanges,
    health,
    history,
    leases,
    locks,
    messages,
    queues,
    schedules,
    users,
)
from broker.api.rest.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    Fields,
    RestContext,
    exchange_name,
)
from broker.http import Router
from broker.runtime import BrokerRuntime, CommandGateway

__all__ = ["DEFAULT_EXCHANGE_ALIAS", "Fields", "RestContext", "add_rest_routes", "exchange_name"]

_FAMILIES = (health, history, exchanges, queues, leases, messages, bindings, channels, users, locks, schedules, cluster)


def add_rest_routes(
    router: Router, runtime: BrokerRuntime, auth: Any = None, gateway: CommandGateway | None = None
) -> None:
    """Register every REST endpoint on ``router`` (``auth``: the authenticator, whose
    hashing threads the users family shares)."""
    ctx = RestContext(router, runtime, auth, gateway)
    for family in _FAMILIES:
        family.add_routes(ctx)

"""The one-shot REST calls of the HTTP API (docs/http-api.md), a module per resource
family.

Each handler decodes its input completely before it touches the core, so a bad request
changes nothing; core errors (:class:`~broker.core.BrokerError`) propagate to the
server, which turns them into JSON error responses (``broker.api.errors``).
"""

from __future__ import annotations

from broker.api.rest import (
    bindings,
    channels,
    exchanges,
    health,
    leases,
    messages,
    queues,
)
from broker.api.rest.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    Fields,
    RestContext,
    exchange_name,
)
from broker.http import Router
from broker.runtime import BrokerRuntime

__all__ = ["DEFAULT_EXCHANGE_ALIAS", "Fields", "add_rest_routes", "exchange_name"]

_FAMILIES = (health, exchanges, queues, leases, messages, bindings, channels)


def add_rest_routes(router: Router, runtime: BrokerRuntime) -> None:
    """Register every REST endpoint on ``router``."""
    ctx = RestContext(router, runtime)
    for family in _FAMILIES:
        family.add_routes(ctx)

"""The one-shot REST calls of the HTTP API (docs/http-api.md), a module per resource
family.

Each handler decodes its input completely before it touches the core, so a bad request
changes nothing; core errors (:class:`~broker.core.BrokerError`) propagate to the
server, which turns them into JSON error responses (``broker.api.errors``).
"""

from __future__ import annotations

from typing import Any

from broker.api.rest import (
    bindings,
    channels,
    cluster,
    exchanges,
    health,
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
from broker.runtime import BrokerRuntime

__all__ = ["DEFAULT_EXCHANGE_ALIAS", "Fields", "add_rest_routes", "exchange_name"]

_FAMILIES = (health, exchanges, queues, leases, messages, bindings, channels, users, locks, schedules, cluster)


def add_rest_routes(router: Router, runtime: BrokerRuntime, auth: Any = None) -> None:
    """Register every REST endpoint on ``router`` (``auth``: the authenticator, whose
    hashing threads the users family shares)."""
    ctx = RestContext(router, runtime, auth)
    for family in _FAMILIES:
        family.add_routes(ctx)

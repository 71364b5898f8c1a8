"""RabbitMQ's management HTTP API, the part tools read and the declares they make,
under ``/api/`` on ackbus's own HTTP port (docs/management-api.md).

Flower, KEDA's RabbitMQ scaler, Prometheus exporters, ``rabbitmqadmin``, load
balancers' health checks and ops scripts talk to ``http://host:15672/api/...``; given
ackbus's base URL instead they work unchanged: the answers have RabbitMQ 3.10's JSON
shapes, filled with what ackbus really has. One vhost, ``/``.

A module per family, as ``broker/api/rest/``: ``reading`` (overview, nodes, vhosts,
queues, exchanges, bindings), ``clients`` (connections, channels, consumers),
``health`` (aliveness and health checks), ``writing`` (declares, deletes, bindings,
purge), ``messages`` (publish, get); ``shapes`` and ``rates`` turn ackbus's views
into RabbitMQ's fields, ``paging`` answers the list query, ``errors`` RabbitMQ's
error shape, ``body`` reads a request body as RabbitMQ does, ``node`` and
``listeners`` describe this broker. Every command goes through the one command
gateway and the same permission checks as ackbus's REST routes; every read through
the core's views.
"""

from __future__ import annotations

from broker.api.management import clients, health, messages, reading, writing
from broker.api.management.context import ManagementContext
from broker.api.management.errors import api_error_bodies
from broker.api.management.listeners import Listener, Listeners
from broker.http import Router
from broker.runtime import BrokerRuntime, CommandGateway

__all__ = ["Listener", "Listeners", "add_management_routes", "api_error_bodies"]

_FAMILIES = (reading, clients, health, writing, messages)


def add_management_routes(router: Router, runtime: BrokerRuntime, gateway: CommandGateway, listeners: Listeners) -> None:
    """Register every ``/api/`` endpoint on ``router``, behind its guard; ``listeners``:
    the sockets the broker serves, as its app records them."""
    ctx = ManagementContext(router, runtime, gateway, listeners)
    for family in _FAMILIES:
        family.add_routes(ctx)

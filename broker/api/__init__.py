"""The API layer: turns HTTP exchanges into core commands and effects into bytes.

REST resources, the channel and stream protocols, the NDJSON codec and the metrics
endpoint. It sits on the generic HTTP server (:mod:`broker.http`) and the runtime
(:mod:`broker.runtime`), whose command gateway is its one way to change the core;
it reads the core through the core's views.
"""

from broker.api.auth import Authenticator, hash_password, new_token
from broker.api.channel.relay_resume import LocalQuorumConsumers
from broker.api.channel.relayed import RelayedConsumers
from broker.api.csrf import protect
from broker.api.errors import http_error
from broker.api.management import Listeners, api_error_bodies
from broker.api.metrics import BrokerMetrics
from broker.api.permissions import ALLOW_ALL, Access
from broker.api.rest.cluster import cluster_routes, dispatch_cluster_first
from broker.api.routes import PUBLIC_ROUTES, build_router
from broker.api.userid import user_id_refusal

__all__ = [
    "ALLOW_ALL",
    "Access",
    "Authenticator",
    "BrokerMetrics",
    "Listeners",
    "LocalQuorumConsumers",
    "PUBLIC_ROUTES",
    "RelayedConsumers",
    "api_error_bodies",
    "build_router",
    "cluster_routes",
    "dispatch_cluster_first",
    "hash_password",
    "http_error",
    "new_token",
    "protect",
    "user_id_refusal",
]

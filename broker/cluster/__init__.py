"""Cluster mode (``--etcd``): several nodes agree on membership and metadata through
etcd. See docs/cluster.md. The core never knows it is clustered: this package mirrors
etcd into each node's core through its public commands."""

from broker.cluster.etcd import Endpoint, EtcdClient, parse_endpoints
from broker.cluster.etcdaccess import (
    EtcdAuthFailed,
    EtcdCredentials,
    read_password_file,
)
from broker.cluster.etcdproto import EtcdError, EtcdUnavailable
from broker.cluster.mirror import QUEUE_MOVED, is_moved
from broker.cluster.node import ClusterConfig, ClusterNode, NodeNameTaken
from broker.cluster.peers import (
    FORWARDED_HEADER,
    SECRET_HEADER,
    PeerStream,
    PeerUnreachable,
    relay,
)
from broker.cluster.replica_leader import StaleEpoch
from broker.cluster.replication import NO_QUORUM
from broker.cluster.view import is_replicated

__all__ = [
    "ClusterConfig",
    "FORWARDED_HEADER",
    "SECRET_HEADER",
    "ClusterNode",
    "Endpoint",
    "EtcdAuthFailed",
    "EtcdClient",
    "EtcdCredentials",
    "EtcdError",
    "EtcdUnavailable",
    "NO_QUORUM",
    "QUEUE_MOVED",
    "NodeNameTaken",
    "PeerStream",
    "PeerUnreachable",
    "relay",
    "StaleEpoch",
    "is_moved",
    "is_replicated",
    "parse_endpoints",
    "read_password_file",
]

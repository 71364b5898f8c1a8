"""Cluster mode (``--etcd``): several nodes agree on membership and metadata through
etcd. See docs/cluster.md. The core never knows it is clustered: this package mirrors
etcd into each node's core through its public commands."""

from broker.cluster.etcd import Endpoint, EtcdClient, parse_endpoints
from broker.cluster.etcdproto import EtcdError, EtcdUnavailable

__all__ = ["Endpoint", "EtcdClient", "EtcdError", "EtcdUnavailable", "parse_endpoints"]

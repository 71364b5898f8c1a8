"""Cluster mode (``--etcd``): several nodes agree on membership and metadata through
etcd. See docs/cluster.md. The core never knows it is clustered: this package mirrors
etcd into each node's core through its public commands.

The face loads a module on first use of one of its names (PEP 562's module
``__getattr__``), not at import: the API layer names the cluster's headers, reasons and
errors on every broker, and a single node (no ``--etcd``) then loads only the few
small modules those come from, not the ~50 of cluster mode (its start is the CPU of
every broker process; docs/architecture.md). Type checkers see the imports below.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.cluster.etcd import Endpoint, EtcdClient, parse_endpoints
    from broker.cluster.etcdaccess import (
        EtcdAuthFailed,
        EtcdCredentials,
        read_password_file,
    )
    from broker.cluster.etcdproto import EtcdError, EtcdUnavailable
    from broker.cluster.node import ClusterConfig, ClusterNode, NodeNameTaken
    from broker.cluster.peers import (
        FORWARDED_HEADER,
        SECRET_HEADER,
        PeerStream,
        PeerUnreachable,
        relay,
    )
    from broker.cluster.reasons import NO_QUORUM, QUEUE_MOVED, is_moved
    from broker.cluster.replica_leader import StaleEpoch
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


# One loader a module, each a plain import statement (tests/test_layout.py reads them).
def _etcd() -> ModuleType:
    from broker.cluster import etcd

    return etcd


def _etcdaccess() -> ModuleType:
    from broker.cluster import etcdaccess

    return etcdaccess


def _etcdproto() -> ModuleType:
    from broker.cluster import etcdproto

    return etcdproto


def _node() -> ModuleType:
    from broker.cluster import node

    return node


def _peers() -> ModuleType:
    from broker.cluster import peers

    return peers


def _reasons() -> ModuleType:
    from broker.cluster import reasons

    return reasons


def _replica_leader() -> ModuleType:
    from broker.cluster import replica_leader

    return replica_leader


def _view() -> ModuleType:
    from broker.cluster import view

    return view


#: Each name of the face -> the loader of the module that defines it.
_SOURCES: dict[str, Callable[[], ModuleType]] = {
    "Endpoint": _etcd,
    "EtcdClient": _etcd,
    "parse_endpoints": _etcd,
    "EtcdAuthFailed": _etcdaccess,
    "EtcdCredentials": _etcdaccess,
    "read_password_file": _etcdaccess,
    "EtcdError": _etcdproto,
    "EtcdUnavailable": _etcdproto,
    "ClusterConfig": _node,
    "ClusterNode": _node,
    "NodeNameTaken": _node,
    "FORWARDED_HEADER": _peers,
    "SECRET_HEADER": _peers,
    "PeerStream": _peers,
    "PeerUnreachable": _peers,
    "relay": _peers,
    "NO_QUORUM": _reasons,
    "QUEUE_MOVED": _reasons,
    "is_moved": _reasons,
    "StaleEpoch": _replica_leader,
    "is_replicated": _view,
}


def __getattr__(name: str) -> Any:
    """A name of the face, from its module (imported now if it was not yet); kept in
    the package's namespace, so that later uses are plain attribute reads."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(source(), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

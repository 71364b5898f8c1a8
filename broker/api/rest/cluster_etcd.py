"""The one answer of a cluster-mode REST change while etcd cannot take it:
:func:`etcd_errors`, shared by the metadata routes (``cluster.py``) and the changes of
a quorum queue's replicas (``replicas.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from broker.core import Unavailable
from broker.http import Request, Response

if TYPE_CHECKING:
    from broker.cluster import ClusterNode

__all__ = ["Handler", "etcd_errors"]

Handler = Callable[[Request, Response], Awaitable[None]]


def etcd_errors(node: ClusterNode, handler: Handler, what: str = "metadata") -> Handler:
    """``handler``, refused while the node is not ready or etcd is unreachable (503),
    with an etcd failure during the change turned into the same 503 (``what``: what
    cannot change, for the message)."""
    # here: cluster mode's, not loaded on a single node
    from broker.cluster import EtcdUnavailable

    async def guarded(request: Request, response: Response) -> None:
        node.runtime.check_ready()
        node.check_writable()
        try:
            await handler(request, response)
        except EtcdUnavailable as exc:
            node.note_etcd(exc.message)
            raise Unavailable(f"etcd is unreachable, so {what} cannot change now: {exc.message}", code="etcd_unavailable") from None

    return guarded

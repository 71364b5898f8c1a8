"""The gateway's door into cluster mode (:class:`~broker.runtime.ClusterPort`):
forwarding of publishes (``forward.py``) and metadata changes through etcd
(``writes.py``), so a channel's ``declare_queue``, ``bind``... are decided by the
same etcd transactions as their REST twins, whatever protocol asks."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote

import orjson

from broker.cluster.etcdproto import EtcdUnavailable
from broker.cluster.forward import Forwarder
from broker.cluster.locks import ClusterLocks
from broker.cluster.peers import PeerUnreachable, relay
from broker.cluster.writes import MetadataWriter
from broker.core import BrokerViews, NotFound, PreconditionFailed, Unavailable
from broker.runtime import ForwardPlan

__all__ = ["ClusterGatewayPort"]

T = TypeVar("T")


class ClusterGatewayPort:
    """Forwarding and metadata changes of one node, for its gateway.

    ``check_writable()`` raises ``Unavailable`` while metadata cannot change;
    ``note_etcd(error)`` records an etcd failure; ``owner_of(queue)`` is the node's
    placement question (owner, URL or None); ``is_replicated(queue)`` whether it is a
    quorum queue."""

    def __init__(
        self,
        forwarder: Forwarder,
        writer: MetadataWriter,
        views: BrokerViews,
        node_name: str,
        check_writable: Callable[[], None],
        note_etcd: Callable[[str | None], None],
        owner_of: Callable[[str], tuple[str, str | None] | None],
        is_replicated: Callable[[str], bool],
        lease: Callable[[], int],
        forget_local_queue: Callable[[str], None],
        locks: ClusterLocks,
        secret: str | None = None,
        peer_ssl: ssl.SSLContext | None = None,
    ) -> None:
        self.locks = locks
        self.secret = secret
        self.peer_ssl = peer_ssl
        self.forwarder = forwarder
        self.writer = writer
        self.views = views
        self.node_name = node_name
        self.check_writable = check_writable
        self.note_etcd = note_etcd
        self.owner_of = owner_of
        self.is_replicated = is_replicated
        self._lease = lease
        self.forget_local_queue = forget_local_queue

    # ------------------------------------------------------------ forwarding

    def plan(self, channel_id: int, exchange: str, routing_key: str, headers: Any) -> ForwardPlan | None:
        return self.forwarder.plan(channel_id, exchange, routing_key, headers)

    def forward_dead_letter(self, exchange: str, routing_key: str, body: bytes, properties: dict[str, Any]) -> bool:
        return self.forwarder.forward_dead_letter(exchange, routing_key, body, properties)

    def peer_channel(self, channel_id: int, opened: bool) -> None:
        self.forwarder.peer_channel(channel_id, opened)

    def send(
        self,
        owner: str,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        delay_s: float | None,
        settle: Callable[[bool, str | None], None],
        *,
        dedup: bool = True,
    ) -> None:
        self.forwarder.send(owner, exchange, routing_key, body, properties, delay_s, settle, dedup=dedup)

    async def purge_remote(self, queue: str) -> int:
        located = self.owner_of(queue)
        if located is None:
            raise NotFound(f"no queue {queue!r}")
        owner, url = located
        if url is None:
            raise Unavailable(f"queue {queue!r} is on node {owner!r}, which is down; retry later", code="queue_unavailable")
        try:
            async with relay(
                url, "POST", f"/queues/{quote(queue, safe='')}/purge", [], b"", origin=self.node_name, secret=self.secret,
                ssl_context=self.peer_ssl, answer_timeout_s=self.forwarder.answer_timeout_s,
            ) as answer:
                body = b"".join([chunk async for chunk in answer.chunks()])
        except PeerUnreachable as exc:
            raise Unavailable(f"queue {queue!r}: its node {owner!r} cannot be reached: {exc}", code="queue_unavailable") from None
        data = orjson.loads(body) if body else {}
        if answer.status == 404:
            raise NotFound(str(data.get("message", f"no queue {queue!r}")))
        if answer.status != 200:
            reason = data.get("message", f"the owner answered {answer.status}")
            raise Unavailable(f"queue {queue!r}: its node {owner!r} did not purge it: {reason}", code="queue_unavailable")
        return int(data.get("purged", 0))

    async def queue_counts(self, queue: str) -> tuple[int, int] | None:
        located = self.owner_of(queue)
        if located is None or located[1] is None:
            return None
        try:
            async with relay(
                located[1], "GET", f"/queues/{quote(queue, safe='')}", [], b"", origin=self.node_name,
                secret=self.secret, ssl_context=self.peer_ssl, answer_timeout_s=self.forwarder.answer_timeout_s,
            ) as answer:
                body = b"".join([chunk async for chunk in answer.chunks()])
        except PeerUnreachable:
            return None
        if answer.status != 200:
            return None
        try:
            info = orjson.loads(body)
            return int(info["messages_ready"]), int(info["consumers"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    # -------------------------------------------------------------- metadata

    async def _etcd(self, change: Awaitable[T]) -> T:
        try:
            return await change
        except EtcdUnavailable as exc:
            self.note_etcd(exc.message)
            raise Unavailable(f"etcd is unreachable, so metadata cannot change now: {exc.message}", code="etcd_unavailable") from None

    async def declare_queue(
        self, name: str, *, durable: bool, auto_delete: bool, arguments: dict[str, Any], passive: bool
    ) -> bool:
        self.check_writable()
        _d, created = await self._etcd(
            self.writer.declare_queue(name, durable=durable, auto_delete=auto_delete, arguments=arguments, passive=passive)
        )
        return created

    async def delete_queue(self, name: str, *, if_unused: bool, if_empty: bool) -> int:
        self.check_writable()
        views = self.views
        count = views.queue_counter("messages_ready", name) or 0

        def local_check() -> None:
            if not (if_unused or if_empty):
                return
            if not views.queue_exists(name):
                located = self.owner_of(name)
                raise PreconditionFailed(
                    f"if_unused and if_empty are checked on queue {name!r}'s owner "
                    f"{located[0] if located else '?'} ({located[1] if located else 'not alive'}): send the delete there",
                    code="not_owner",
                )
            if if_unused and views.queue_counter("consumers", name):
                raise PreconditionFailed(f"queue {name!r} has consumers")
            if if_empty and views.queue_counter("messages_ready", name):
                raise PreconditionFailed(f"queue {name!r} is not empty")

        await self._etcd(self.writer.delete_queue(name, local_check=local_check))
        return count

    async def declare_exchange(
        self, name: str, type: str, *, durable: bool, auto_delete: bool, internal: bool, arguments: dict[str, Any], passive: bool
    ) -> bool:
        self.check_writable()
        _d, created = await self._etcd(
            self.writer.declare_exchange(
                name, type, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments, passive=passive
            )
        )
        return created

    async def delete_exchange(self, name: str, *, if_unused: bool) -> None:
        self.check_writable()
        await self._etcd(self.writer.delete_exchange(name, if_unused=if_unused))

    async def bind(self, source: str, destination: str, routing_key: str, arguments: dict[str, Any], *, to_exchange: bool) -> None:
        self.check_writable()
        await self._etcd(self.writer.bind(source, destination, routing_key, arguments, to_exchange=to_exchange))

    async def unbind(self, source: str, destination: str, routing_key: str, arguments: dict[str, Any], *, to_exchange: bool) -> None:
        self.check_writable()
        await self._etcd(self.writer.unbind(source, destination, routing_key, arguments, to_exchange=to_exchange))

    def _lease_now(self) -> int:
        lease = self._lease()
        if not lease:
            raise Unavailable("this node holds no lease in etcd now: try again", code="etcd_unavailable")
        return lease

    async def register_local_queue(
        self, name: str, *, durable: bool, auto_delete: bool, exclusive: bool, arguments: dict[str, Any]
    ) -> None:
        self.check_writable()
        await self._etcd(self.writer.register_local_queue(
            name, durable=durable, auto_delete=auto_delete, exclusive=exclusive, arguments=arguments, lease=self._lease_now()
        ))

    async def bind_local(self, source: str, queue: str, routing_key: str, arguments: dict[str, Any]) -> None:
        self.check_writable()
        await self._etcd(self.writer.bind(source, queue, routing_key, arguments, to_exchange=False, lease=self._lease_now()))

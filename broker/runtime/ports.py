"""The runtime's ports: what it needs from the things it talks to, as ``Protocol``s.

The runtime carries out the core's effects on three kinds of outside things: the log
(``storage.WriteAheadLog``, or a test's fake), the channels and streams of the API layer
(sinks for their events), and metrics. Naming only what it uses keeps the runtime from
depending on the API layer, lets tests stand in fakes, and gives mypy something to check
instead of ``Any``.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from broker.core import Effect
from broker.storage import LogReader, WALStatistics

__all__ = ["ChannelSink", "ClusterLocksPort", "ClusterPort", "Flushable", "ForwardPlan", "LogPort", "MetricsPort", "PublishForwarder"]


@dataclass
class ForwardPlan:
    """Where a publish goes in a cluster: whether it reaches queues of this node
    (``local``: publish it here too), the live owners it must be forwarded to
    (``owners``), the nack reason when some of its queues' owners are down
    (``refused``), and how many queues it reaches in all (``routed``)."""

    local: bool
    owners: list[str]
    refused: str | None
    routed: int


class PublishForwarder(Protocol):
    """Cluster mode's forwarding of publishes to the nodes owning their queues
    (``broker.cluster``); the gateway asks it about every publish."""

    def plan(self, channel_id: int, exchange: str, routing_key: str, headers: Any) -> ForwardPlan | None:
        """None: every queue the publish reaches is on this node (or it reaches none,
        or ``channel_id`` is a peer's channel, whose publishes are already forwarded):
        publish it here as on a single node."""

    def forward_dead_letter(self, exchange: str, routing_key: str, body: bytes, properties: dict[str, Any]) -> bool:
        """A dead letter that reached no queue of this node: forward it to the nodes
        owning the queues it reaches (at most once: a failure is logged); False when
        it reaches none (it is dropped)."""

    def peer_channel(self, channel_id: int, opened: bool) -> None:
        """Channel ``channel_id``, opened (or now closed) by another node, carries
        publishes that node forwards: :meth:`plan` answers None for them."""

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
        """Forward a publish to ``owner``; ``settle(ack, reason)`` is called once, later
        (never from within ``send``), with the owner's confirm (or a nack when it
        cannot be reached). ``dedup`` False: the owner does not deduplicate it by its
        ``message_id`` (a resend after a lost answer may then be enqueued twice)."""


class ChannelSink(Protocol):
    """Where a channel's events go: the channel or stream handler's outbox."""

    def push(self, effect: Effect) -> None:
        """Queue an event effect (deliver, confirm, return, cancel, expired)."""

    def closing(self, reason: str) -> None:
        """The broker is shutting down: tell the client."""

    def shutdown(self) -> None:
        """Stop taking operations; end once what is queued is sent."""


class Flushable(Protocol):
    """A sink that can send its queued events in the caller's step (``want_flush``)."""

    def flush_nowait(self) -> bool:
        """Send what is queued now if the connection is idle; True if deliveries went
        out and their credit was granted (the core may deliver more)."""
        ...


class LogPort(Protocol):
    """The part of ``storage.WriteAheadLog`` the runtime uses."""

    @property
    def active_first_lsn(self) -> int | None: ...

    @property
    def reader(self) -> LogReader: ...

    def append_nowait(
        self, records: Sequence[tuple[int, bytes]], *, lazy: bool = False, together: bool = False
    ) -> int:
        """Append records; returns the LSN of the last one."""
        ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write and sync appended records until closed."""

    async def sync(self) -> int:
        """Make everything appended durable; returns the durable LSN."""
        ...

    def release_through(self, lsn: int, keep: Container[int] = ()) -> list[str]:
        """Delete the segments a checkpoint at ``lsn`` covers, except ``keep``."""
        ...

    def statistics(self) -> WALStatistics: ...

    def want_reserve(self) -> None:
        """Make the space reserve again when there is room."""
        ...

    async def aclose(self) -> None: ...


class MetricsPort(Protocol):
    """Latencies the runtime and the channels measure as they happen."""

    def observe_fsync(self, duration_s: float) -> None: ...

    def observe_checkpoint(self, duration_s: float) -> None: ...

    def observe_confirm(self, duration_s: float) -> None: ...

    def observe_tick_lateness(self, lateness_s: float) -> None: ...




class ClusterLocksPort(Protocol):
    """Cluster mode's locks, held in etcd for the whole cluster (``broker.cluster``):
    the single node's answers and errors (``LockBusy``, ``NotLockHolder``)."""

    async def acquire(self, name: str, owner: object, ttl_s: object, wait_s: object) -> dict[str, Any]: ...

    async def refresh(self, name: str, owner: object, token: object, ttl_s: object) -> dict[str, Any]: ...

    async def release(self, name: str, owner: object, token: object) -> dict[str, Any]: ...

    async def info(self, name: str) -> dict[str, Any]: ...

    async def infos(self) -> list[dict[str, Any]]: ...


class ClusterPort(PublishForwarder, Protocol):
    """Cluster mode (``broker.cluster``), as the gateway sees it: forwarding of
    publishes, and the metadata changes decided through etcd (applied to this core by
    the node's watch before they return: read-your-writes). Each raises the core's
    errors, and ``Unavailable`` (503) while etcd cannot be reached."""

    #: this node's name, the secret nodes authenticate to one another with, and
    #: how they verify one another's https certificates (None: the system's CAs)
    node_name: str
    secret: str | None
    peer_ssl: ssl.SSLContext | None
    @property
    def locks(self) -> ClusterLocksPort:
        """The cluster's locks."""

    def owner_of(self, queue: str) -> tuple[str, str | None] | None:
        """(owner node, its URL or None while it is down) of a queue of the cluster;
        None for a queue etcd does not have (an exclusive one is this node's own)."""

    def is_replicated(self, queue: str) -> bool:
        """Whether ``queue`` is a quorum queue of the cluster (its leader can change)."""

    async def purge_remote(self, queue: str) -> int:
        """Purge a queue another node owns, on its owner: the ready messages dropped.
        Raises ``Unavailable`` (``queue_unavailable``) while it cannot be reached, and
        the owner's refusal."""

    async def queue_counts(self, queue: str) -> tuple[int, int] | None:
        """(ready messages, consumers) of a queue another node owns, as its owner
        counts them; None while the owner cannot be asked."""

    async def declare_queue(
        self, name: str, *, durable: bool, auto_delete: bool, arguments: dict[str, Any], passive: bool
    ) -> bool:
        """Whether this call created it."""

    async def delete_queue(self, name: str, *, if_unused: bool, if_empty: bool) -> int:
        """The ready messages dropped (as far as this node knows)."""

    async def declare_exchange(
        self, name: str, type: str, *, durable: bool, auto_delete: bool, internal: bool, arguments: dict[str, Any], passive: bool
    ) -> bool:
        """Whether this call created it."""

    async def delete_exchange(self, name: str, *, if_unused: bool) -> None: ...

    async def bind(self, source: str, destination: str, routing_key: str, arguments: dict[str, Any], *, to_exchange: bool) -> None: ...

    async def unbind(self, source: str, destination: str, routing_key: str, arguments: dict[str, Any], *, to_exchange: bool) -> None: ...

    async def register_local_queue(
        self, name: str, *, durable: bool, auto_delete: bool, exclusive: bool, arguments: dict[str, Any]
    ) -> None:
        """A queue this node's core made for a connection alone (exclusive or
        server-named) is put in etcd with the node's lease: every node routes to it,
        none takes its name. Raises ``ResourceLocked`` when the name is taken."""

    async def bind_local(self, source: str, queue: str, routing_key: str, arguments: dict[str, Any]) -> None:
        """A binding to such a queue (already in this core) is put in etcd with the
        node's lease, for every node's routing."""

    def forget_local_queue(self, name: str) -> None:
        """Such a queue left this core: its definition and bindings leave etcd (in the
        background, retried while etcd cannot be reached)."""

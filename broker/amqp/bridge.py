"""Where the AMQP listener meets the runtime: the one module that holds the runtime's
command gateway (``broker.runtime.CommandGateway``), through which every AMQP session
opens and closes core channels, registers their sinks, runs core commands, carries out
their effects and waits for durability, and reads the core (its views).

Per-message commands (a publish, an ack) run without carrying out their effects
(:meth:`RuntimeBridge.now`); the connection carries them out once per received chunk
(:meth:`RuntimeBridge.flush`), as the HTTP channel does with its batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import trio

from broker.core import Broker, BrokerViews
from broker.runtime import BrokerRuntime, ChannelSink, CommandGateway, Flushable

__all__ = ["RuntimeBridge"]

T = TypeVar("T")


class RuntimeBridge:
    """The runtime as the AMQP sessions use it."""

    def __init__(self, runtime: BrokerRuntime) -> None:
        self.runtime = runtime
        self.gateway = CommandGateway(runtime)
        self._batch = self.gateway.batch()

    @property
    def views(self) -> BrokerViews:
        return self.gateway.views

    @property
    def max_body_bytes(self) -> int:
        return self.runtime.options.max_body_bytes

    @property
    def shutting_down(self) -> bool:
        return self.gateway.shutting_down

    @property
    def node_name(self) -> str | None:
        """This node's name in a cluster (None on a single node): direct reply-to
        addresses carry it, so any node can forward a reply to its requester."""
        cluster = self.runtime.cluster
        return cluster.node_name if cluster is not None else None

    def core_for_limits(self) -> Broker:
        """The core, for ``Principal.check_consumer`` (the API layer's per-user cap
        counts consumers from it, as the HTTP channel's consume does)."""
        return self.runtime.core

    def open_connection(self) -> int:
        """A core connection: the owner of the exclusive queues its channels declare
        (they live until :meth:`close_connection`, as RabbitMQ's)."""
        return self.gateway.run(lambda core: core.open_connection())

    def close_connection(self, connection_id: int) -> None:
        """The connection ended (after its channels): its exclusive queues are deleted."""
        self.gateway.run(lambda core: core.close_connection(connection_id))

    def open_channel(self, sink: ChannelSink, principal: Any, connection_id: int) -> int:
        """A core channel of the connection ``connection_id`` whose events go to
        ``sink``; counted against the broker's and the user's channel limits.
        Raises Unavailable, ResourceLimit."""
        gateway = self.gateway
        gateway.check_ready()
        channel_id = gateway.open_channel()
        try:
            gateway.run(lambda core: core.join_connection(channel_id, connection_id))
            if principal is not None:
                principal.open_channel(channel_id)
        except BaseException:
            gateway.close_channel(channel_id, "refused")
            raise
        gateway.attach(channel_id, sink)
        return channel_id

    def close_channel(self, channel_id: int, principal: Any, reason: str) -> None:
        """End the core channel (its unacked deliveries go back to their queues)."""
        if principal is not None:
            principal.close_channel(channel_id)
        self.gateway.close_channel(channel_id, reason)

    def now(self, command: Callable[[Broker], T]) -> T:
        """Run a per-message command; its effects wait for :meth:`flush`."""
        return self._batch.run(command)

    def ack_run(self, channel: Any, tags: list[int]) -> None:
        """Single acks in a row on an AMQP channel (``events.Acks``) in one command; an
        unknown tag raises with the ones before it acked, as that many acks would."""
        channel_id = channel.core_id

        def ack_each(core: Broker) -> None:
            ack = core.ack
            for tag in tags:
                ack(channel_id, tag, False)

        self._batch.run(ack_each)

    def run(self, command: Callable[[Broker], T]) -> T:
        """Run a command and carry out its effects."""
        return self.gateway.run(command)

    async def run_durable(self, command: Callable[[Broker], T]) -> T:
        """Run a command, carry out its effects, wait until what it logged is durable."""
        return await self.gateway.run_durable(command)

    def publish(
        self, channel_id: int, exchange: str, routing_key: str, body: bytes, properties: dict[str, Any] | None,
        mandatory: bool, charge: int, dedup: bool,
    ) -> int:
        """A publish on a channel (effects at :meth:`flush`); its publish tag. ``dedup``:
        whether its ``message_id`` deduplicates it (the connection asked for it)."""
        return self.gateway.publish(channel_id, exchange, routing_key, body, properties, mandatory=mandatory,
                                    charge=charge, dedup=dedup)

    def flush(self) -> None:
        """Carry out every effect the core has produced (deliveries, confirms, log)."""
        self.gateway.flush()

    def want_flush(self, sink: Flushable) -> None:
        """``sink`` queued output while the runtime pumps: the pump's end calls its
        ``flush_nowait`` (once per request)."""
        self.runtime.want_flush(sink)

    # publishing blocked (the runtime's flow signal: a memory or disk alarm) ---------

    def clock(self) -> float:
        """The runtime's clock (trio's), for when a wait began."""
        return trio.current_time()

    @property
    def flow_blocked(self) -> bool:
        return self.runtime.flow.blocked

    @property
    def flow_reason(self) -> str | None:
        return self.runtime.flow.reason

    def subscribe_flow(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` whenever publishing is blocked or resumes; returns the
        function that ends the subscription."""
        return self.runtime.flow.subscribe(lambda _flow: callback())

    async def wait_publishable(self, since: float | None) -> str | None:
        """Wait while publishing is blocked: None once a publish may go, else the
        reason it is refused (``blocked_publish_wait_s`` passed since ``since``)."""
        return await self.gateway.wait_publishable(since=since)

    def refuse_publish(self, channel_id: int, reason: str) -> int | None:
        """Number and nack a publish the wait refused; None on a transactional channel
        (then publish it as usual)."""
        return self.gateway.refuse_publish(channel_id, reason)

    def grant_credit(self, channel_id: int, nbytes: int) -> None:
        """The socket took ``nbytes`` of this channel's deliveries: more may come."""
        self._batch.run(lambda core: core.grant_credit(channel_id, nbytes))

"""Where the AMQP listener meets the runtime: the one module that opens and closes core
channels, registers their sinks, pumps effects and waits for durability.

Every AMQP session goes through :class:`RuntimeBridge` for these steps (and calls the
``Broker`` facade's commands for the rest), so moving them onto another entry point
of the runtime is a change to this file only.
"""

from __future__ import annotations

from typing import Any

from broker.core import Broker
from broker.runtime import BrokerRuntime, ChannelSink

__all__ = ["RuntimeBridge"]


class RuntimeBridge:
    """The runtime as the AMQP sessions use it."""

    def __init__(self, runtime: BrokerRuntime) -> None:
        self.runtime = runtime

    @property
    def core(self) -> Broker:
        return self.runtime.core

    @property
    def max_body_bytes(self) -> int:
        return self.runtime.options.max_body_bytes

    @property
    def shutting_down(self) -> bool:
        return self.runtime.shutting_down

    @property
    def metrics(self) -> Any:
        return self.runtime.metrics

    def open_channel(self, sink: ChannelSink, principal: Any) -> int:
        """A core channel whose events go to ``sink``; counted against the broker's
        and the user's channel limits. Raises Unavailable, ResourceLimit."""
        runtime = self.runtime
        runtime.check_ready()
        runtime.check_channel_room()
        core = runtime.core
        channel_id = core.open_channel()
        try:
            if principal is not None:
                principal.open_channel(channel_id)
        except BaseException:
            core.close_channel(channel_id, "refused")
            raise
        runtime.add_sink(channel_id, sink)
        return channel_id

    def close_channel(self, channel_id: int, principal: Any, reason: str) -> None:
        """End the core channel (its unacked deliveries go back to their queues)."""
        if principal is not None:
            principal.close_channel(channel_id)
        runtime = self.runtime
        runtime.remove_sink(channel_id)
        runtime.core.close_channel(channel_id, reason)
        runtime.pump()

    def detach(self, channel_id: int) -> None:
        """No more events for this channel (it is closing)."""
        self.runtime.remove_sink(channel_id)

    def pump(self) -> None:
        self.runtime.pump()

    def grant_credit(self, channel_id: int, nbytes: int) -> None:
        """The socket took ``nbytes`` of this channel's deliveries: more may come."""
        self.runtime.core.grant_credit(channel_id, nbytes)

    async def wait_durable(self) -> None:
        await self.runtime.wait_durable()

    def observe_confirm(self, seconds: float) -> None:
        metrics = self.runtime.metrics
        if metrics is not None:
            metrics.observe_confirm(seconds)

"""A channel's per-message commands (publish, ack) on a single node, as one object the
compiled channel path calls without a Python call per message.

:meth:`CommandGateway.channel_ops` hands it out, so it is still the gateway's door:
:meth:`ChannelOps.publish` is what ``CommandGateway.publish`` does when the node is
not clustered (the core's publish, then the confirm book tracks it), and the acks
are the core's. Effects wait for the channel's ``CommandBatch.flush``, as for every
command of a batch. In cluster mode a publish may be forwarded to other nodes, which
only the gateway does: the caller checks ``runtime.cluster`` and goes through
``CommandGateway.publish`` then. Compiled in the compiled build (docs/architecture.md,
"The compiled build").
"""

from __future__ import annotations

from typing import Any

from broker.core import Broker
from broker.runtime.confirms import PendingConfirms

__all__ = ["ChannelOps"]


class ChannelOps:
    """Publish and ack on one channel, straight into the core's components (the
    typed calls let the compiled build call them natively)."""

    __slots__ = ("channel_id", "_publishing", "_deliveries", "_confirms")

    def __init__(self, core: Broker, confirms: PendingConfirms, channel_id: int) -> None:
        self.channel_id = channel_id
        # (their types, inferred from the core's attributes, make the calls native)
        self._publishing = core.publishing
        self._deliveries = core.deliveries
        self._confirms = confirms

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        mandatory: bool,
        delay_s: float | None,
        charge: int,
        dedup: bool = True,
    ) -> int:
        """``CommandGateway.publish`` on a single node; the publish tag."""
        channel_id = self.channel_id
        tag, _routed = self._publishing.publish(
            channel_id, exchange, routing_key, body, properties, mandatory=mandatory, delay_s=delay_s, dedup=dedup
        )
        self._confirms.track(channel_id, tag, charge)
        return tag

    def ack(self, delivery_tag: object, multiple: bool) -> None:
        """The core's ``ack`` (an unknown tag raises its ``ChannelError``)."""
        self._deliveries.ack(self.channel_id, delivery_tag, multiple)

    def ack_each(self, tags: list[int]) -> None:
        """Ack each of ``tags`` in order (an unknown one raises, the ones before it
        stay acked: as many ``ack`` ops would)."""
        ack = self._deliveries.ack
        channel_id = self.channel_id
        for tag in tags:
            ack(channel_id, tag, False)

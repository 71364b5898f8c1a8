"""The core's tunables, with their defaults: written here and nowhere else.

The broker's settings table (``broker/config``) takes each default from here, and the
runtime's options extend this class, so one value reaches the core from flags,
environment, file or a test without being restated on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CoreConfig"]


@dataclass(frozen=True)
class CoreConfig:
    """What :class:`~broker.core.Broker` is built with (units in the names)."""

    #: A publish whose message_id was seen this recently is acked, not enqueued (0: off).
    dedup_window_s: float = 120.0
    #: Ack timeout of a delivery whose consume named none.
    consumer_timeout_s: float = 1800.0
    #: Lease of a REST get that names none; and the longest a client may ask for.
    default_lease_s: float = 30.0
    max_lease_s: float = 43200.0
    #: An auto-delete queue read over REST (gets, long-polls) is deleted once it has had
    #: no reader, no lease out and no message this long (see Delays.rest_read).
    auto_delete_grace_s: float = 5.0
    #: A channel's delivery credit: bytes of deliveries its connection may hold unsent.
    channel_buffer_bytes: int = 1 << 20
    max_queues: int = 10000
    max_exchanges: int = 10000
    #: AMQP 0-9-1's basic.qos prefetch-count is a short: 65535 is the protocol's ceiling.
    max_prefetch: int = 65535
    #: Ready messages a durable queue keeps in memory; the rest stay paged out in the log.
    queue_memory_messages: int = 2048
    #: Give up on a message whose record is really unreadable (corrupt, missing) rather
    #: than keep it and its queue waiting: an operator's explicit choice. LOSES DATA.
    repair: bool = False

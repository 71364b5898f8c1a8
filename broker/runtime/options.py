"""The runtime's share of the settings (see ``docs/operations.md`` for their meaning).

:class:`RuntimeOptions` extends the core's :class:`~broker.core.CoreConfig`: the
runtime builds the core from the same object, so each default is written once, in the
layer that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.core import CoreConfig
from broker.storage import DEFAULT_RESERVE_BYTES

__all__ = ["RuntimeOptions"]


@dataclass(frozen=True)
class RuntimeOptions(CoreConfig):
    """What the runtime and the core it owns are built with."""

    data_dir: Path | None = None  # None: memory only, nothing written
    fsync: str = "always"
    segment_max_bytes: int = 64 << 20
    checkpoint_interval_s: float = 300.0
    checkpoint_wal_bytes: int = 256 << 20
    #: Disk space kept in ``<data_dir>/reserve`` so a checkpoint can be written on a
    #: full disk (and free the log it covers); 0: none.
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    max_channels: int = 2048
    #: The memory alarm's threshold (broker/runtime/memory.py): a fraction of the
    #: memory the broker may use (its cgroup's limit, else the machine's) when at most
    #: 1, a size in bytes above 1, 0: no alarm. RabbitMQ's default is 0.6 of the
    #: machine; 0.4 leaves room for the log's and checkpoints' buffers.
    memory_high_watermark: float = 0.4
    #: How long a publish waits while publishing is blocked (memory or disk alarm)
    #: before it is refused (HTTP 503 with Retry-After, a channel's nack).
    blocked_publish_wait_s: float = 5.0
    max_wait_s: float = 60.0
    max_body_bytes: int = 16 << 20
    # Security (docs/security.md). The per-user caps play the part of RabbitMQ's
    # per-user max-connections / max-channels limits, which are off by default there;
    # here they are on, generous enough for any one service, low enough that one
    # leaked credential cannot take every connection or channel of the broker.
    #: Requests in progress per user (each holds one HTTP/1.1 connection).
    max_connections_per_user: int = 1000
    #: Open channels per user.
    max_channels_per_user: int = 500
    #: Consumers per user (channel consumers and streaming consumes).
    max_consumers_per_user: int = 2000
    #: Failed authentications per client address and user name within
    #: ``auth_failure_window_s`` before that name from that address is answered 429
    #: (fail2ban's default is 5 in 10 minutes); ten times as many per address, all names
    #: together (``broker.api.auth.ADDRESS_FAILURE_FACTOR``).
    auth_failure_limit: int = 10
    auth_failure_window_s: float = 60.0

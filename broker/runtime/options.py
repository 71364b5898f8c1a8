"""The runtime's share of the settings (see ``docs/operations.md`` for their meaning)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["RuntimeOptions"]


@dataclass
class RuntimeOptions:
    """What the runtime and the core it owns are built with."""

    data_dir: Path | None = None  # None: memory only, nothing written
    fsync: str = "always"
    segment_max_bytes: int = 64 << 20
    checkpoint_interval_s: float = 300.0
    checkpoint_wal_bytes: int = 256 << 20
    queue_memory_messages: int = 2048
    repair: bool = False
    dedup_window_s: float = 120.0
    default_lease_s: float = 30.0
    max_lease_s: float = 43200.0
    consumer_timeout_s: float = 1800.0
    channel_buffer_bytes: int = 1 << 20
    max_queues: int = 10000
    max_exchanges: int = 10000
    max_prefetch: int = 65535
    max_channels: int = 2048
    max_wait_s: float = 60.0
    max_body_bytes: int = 16 << 20

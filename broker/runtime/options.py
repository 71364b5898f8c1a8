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
    max_wait_s: float = 60.0
    max_body_bytes: int = 16 << 20

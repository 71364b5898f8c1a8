"""The runtime: carries out the core's effects with trio.

It owns the sans-IO core, the write-ahead log, the timers and the checkpoint schedule
(``checkpoints.py``), and glues recovery together at start (``recovery.py``). It talks
to the log, the channels and metrics through typed ports (``ports.py``). It imports the
core and storage, never the HTTP server or the API layer: those call into it, through
one door, the :class:`CommandGateway` (``gateway.py``), which runs a core command,
carries out its effects and waits for durability where asked. ``confirms.py`` is the
one book of publishes waiting for their confirm. ``flow.py`` is the one signal that
publishing is blocked (the memory alarm of ``memory.py``, the disk alarm of
``space.py``), which every protocol follows; ``history.py`` keeps the last minutes of
rates and depths for the management UI; ``taps.py`` lets a layer above see a kind of
effect first (replicated queues copy their records).
"""

from broker.runtime.build import build_name
from broker.runtime.checkpoints import Checkpointer
from broker.runtime.confirms import PendingConfirms, PublishWaiter
from broker.runtime.flow import ALARM_DISK, ALARM_MEMORY, FlowControl
from broker.runtime.gateway import CommandBatch, CommandGateway, PublishOutcome
from broker.runtime.history import RateHistory
from broker.runtime.memory import (
    MemoryMonitor,
    memory_limit_bytes,
    process_rss_bytes,
    resolve_watermark,
)
from broker.runtime.options import RuntimeOptions
from broker.runtime.ports import (
    ChannelSink,
    ClusterLocksPort,
    ClusterPort,
    Flushable,
    ForwardPlan,
    LogPort,
    MetricsPort,
    PublishForwarder,
)
from broker.runtime.resources import disk_info, fd_info
from broker.runtime.runtime import BrokerRuntime
from broker.runtime.taps import (
    take_held_dead_letters,
    tap_auto_deleted_queues,
    tap_records,
)
from broker.runtime.waits import LockWait

__all__ = [
    "build_name",
    "ALARM_DISK",
    "ALARM_MEMORY",
    "FlowControl",
    "disk_info",
    "fd_info",
    "MemoryMonitor",
    "RateHistory",
    "memory_limit_bytes",
    "process_rss_bytes",
    "resolve_watermark",
    "BrokerRuntime",
    "take_held_dead_letters",
    "tap_auto_deleted_queues",
    "ChannelSink",
    "ClusterLocksPort",
    "ClusterPort",
    "Checkpointer",
    "CommandBatch",
    "CommandGateway",
    "LockWait",
    "PendingConfirms",
    "PublishOutcome",
    "PublishWaiter",
    "Flushable",
    "ForwardPlan",
    "PublishForwarder",
    "LogPort",
    "MetricsPort",
    "RuntimeOptions",
    "tap_records",
]

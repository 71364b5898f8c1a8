"""How the runtime answers the log's reports: durable, failed, recovered, fsynced.

The write-ahead log reports back through the :class:`~broker.runtime.recovery.WALCallbacks`
it is opened with. Records durable up to an LSN: the core releases the confirms that
waited on them (``Broker.durable``), REST calls parked for them wake, the pump carries
out what follows. A write failed: the core nacks and undoes the publishes it held and
refuses persistent ones, their REST waiters get the failure, and a full disk asks for a
checkpoint at once (it is what frees the log). Writes succeed again: the core accepts
publishes again. An fsync's duration goes to ``GET /overview`` and the metrics.
:class:`LogReports` holds these answers; the runtime hands its :meth:`LogReports.callbacks`
to the log.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

from broker.core import Broker
from broker.runtime.checkpoints import Checkpointer
from broker.runtime.ports import MetricsPort
from broker.runtime.recovery import WALCallbacks
from broker.runtime.space import DiskSpaceAlarm
from broker.runtime.waits import Waits

__all__ = ["LogReports"]

log = logging.getLogger("ackbus.runtime")


class LogReports:
    """The runtime's answers to the log's reports (see the module docstring). Owns the
    latest fsync's duration."""

    def __init__(
        self,
        core: Broker,
        waits: Waits,
        space: DiskSpaceAlarm,
        checkpointer: Checkpointer | None,
        metrics: MetricsPort | None,
        *,
        pump: Callable[[], None],
        inline_allowed: Callable[[], bool],
    ) -> None:
        """``pump``: carries out the core's effects (``BrokerRuntime.pump``);
        ``inline_allowed``: whether the log may fsync a small batch on the event loop
        now (the runtime knows whether a delivery went out)."""
        self._core = core
        self._waits = waits
        self._space = space
        self._checkpointer = checkpointer
        self._metrics = metrics
        self._pump = pump
        self._inline_allowed = inline_allowed
        self.last_fsync_s: float | None = None  # the latest fsync's duration (GET /overview)

    def callbacks(self) -> WALCallbacks:
        """How a log reports back: recovery's log, or a stand-in set as the runtime's
        ``wal``."""
        return WALCallbacks(
            on_durable=self.on_durable, on_failure=self.on_failure, on_recovered=self.on_recovered,
            on_fsync=self.on_fsync, on_reserve=self._space.on_reserve, inline_allowed=self._inline_allowed,
        )

    def on_durable(self, lsn: int) -> None:
        self._core.durable(lsn)
        self._waits.release_durable(lsn, None)
        self._pump()

    def on_failure(self, first_lsn: int, last_lsn: int, exc: BaseException) -> None:
        log.error(
            "log write failed; refusing persistent publishes until writes succeed",
            extra={"fields": {"first_lsn": first_lsn, "last_lsn": last_lsn, "error": str(exc)}},
        )
        self._core.storage_failed(first_lsn, last_lsn, str(exc))
        self._waits.release_durable(last_lsn, str(exc))
        self._pump()
        disk_full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
        self._space.log_full = disk_full
        if disk_full and self._checkpointer is not None:
            # A checkpoint (written into the space reserve) is what frees the log the
            # disk is full of: do not wait for the next size or time trigger.
            self._checkpointer.request()

    def on_recovered(self) -> None:
        log.warning("log writes succeed again; accepting persistent publishes")
        self._space.log_full = False
        self._core.storage_recovered()
        self._pump()

    def on_fsync(self, duration_s: float) -> None:
        self.last_fsync_s = duration_s
        if self._metrics is not None:
            self._metrics.observe_fsync(duration_s)

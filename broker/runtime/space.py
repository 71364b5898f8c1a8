"""The disk-space alarm: publishes refused while the log's space reserve is used up.

The log keeps a space reserve (``reserve_bytes``) so a checkpoint can still be written
on a full disk. Once a checkpoint had to use it, or the log could not make it again,
:class:`DiskSpaceAlarm` makes the core refuse persistent publishes to durable queues
(nacked with the reason; acks, purges and deletes still work, since they are what
frees the log) and raises the disk alarm of the runtime's
:class:`~broker.runtime.flow.FlowControl`, so publishers get the same signal as for
the memory alarm; both end when the reserve is in place again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.core import Broker
from broker.runtime.flow import ALARM_DISK, FlowControl
from broker.runtime.ports import LogPort

__all__ = ["DiskSpaceAlarm"]

log = logging.getLogger("ackbus.runtime")

_REFUSAL = "disk full: the space reserve is used up; publishes are refused until consumed messages free log space"


class DiskSpaceAlarm:
    """The log's and the checkpointer's reports about disk space, turned into the
    core's publish refusal and the flow signal."""

    def __init__(self, core: Broker, flow: FlowControl, pump: Callable[[], None], wal: Callable[[], LogPort | None]) -> None:
        self._core = core
        self._flow = flow
        self._pump = pump
        self._wal = wal
        #: the log's writes fail with ENOSPC (set and cleared by the runtime)
        self.log_full = False

    def on_reserve(self, in_place: bool) -> None:
        """The log made (or could not make) its space reserve."""
        if in_place:
            if self._core.publish_refusal is not None:
                log.warning("space reserve in place again; accepting persistent publishes")
            self._core.accept_publishes()
            self._flow.clear_alarm(ALARM_DISK)
        else:
            self.refuse()
        self._pump()

    def on_reserve_used(self) -> None:
        """A checkpoint on a full disk used the space reserve."""
        self.refuse()
        wal = self._wal()
        if wal is not None:
            wal.want_reserve()
        self._pump()

    def space_wanted(self) -> bool:
        """Publishes are refused for want of disk space (the reserve used up, or the
        log's writes failing with ENOSPC)."""
        return self.log_full or self._core.publish_refusal is not None

    def refuse(self) -> None:
        if self._core.publish_refusal is None:
            log.error(
                "disk nearly full: the space reserve is used up; refusing persistent publishes "
                "until acks and checkpoints free log space (acks, purges and deletes still work)"
            )
        self._core.refuse_publishes(_REFUSAL)
        self._flow.raise_alarm(ALARM_DISK, _REFUSAL)

"""Effects that only tell the operator: log lines and the counters metrics export.

Some of the core's effects need nothing carried out, only told: a paged-out message
given up under ``--repair`` (``MessageLost``), a failed read of one that is kept and
retried (``LogReadFailed``), a queue the broker deleted by itself
(``QueueAutoDeleted``; cluster mode taps it, taps.py), a schedule's tick and how late
it fired (``TickFired``, a histogram). :class:`Notices` is their entry in the runtime's
effect table, and keeps the counts ``/metrics`` reads.
"""

from __future__ import annotations

import logging

from broker.core import LogReadFailed, MessageLost, QueueAutoDeleted, TickFired
from broker.runtime.ports import MetricsPort

__all__ = ["Notices"]

log = logging.getLogger("ackbus.runtime")


class Notices:
    """The effects only told (see the module docstring), and their counts."""

    def __init__(self, metrics: MetricsPort | None) -> None:
        self._metrics = metrics
        self.messages_lost = 0  # paged-out messages given up (only with --repair)
        self.log_read_failures = 0  # failed reads of paged-out messages (kept, retried)

    def queue_auto_deleted(self, effect: QueueAutoDeleted) -> None:
        # (cluster mode taps it: the queue's definition goes from etcd too)
        log.debug("queue deleted", extra={"fields": {"queue": effect.queue, "reason": effect.reason}})

    def message_lost(self, effect: MessageLost) -> None:
        self.messages_lost += 1
        log.error(
            "message lost: its record cannot be read back from the log",
            extra={"fields": {"queue": effect.queue, "seq": effect.seq, "lsn": effect.lsn, "reason": effect.reason}},
        )

    def log_read_failed(self, effect: LogReadFailed) -> None:
        self.log_read_failures += 1
        log.error(
            "reading a queued message back from the log failed; it keeps its place and "
            "its queue waits until a retry reads it",
            extra={
                "fields": {
                    "queue": effect.queue,
                    "lsn": effect.lsn,
                    "reason": effect.reason,
                    "transient": effect.transient,
                    "retry_in_s": round(effect.retry_in_s, 3),
                }
            },
        )

    def tick_fired(self, effect: TickFired) -> None:
        if self._metrics is not None:
            self._metrics.observe_tick_lateness(effect.lateness_s)

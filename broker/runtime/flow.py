"""Whether publishers must wait: :class:`FlowControl`, the one runtime-level signal.

RabbitMQ blocks its publishers while a resource alarm is raised (memory above its
high watermark, free disk below its limit) and lets them go once the alarm clears;
ackbus does the same, with one signal any protocol can follow:

* ``flow.blocked`` (a bool, cheap to read per publish) and ``flow.reason`` (why, for
  the refusal a publisher gets);
* ``flow.changed``: a trio event set (and replaced) at every change, for a task that
  waits; ``flow.subscribe(callback)``: a function called with the signal at every
  change, for a protocol that tells its clients (a channel's ``flow`` event, AMQP's
  ``connection.blocked``);
* ``await flow.wait_unblocked(deadline)``: what the command gateway does before a
  publish while blocked (True once it clears, False at the deadline).

Alarms are raised and cleared by their owners (the memory monitor, the disk-space
alarm of ``space.py``); the signal is blocked while any alarm is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

__all__ = ["ALARM_DISK", "ALARM_MEMORY", "FlowControl"]

log = logging.getLogger("ackbus.flow")

ALARM_MEMORY = "memory"
ALARM_DISK = "disk"

#: How long a refused publisher is told to wait before trying again, by alarm: memory
#: is sampled twice a second, while disk space comes back with a checkpoint.
_RETRY_AFTER_S = {ALARM_MEMORY: 1, ALARM_DISK: 5}


class FlowControl:
    """Publishing blocked or not, and why (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        #: Raised alarms: kind -> reason, in the order they were raised.
        self.alarms: dict[str, str] = {}
        self.blocked = False
        self.reason: str | None = None
        #: When the signal last turned blocked (the clock's time; None while not).
        self.blocked_since: float | None = None
        self.changed = trio.Event()
        #: Publishes refused because publishing stayed blocked (or their deadline came).
        self.refused = 0
        self._subscribers: list[Callable[[FlowControl], None]] = []

    @property
    def retry_after_s(self) -> int:
        """Seconds a refused publisher should wait before its next try."""
        return max((_RETRY_AFTER_S.get(kind, 1) for kind in self.alarms), default=1)

    def raise_alarm(self, kind: str, reason: str) -> None:
        """Alarm ``kind`` is raised (again, maybe with a new reason)."""
        fresh = kind not in self.alarms
        self.alarms[kind] = reason
        if fresh:
            log.warning("publishing blocked: %s alarm", kind, extra={"fields": {"alarm": kind, "reason": reason}})
            self._update()
        else:  # the same alarm, newer words: no change to announce
            self.reason = "; ".join(self.alarms.values())

    def clear_alarm(self, kind: str) -> None:
        """Alarm ``kind`` is over (nothing if it was not raised)."""
        if self.alarms.pop(kind, None) is not None:
            log.warning("%s alarm cleared", kind, extra={"fields": {"alarm": kind, "blocked": bool(self.alarms)}})
            self._update()

    def subscribe(self, callback: Callable[[FlowControl], None]) -> Callable[[], None]:
        """Call ``callback(flow)`` at every change from now on; returns the function
        that ends the subscription. A callback must not block or raise."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            try:
                self._subscribers.remove(callback)
            except ValueError:
                pass

        return unsubscribe

    async def wait_unblocked(self, deadline: float) -> bool:
        """Wait until the signal is not blocked (True) or ``deadline`` passes (False,
        still blocked). Returns at once when not blocked."""
        with trio.move_on_at(deadline):
            while self.blocked:
                await self.changed.wait()
        return not self.blocked

    def info(self) -> dict[str, object]:
        """For ``/healthz`` and ``/overview``: blocked, why, and each raised alarm."""
        return {"blocked": self.blocked, "reason": self.reason, "alarms": dict(self.alarms)}

    def _update(self) -> None:
        self.blocked = bool(self.alarms)
        self.reason = "; ".join(self.alarms.values()) if self.alarms else None
        if self.blocked and self.blocked_since is None:
            self.blocked_since = self._clock()
        elif not self.blocked:
            self.blocked_since = None
        changed, self.changed = self.changed, trio.Event()
        changed.set()
        for callback in list(self._subscribers):
            callback(self)

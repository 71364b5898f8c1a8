"""When one AMQP connection's queued output goes out, and the delivery credit it gives back.

The core stops delivering to a channel once the bytes of its deliveries not yet taken
by the socket pass a bound (its delivery credit); the connection gives that credit back
once the socket took them. Deliveries are queued while the runtime pumps, so the
pump's end (:meth:`DeliveryCredit.flush_nowait`, the runtime's
``Flushable``) sends them in that same step when the writer task is idle: one write
for all of them, no wake-up of the writer, and their credit back at once, so the same
pump goes on with the next deliveries (as the HTTP channel's
``ServedChannel.flush_nowait``). Otherwise, and on TLS, the writer sends them and then
gives the credit back (:meth:`DeliveryCredit.grant`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from broker.amqp.bridge import RuntimeBridge

__all__ = ["DeliveryCredit"]


class DeliveryCredit:
    """One connection's output flush and credit return (see the module docstring).

    ``channels`` gives the connection's open channels (each with its ``core_id`` and the
    ``credit`` of its deliveries queued for the socket); ``wake`` wakes the writer."""

    def __init__(self, bridge: RuntimeBridge, channels: Callable[[], Iterable[Any]], wake: Callable[[], None]) -> None:
        self._bridge = bridge
        self._channels = channels
        self._wake = wake
        #: Deliveries were queued whose credit is not given back yet.
        self.pending = False
        #: Asked the runtime for a ``flush_nowait`` (at most once per pump).
        self._flush_asked = False
        #: Set by the IO layer: send the connection's output in the caller's step if
        #: the writer is idle; True if the socket took all of it (else the writer
        #: sends what is left).
        self.write_nowait: Callable[[], bool] = lambda: False

    def delivered(self) -> None:
        """A delivery was queued while the runtime pumps (its channel counted its credit)."""
        self.pending = True
        if not self._flush_asked:
            self._flush_asked = True
            self._bridge.want_flush(self)

    def flush_nowait(self) -> bool:
        """Called by the runtime's pump: send the queued output now if the writer is
        idle, else wake the writer. True if deliveries went out and their credit was
        given back (the pump carries out what the core does with it)."""
        self._flush_asked = False
        if not self.write_nowait():
            self._wake()
            return False
        return self._give_back()

    def grant(self) -> None:
        """The socket took what was queued (a write outside a pump): give back its
        credit and carry out what the core does with it."""
        if self._give_back():
            self._bridge.flush()

    def _give_back(self) -> bool:
        if not self.pending:
            return False
        self.pending = False
        granted = False
        grant_credit = self._bridge.grant_credit
        for ch in self._channels():
            if ch.credit:
                grant_credit(ch.core_id, ch.credit)
                ch.credit = 0
                granted = True
        return granted

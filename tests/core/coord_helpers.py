"""Restarting a core test broker from its log, or from a snapshot and the log after it."""

from __future__ import annotations

from typing import Any

from broker.core import Broker

from .helpers import Harness, broker_kwargs


def restart(h: Harness, *, keep: int | None = None, snapshot: list[tuple[int, bytes]] | None = None,
            snapshot_lsn: int = 0, **kwargs: Any) -> None:
    """Replace ``h.b`` by a broker recovered from ``h``'s log (the records up to LSN
    ``keep`` only: a crash that lost the rest), after ``snapshot`` records when given.
    The clocks go on."""
    h.step()
    if keep is not None:  # the crash lost the records after ``keep``
        h.records = [r for r in h.records if r[0] <= keep]
        h.log = {lsn: (rtype, payload) for lsn, rtype, payload in h.records}
    records = [r for r in h.records if r[0] > snapshot_lsn]
    kwargs.setdefault("boot_id", "b1")
    kwargs.setdefault("read_log", h.read_log)
    b = Broker(clock=h.mono, wall_clock=h.wall, **broker_kwargs(kwargs))
    b.begin_recovery()
    for rtype, payload in snapshot or ():
        b.replay(rtype, payload, 0)
    for lsn, rtype, payload in records:
        b.replay(rtype, payload, lsn)
    last = h.records[-1][0] if h.records else 0
    b.finish_recovery(max(last, snapshot_lsn))
    h.b = b


def take_snapshot(h: Harness) -> tuple[int, list[tuple[int, bytes]]]:
    h.step()
    lsn, chunks = h.b.snapshot()
    return lsn, [r for chunk in chunks for r in chunk]

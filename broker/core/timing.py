"""When a schedule fires: cron expressions in a time zone, fixed intervals, one time.

Pure functions of wall-clock epoch seconds. A :class:`Timing` answers two questions:
the next tick strictly after a time (for the timer and ``GET``), and the newest ticks
in a window ``(after, upto]`` (what is due, and what a catch-up after downtime fires).

Cron: five fields (minute hour day-of-month month day-of-week) read by the ``cronsim``
library, in an IANA time zone (``zoneinfo``; default UTC). Daylight-saving transitions
follow cronsim, which follows Debian's cron: a time that does not exist on the day
clocks go forward fires once, at the first valid minute after the gap; a time that
exists twice on the day clocks go back fires once, at its first occurrence. Ticks are
whole seconds.

Interval: ticks at ``start + k * interval_s`` for k = 0, 1, 2...; one time (``at``): a
single tick. Both are computed arithmetically, so a long downtime costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import InvalidArgument

__all__ = [
    "Timing",
    "parse_timing",
    "parse_time",
    "check_cron",
    "check_timezone",
    "iso_utc",
    "MIN_INTERVAL_S",
    "MAX_INTERVAL_S",
    "TIMING_FIELDS",
]

#: Shortest and longest fixed interval.
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 366 * 86400.0
#: Furthest future of an ``at`` or interval ``start`` (about 100 years from the epoch
#: origin would overflow nothing, but a typo of a year 30000 must be refused).
_MAX_EPOCH_S = 4102444800.0  # 2100-01-01
#: How far back a cron search looks for the newest tick before giving up (a valid
#: expression fires at least once in 4 years: 29 February).
_CRON_MAX_STEPS = 100_000
#: The request fields that define a timing.
TIMING_FIELDS = frozenset({"cron", "timezone", "interval_s", "start", "at"})


@dataclass(frozen=True, slots=True)
class Timing:
    """One schedule's timing: ``kind`` is ``cron``, ``interval`` or ``at``."""

    kind: str
    cron: str | None = None
    timezone: str | None = None
    interval_s: float | None = None
    start: float | None = None  # interval: the first tick; at: the one tick

    def to_json(self) -> dict[str, Any]:
        if self.kind == "cron":
            return {"cron": self.cron, "timezone": self.timezone}
        if self.kind == "interval":
            return {"interval_s": self.interval_s, "start": self.start}
        return {"at": self.start}

    def _zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone or "UTC")

    def next_after(self, after: float) -> float | None:
        """The first tick strictly after ``after`` (None: there is none)."""
        if self.kind == "at":
            assert self.start is not None
            return self.start if self.start > after else None
        if self.kind == "interval":
            assert self.start is not None and self.interval_s is not None
            if after < self.start:
                return self.start
            k = math.floor((after - self.start) / self.interval_s) + 1
            tick = self.start + k * self.interval_s
            while tick <= after:  # (float rounding)
                k += 1
                tick = self.start + k * self.interval_s
            return tick
        assert self.cron is not None
        start = datetime.fromtimestamp(math.floor(after), self._zone())
        return next(CronSim(self.cron, start)).timestamp()

    def due(self, after: float, upto: float, limit: int) -> tuple[list[float], int]:
        """The newest ``limit`` ticks in ``(after, upto]``, oldest first, and how many
        ticks that window holds in all (for cron, counted only up to ``limit + 1``:
        enough to know some were left out)."""
        if upto <= after or limit <= 0:
            return [], 0
        if self.kind == "at":
            assert self.start is not None
            return ([self.start], 1) if after < self.start <= upto else ([], 0)
        if self.kind == "interval":
            assert self.start is not None and self.interval_s is not None
            if upto < self.start:
                return [], 0
            last = math.floor((upto - self.start) / self.interval_s)
            first = 0 if after < self.start else math.floor((after - self.start) / self.interval_s) + 1
            while first <= last and self.start + first * self.interval_s <= after:
                first += 1
            while last >= first and self.start + last * self.interval_s > upto:
                last -= 1
            total = max(0, last - first + 1)
            lo = max(first, last - limit + 1)
            return [self.start + k * self.interval_s for k in range(lo, last + 1)], total
        assert self.cron is not None
        # newest first, backwards from upto (ticks are whole seconds: a start one
        # second past floor(upto) without microseconds yields ticks <= upto)
        zone = self._zone()
        it = CronSim(self.cron, datetime.fromtimestamp(math.floor(upto) + 1, zone), reverse=True)
        ticks: list[float] = []
        for _ in range(min(limit + 1, _CRON_MAX_STEPS)):
            tick = next(it).timestamp()
            if tick <= after:
                break
            ticks.append(tick)
        total = len(ticks)
        return sorted(ticks[:limit]), total


def parse_timing(obj: dict[str, Any], now: float) -> Timing:
    """The timing of a schedule definition (the fields in TIMING_FIELDS): exactly one
    of ``cron`` (with an optional ``timezone``), ``interval_s`` (with an optional
    ``start``, default one interval from ``now``) and ``at``. Times are epoch seconds
    or ISO 8601 strings with an offset. Raises InvalidArgument saying what is wrong."""
    kinds = [k for k in ("cron", "interval_s", "at") if obj.get(k) is not None]
    if len(kinds) != 1:
        raise InvalidArgument("give exactly one timing: cron, interval_s or at")
    kind = kinds[0]
    if kind != "cron" and obj.get("timezone") is not None:
        raise InvalidArgument("timezone goes with cron only")
    if kind != "interval_s" and obj.get("start") is not None:
        raise InvalidArgument("start goes with interval_s only")
    if kind == "cron":
        return Timing("cron", cron=check_cron(obj["cron"]), timezone=check_timezone(obj.get("timezone", "UTC")))
    if kind == "interval_s":
        interval = obj["interval_s"]
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not (
            MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S
        ):
            raise InvalidArgument(f"interval_s must be a number of seconds {MIN_INTERVAL_S:g}..{MAX_INTERVAL_S:g}")
        start = obj.get("start")
        first = parse_time(start, "start") if start is not None else now + float(interval)
        return Timing("interval", interval_s=float(interval), start=first)
    return Timing("at", start=parse_time(obj["at"], "at"))


def check_cron(expr: object) -> str:
    """A five-field cron expression, normalized (single spaces). Raises InvalidArgument."""
    if not isinstance(expr, str):
        raise InvalidArgument("cron must be a string")
    fields = expr.split()
    if len(fields) != 5:
        raise InvalidArgument(
            f"cron must have 5 fields (minute hour day-of-month month day-of-week), not {len(fields)}"
        )
    normalized = " ".join(fields)
    try:
        CronSim(normalized, datetime.fromtimestamp(0, timezone.utc))
    except CronSimError as exc:
        raise InvalidArgument(f"bad cron expression {normalized!r}: {exc}") from None
    return normalized


def check_timezone(name: object) -> str:
    """An IANA time zone name that zoneinfo knows. Raises InvalidArgument."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InvalidArgument("timezone must be an IANA time zone name such as 'Europe/Paris'")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"unknown time zone {name!r}") from None
    return name


def parse_time(value: object, what: str) -> float:
    """Epoch seconds from a number or an ISO 8601 string with an offset (``Z`` too)."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{what} must be epoch seconds or an ISO 8601 time with an offset")
    if isinstance(value, (int, float)):
        t = float(value)
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidArgument(f"{what}: {value[:64]!r} is not an ISO 8601 time") from None
        if parsed.tzinfo is None:
            raise InvalidArgument(f"{what} must carry a UTC offset (such as Z or +02:00)")
        t = parsed.timestamp()
    else:
        raise InvalidArgument(f"{what} must be epoch seconds or an ISO 8601 time with an offset")
    if not math.isfinite(t) or not 0 <= t <= _MAX_EPOCH_S:
        raise InvalidArgument(f"{what} is out of range (1970..2100)")
    return t


def iso_utc(t: float) -> str:
    """An epoch time as ISO 8601 UTC with milliseconds (``2026-11-25T03:00:00.000Z``)."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")

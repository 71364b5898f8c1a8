"""Schedules: publish a message at every tick of a cron expression, an interval or a
single time, exactly once per tick.

Theory of operation
-------------------

A schedule remembers ``fired_up_to``: the nominal time of the newest tick it has
handled. When the coordination timer says a tick is due, the schedule publishes its
message and logs one SCHEDULE_TICK record holding both the tick's time and the message
(its ENQUEUE payload for the durable queues it reached). One record: after a crash the
tick has happened, its message queued, or neither - so replay knows exactly which ticks
fired, and the first tick after ``fired_up_to`` is the next one to fire.

The message is the schedule's body and properties, with headers ``x-schedule`` (the
name) and ``x-schedule-tick`` (the nominal time, ISO 8601 UTC), ``timestamp`` the
nominal time, and ``message_id`` ``<name>@<tick>``: a consumer can tell ticks apart
and deduplicate.

Missed ticks. Ticks that came due while the broker was down (found at the start), or
that the broker reaches more than ``LIVE_GRACE_S`` late (a stalled host, a wall clock
stepped forward), are *missed*; a schedule's ``missed`` policy says what happens to
them: ``latest`` (the default: fire the newest missed tick once, as cron's "catch up
once"), ``skip`` (fire none), ``all`` (fire each, oldest first, at most ``max_missed``
of the newest). Ticks on time always fire, each once. A paused schedule fires nothing;
on resume it starts from then (ticks missed while paused are skipped).

:class:`Schedules` holds the commands and the firing of ticks; schedules live in the
shared :class:`~broker.core.coordstate.CoordState`, their timer is the coordination
timer (``locks.CoordTimer``).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from . import records as rec
from .coordstate import MISSED_POLICIES, CoordState, Schedule, TickFired
from .errors import InvalidArgument, NotFound, Unavailable
from .locks import CoordTimer
from .log import MessageLog
from .message import StoredMessage
from .names import check_name, check_routing_key
from .queues import QueueStore
from .shared import Outbox
from .timing import TIMING_FIELDS, Timing, iso_utc, parse_timing
from .topology import Topology

__all__ = ["Schedules", "LIVE_GRACE_S", "MAX_SCHEDULES", "MAX_MISSED", "schedule_record"]

#: A tick reached later than this while the broker runs counts as missed.
LIVE_GRACE_S = 60.0
MAX_SCHEDULES = 100_000
#: Largest ``max_missed`` (ticks fired at once by the ``all`` policy).
MAX_MISSED = 10_000
#: How early by the wall clock a timer may fire a tick (see _schedule_due).
_EARLY_S = 0.005
#: Most ticks one wake-up looks at (older due ones are missed).
_DUE_LIMIT = 1000


class Schedules:
    """Schedules (see the module docstring). A tick publishes through ``topology``
    into the ``queues`` and logs one record with ``log``."""

    def __init__(
        self,
        coord: CoordState,
        timer: CoordTimer,
        log: MessageLog,
        topology: Topology,
        queues: QueueStore,
        outbox: Outbox,
        stats: dict[str, int],
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self.coord = coord
        self._timer = timer
        self._log = log
        self._topology = topology
        self._queues = queues
        self._outbox = outbox
        self._stats = stats
        self._clock = clock
        self._wall_clock = wall_clock

    def put_schedule(
        self,
        name: str,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        timing: dict[str, Any],
        missed: str = "latest",
        max_missed: int = 100,
        paused: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Create or replace schedule ``name``; return (its info, whether anything
        changed). An equal definition changes nothing (its ticks go on; ``paused``
        pauses or resumes it); another one replaces it, counting from now. Answer
        once the log is durable. ``properties`` must be validated
        (``check_properties``); ``timing`` holds the TIMING_FIELDS given.

        Raises InvalidArgument (name, routing key, timing, policy), NotFound (the
        exchange), Unavailable (too many schedules)."""
        check_name("schedule", name)
        check_routing_key(routing_key)
        if exchange not in self._topology.exchanges:
            raise NotFound(f"no exchange {exchange!r}")
        if missed not in MISSED_POLICIES:
            raise InvalidArgument(f"missed must be one of {', '.join(MISSED_POLICIES)}")
        if isinstance(max_missed, bool) or not isinstance(max_missed, int) or not 1 <= max_missed <= MAX_MISSED:
            raise InvalidArgument(f"max_missed must be an integer 1..{MAX_MISSED}")
        if not isinstance(paused, bool):
            raise InvalidArgument("paused must be true or false")
        unknown = set(timing) - TIMING_FIELDS
        if unknown:
            raise InvalidArgument(f"unknown timing field(s): {', '.join(sorted(unknown))}")
        wall = self._wall_clock()
        parsed = parse_timing(timing, wall)
        spec = {k: v for k, v in sorted(timing.items()) if v is not None}
        if parsed.cron is not None:
            spec["cron"] = parsed.cron
            spec.setdefault("timezone", parsed.timezone)
        if parsed.kind == "at":
            assert parsed.start is not None
            if parsed.start < wall - LIVE_GRACE_S:
                raise InvalidArgument(f"at is in the past ({iso_utc(parsed.start)})")
        schedules = self.coord.schedules
        old = schedules.get(name)
        new = Schedule(
            name, exchange, routing_key, body, properties, parsed, spec,
            missed=missed, max_missed=max_missed, paused=paused, created=wall,
        )
        if old is not None and old.definition() == new.definition():
            if old.paused != paused:
                self._pause(old, paused)
                return self.schedule_info(name), True
            return self.schedule_info(name), False
        if old is None and len(schedules) >= MAX_SCHEDULES:
            raise Unavailable(f"too many schedules (at most {MAX_SCHEDULES})", code="limit_reached")
        # an `at` just past (within the grace) still fires, at once
        new.fired_up_to = min(wall, parsed.start - 0.001) if parsed.kind == "at" and parsed.start else wall
        if old is not None:
            old.deleted = True
        schedules[name] = new
        self._log_schedule(new)
        self._plan(new)
        return self.schedule_info(name), True

    def delete_schedule(self, name: str) -> None:
        """Delete schedule ``name``. Raises NotFound."""
        s = self._schedule(name)
        s.deleted = True
        del self.coord.schedules[name]
        self._log.append(rec.RecordType.SCHEDULE_DELETE, rec.encode_json({"name": name}))

    def pause_schedule(self, name: str, paused: bool) -> dict[str, Any]:
        """Pause (or resume: ticks missed meanwhile are skipped) ``name``. Raises NotFound."""
        s = self._schedule(name)
        if s.paused != paused:
            self._pause(s, paused)
        return self.schedule_info(name)

    def schedule_info(self, name: str) -> dict[str, Any]:
        """What ``GET /schedules/{name}`` shows. Raises NotFound."""
        s = self._schedule(name)
        info: dict[str, Any] = {
            "name": s.name,
            "exchange": s.exchange,
            "routing_key": s.routing_key,
            "properties": s.properties,
            "body_bytes": len(s.body),
            **s.timing.to_json(),
            "kind": s.timing.kind,
            "missed": s.missed,
            "max_missed": s.max_missed,
            "paused": s.paused,
            "created_at": iso_utc(s.created),
            "next_tick": iso_utc(s.next_fire) if s.next_fire is not None else None,
            "next_tick_s": s.next_fire,
            "fired_up_to": iso_utc(s.fired_up_to),
            "last_tick": iso_utc(s.last_tick) if s.last_tick is not None else None,
            "last_fired_at": iso_utc(s.last_fired_at) if s.last_fired_at is not None else None,
            "last_lateness_s": round(s.last_lateness_s, 6) if s.last_lateness_s is not None else None,
            "ticks_fired": s.ticks_fired,
            "ticks_skipped": s.ticks_skipped,
            "last_error": s.last_error,
        }
        for key in ("at", "start"):
            if info.get(key) is not None:
                info[key] = iso_utc(info[key])
        return info

    def schedule_list(self) -> list[dict[str, Any]]:
        return [self.schedule_info(name) for name in sorted(self.coord.schedules)]

    def schedule_body(self, name: str) -> bytes:
        return self._schedule(name).body

    # -------------------------------------------------------------- inside

    def _schedule(self, name: str) -> Schedule:
        check_name("schedule", name)
        s = self.coord.schedules.get(name)
        if s is None:
            raise NotFound(f"no schedule {name!r}")
        return s

    def _pause(self, s: Schedule, paused: bool) -> None:
        s.paused = paused
        if not paused:
            s.fired_up_to = max(s.fired_up_to, self._wall_clock())
            s.recovering = False
        self._log_schedule(s)
        self._plan(s)

    def _log_schedule(self, s: Schedule) -> None:
        self._log.append(rec.RecordType.SCHEDULE_PUT, rec.encode_json(schedule_record(s)))

    def _plan(self, s: Schedule) -> None:
        """Set the timer for ``s``'s next tick (none when paused or finished)."""
        coord = self.coord
        s.stamp = coord.next_stamp
        coord.next_stamp += 1
        s.next_fire = None if s.paused else s.timing.next_after(s.fired_up_to)
        if s.next_fire is not None:
            self._timer.at(self._clock() + max(0.0, s.next_fire - self._wall_clock()), "sched", s.name, s.stamp)

    def due(self, name: str, stamp: int | None) -> None:
        """The timer of schedule ``name`` fired (``stamp`` None: the start after a
        recovery): fire what is due by the policy, then plan the next tick."""
        s = self.coord.schedules.get(name)
        if s is None or (stamp is not None and s.stamp != stamp):
            return
        if s.paused:
            s.next_fire = None
            return
        wall = self._wall_clock()
        # The timer is set on the monotonic clock from a wall-clock distance: it may
        # fire a hair before the tick by the wall clock (rounding, slewing). A tick
        # that close is due, or the timer would be set again and again for it.
        upto = wall + _EARLY_S if stamp is not None else wall
        ticks, total = s.timing.due(s.fired_up_to, upto, _DUE_LIMIT)
        if ticks:
            cut = wall + 1.0 if s.recovering else wall - LIVE_GRACE_S
            missed = [t for t in ticks if t < cut]
            on_time = [t for t in ticks if t >= cut]
            if s.missed == "all":
                fire = missed[-s.max_missed :]
            elif s.missed == "latest" and not on_time:
                fire = missed[-1:]
            else:
                fire = []
            fire += on_time
            skipped = total - len(fire)
            s.ticks_skipped += skipped
            self.coord.ticks_skipped += skipped
            for tick in fire:
                self._fire(s, tick, wall)
            s.fired_up_to = ticks[-1]
        s.recovering = False
        self._plan(s)

    def _fire(self, s: Schedule, tick: float, wall: float) -> None:
        """Publish ``s``'s message for ``tick`` and log the tick with it (one record)."""
        stamp = iso_utc(tick)
        properties = dict(s.properties or {})
        headers = dict(properties.get("headers") or {})
        headers["x-schedule"] = s.name
        headers["x-schedule-tick"] = stamp
        properties["headers"] = headers
        properties["message_id"] = f"{s.name}@{stamp}"
        properties.setdefault("timestamp", int(tick))
        exchange = self._topology.exchanges.get(s.exchange)
        queues = []
        if exchange is None:
            s.last_error = f"exchange {s.exchange!r} does not exist: the tick of {stamp} published nothing"
        else:
            queues = [
                q for q in self._topology.route_publish(exchange, s.routing_key, headers)
                if q.overflow == "drop-head" or not q.is_full(len(s.body))
            ]
            s.last_error = None if queues else f"the tick of {stamp} routed to no queue"
        headers.pop("BCC", None)  # routed with, not kept (senderselected.py)
        persistent = properties.get("delivery_mode", 2) == 2
        durable_qids = [q.qid for q in queues if q.persistent_log] if persistent else []
        seq = self._queues.take_seq()
        expires = wall + properties["expiration"] / 1000.0 if "expiration" in properties else None
        message = StoredMessage(seq, s.exchange, s.routing_key, s.body, properties, expires, enqueued_at=wall)
        payload = rec.encode_enqueue(
            seq, wall, expires, durable_qids, s.exchange, s.routing_key, None, properties, s.body
        )
        tick_payload = rec.encode_tick(s.name, tick, payload)
        if durable_qids:
            self._log.append_message(rec.RecordType.SCHEDULE_TICK, tick_payload, message, list(queues))
        else:
            self._log.append(rec.RecordType.SCHEDULE_TICK, tick_payload)
        enqueue = self._queues.enqueue
        for queue in queues:
            enqueue(queue, message, wall)
        late = max(0.0, wall - tick)
        s.ticks_fired += 1
        s.last_tick = tick
        s.last_fired_at = wall
        s.last_lateness_s = late
        self.coord.ticks_fired += 1
        self._outbox.emit(TickFired(s.name, late))
        self._stats["published"] += 1


def schedule_record(s: Schedule) -> dict[str, Any]:
    """A SCHEDULE_PUT record's payload: the schedule's whole durable state."""
    return {
        "name": s.name,
        "exchange": s.exchange,
        "routing_key": s.routing_key,
        "body_b64": base64.b64encode(s.body).decode(),
        "properties": s.properties,
        "spec": s.spec,
        "timing": {"kind": s.timing.kind, **s.timing.to_json()},
        "missed": s.missed,
        "max_missed": s.max_missed,
        "paused": s.paused,
        "created": s.created,
        "fired_up_to": s.fired_up_to,
    }


def schedule_from_record(d: dict[str, Any]) -> Schedule:
    """The schedule a SCHEDULE_PUT record holds."""
    t = d["timing"]
    kind = t["kind"]
    if kind == "cron":
        timing = Timing("cron", cron=t["cron"], timezone=t["timezone"])
    elif kind == "interval":
        timing = Timing("interval", interval_s=float(t["interval_s"]), start=float(t["start"]))
    else:
        timing = Timing("at", start=float(t["at"]))
    return Schedule(
        d["name"], d["exchange"], d["routing_key"], base64.b64decode(d["body_b64"]), d.get("properties"),
        timing, d.get("spec", {}), missed=d.get("missed", "latest"), max_missed=int(d.get("max_missed", 100)),
        paused=bool(d.get("paused", False)), created=float(d.get("created", 0.0)),
        fired_up_to=float(d["fired_up_to"]),
    )

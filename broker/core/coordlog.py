"""Coordination in the log: replaying lock and schedule records, and the checkpoint
records that carry their state.

Replay is idempotent, as everywhere (a checkpoint may already hold effects of records
logged after its LSN): LOCK_HELD applies when its token is at least the one the lock
has (a refresh keeps the token and moves the expiry), LOCK_RELEASED only to the holder
with its token; SCHEDULE_PUT sets a schedule's whole state, SCHEDULE_TICK moves its
``fired_up_to`` forward (never back) and indexes the tick's message like a logged
publish; COORD_META keeps the larger next token. Replayed locks and schedules start
their timers with the first ``take_effects`` after recovery
(``LocksMixin._start_coordination``).

The methods here belong to :class:`~broker.core.broker.Broker`; they share its state
(:class:`~broker.core.state.BrokerState`).
"""

from __future__ import annotations

from . import records as rec
from .coordstate import Lock
from .locks import lock_record
from .paging import ReplayIndex
from .records import RecordType
from .schedules import SchedulesMixin, schedule_from_record, schedule_record

__all__ = ["CoordLogMixin", "COORD_RECORD_TYPES"]

COORD_RECORD_TYPES = frozenset(
    {
        RecordType.LOCK_HELD,
        RecordType.LOCK_RELEASED,
        RecordType.SCHEDULE_PUT,
        RecordType.SCHEDULE_DELETE,
        RecordType.SCHEDULE_TICK,
        RecordType.COORD_META,
    }
)


class CoordLogMixin(SchedulesMixin):
    """Coordination records (see the module docstring)."""

    def _replay_coordination(self, state: dict[int, ReplayIndex], payload: bytes, lsn: int, rtype: int) -> None:
        """Apply one coordination record during recovery."""
        coord = self.coord
        coord.needs_start = True
        self._coord_pending = True
        if rtype == RecordType.SCHEDULE_TICK:
            name, tick, enqueue = rec.decode_tick(payload)
            s = coord.schedules.get(name)
            if s is not None and tick > s.fired_up_to:
                s.fired_up_to = tick
                s.last_tick = tick
            if s is not None:
                s.recovering = True
            if not lsn:
                raise ValueError("SCHEDULE_TICK record in a checkpoint")
            self._replay_logged_enqueue(state, enqueue, lsn, rtype)
            return
        d = rec.decode_json(payload)
        if rtype == RecordType.LOCK_HELD:
            token = int(d["token"])
            coord.next_token = max(coord.next_token, token + 1)
            lock = coord.locks.get(d["name"])
            if lock is None:
                lock = coord.locks[d["name"]] = Lock(d["name"])
            if token > lock.token or (token == lock.token and lock.owner is not None):
                lock.owner = d["owner"]
                lock.acquired = float(d["acquired"])
                lock.expires = max(float(d["expires"]), lock.expires) if token == lock.token else float(d["expires"])
                lock.ttl_s = float(d["ttl_s"])
                lock.token = token
        elif rtype == RecordType.LOCK_RELEASED:
            lock = coord.locks.get(d["name"])
            if lock is not None and lock.token == int(d["token"]):
                del coord.locks[d["name"]]
        elif rtype == RecordType.SCHEDULE_PUT:
            s = schedule_from_record(d)
            s.recovering = True
            coord.schedules[s.name] = s
        elif rtype == RecordType.SCHEDULE_DELETE:
            coord.schedules.pop(d["name"], None)
        elif rtype == RecordType.COORD_META:
            coord.next_token = max(coord.next_token, int(d.get("next_token", 1)))
        else:  # pragma: no cover - the table sends only the types above
            raise ValueError(f"not a coordination record type: {rtype}")

    def _coordination_records(self) -> list[tuple[int, bytes]]:
        """The checkpoint records of every held lock, every schedule and the next
        fencing token."""
        T = rec.RecordType
        out: list[tuple[int, bytes]] = []
        for lock in self.coord.locks.values():
            if lock.owner is not None:
                out.append((T.LOCK_HELD, rec.encode_json(lock_record(lock))))
        for s in self.coord.schedules.values():
            out.append((T.SCHEDULE_PUT, rec.encode_json(schedule_record(s))))
        out.append((T.COORD_META, rec.encode_json({"next_token": self.coord.next_token})))
        return out

"""Test harness for the sans-IO core: fake clocks and an effect recorder.

:class:`Harness` wraps a :class:`~broker.core.Broker` with two controllable clocks and
keeps every effect it emits. While collecting effects it checks the contracts that
hold for every test, so no test can forget them:

* ``AppendRecords`` batches are numbered contiguously from LSN 1;
* publisher confirms on each channel come in tag order, each tag exactly once
  (``multiple`` ranges are expanded against the last confirmed tag);
* a ``Return`` comes before the confirm of its tag;
* a batch marked ``lazy`` holds only records nobody waits for (``SETTLE``, ``DELIVERED``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from broker.core import (
    AppendRecords,
    Broker,
    Confirm,
    ConsumerCancelled,
    CoreConfig,
    Deliver,
    DeliveryExpired,
    Effect,
    QueueReady,
    Return,
)
from broker.core.records import RecordType

_LAZY_TYPES = {RecordType.SETTLE, RecordType.DELIVERED, RecordType.DELIVERY_COUNTS, RecordType.DELAY}

WALL_START = 1_700_000_000.0
MONO_START = 1000.0


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@dataclass
class ConfirmState:
    last: int = 0  # highest tag confirmed so far
    outcome: dict[int, tuple[bool, str | None]] = field(default_factory=dict)


#: Older keyword names of the core's tunables, as tests still pass them.
_CONFIG_ALIASES = {
    "channel_credit_bytes": "channel_buffer_bytes",
    "memory_messages_per_queue": "queue_memory_messages",
}


def broker_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``Broker(...)`` keyword arguments from a flat mapping: the core's tunables
    (by their CoreConfig names, or the older ones above) go into ``config``."""
    fields = {f.name for f in dataclasses.fields(CoreConfig)}
    config = {}
    rest = {}
    for name, value in kwargs.items():
        name = _CONFIG_ALIASES.get(name, name)
        (config if name in fields else rest)[name] = value
    return {**rest, "config": CoreConfig(**config)}


class Harness:
    def __init__(self, **kwargs: Any) -> None:
        self.mono = FakeClock(MONO_START)
        self.wall = FakeClock(WALL_START)
        kwargs.setdefault("boot_id", "b0")
        kwargs.setdefault("read_log", self.read_log)
        # every record appended so far, by LSN: the "log" paged-out messages are read from
        self.log: dict[int, tuple[int, bytes]] = {}
        self.b = Broker(clock=self.mono, wall_clock=self.wall, **broker_kwargs(kwargs))
        self.effects: list[Effect] = []
        self.records: list[tuple[int, int, bytes]] = []  # (lsn, rtype, payload)
        self.confirms: dict[int, ConfirmState] = {}
        self.returned: dict[int, set[int]] = {}

    def read_log(self, lsns: Any) -> list[tuple[int, bytes] | str]:
        """The broker's ``read_log``: records by LSN from what it appended so far."""
        return [self.log.get(lsn, f"record {lsn} is not in the log") for lsn in lsns]

    # ----------------------------------------------------------------- driving

    def step(self) -> list[Effect]:
        """take_effects(), check the global contracts, remember everything."""
        effects = self.b.take_effects()
        for eff in effects:
            if isinstance(eff, AppendRecords):
                expected_first = self.records[-1][0] + 1 if self.records else 1
                assert eff.first_lsn == expected_first, (eff.first_lsn, expected_first)
                assert eff.last_lsn == eff.first_lsn + len(eff.records) - 1
                if eff.lazy:
                    assert {rtype for rtype, _ in eff.records} <= _LAZY_TYPES, eff
                for i, (rtype, payload) in enumerate(eff.records):
                    self.records.append((eff.first_lsn + i, rtype, payload))
                    self.log[eff.first_lsn + i] = (rtype, payload)
            elif isinstance(eff, Confirm):
                st = self.confirms.setdefault(eff.channel_id, ConfirmState())
                assert eff.delivery_tag > st.last, f"confirm out of order: {eff} after {st.last}"
                if eff.multiple:
                    tags = range(st.last + 1, eff.delivery_tag + 1)
                else:
                    assert eff.delivery_tag == st.last + 1, (
                        f"single confirm {eff.delivery_tag} skips unconfirmed tags after {st.last}"
                    )
                    tags = range(eff.delivery_tag, eff.delivery_tag + 1)
                assert eff.ack or eff.reason, f"nack without a reason: {eff}"
                assert eff.ack or not eff.multiple, f"nacks are never coalesced: {eff}"
                for t in tags:
                    assert t not in st.outcome
                    st.outcome[t] = (eff.ack, eff.reason)
                st.last = eff.delivery_tag
            elif isinstance(eff, Return):
                st = self.confirms.get(eff.channel_id)
                assert st is None or eff.delivery_tag > st.last, "Return after its confirm"
                self.returned.setdefault(eff.channel_id, set()).add(eff.delivery_tag)
        self.effects.extend(effects)
        return effects

    def sync(self) -> list[Effect]:
        """Step, then declare every record so far durable and step again."""
        out = self.step()
        self.b.durable(self.b.last_lsn)
        return out + self.step()

    def sleep(self, seconds: float) -> list[Effect]:
        """Both clocks move forward; the broker is told time passed."""
        self.mono.now += seconds
        self.wall.now += seconds
        self.b.advance()
        return self.step()

    # ------------------------------------------------------------- shortcuts

    def channel(self) -> int:
        return self.b.open_channel()

    def queue(self, name: str, **kwargs: Any) -> str:
        q, _ = self.b.declare_queue(name, **kwargs)
        return q.name

    def publish(
        self,
        ch: int,
        exchange: str,
        key: str,
        body: bytes = b"x",
        props: dict[str, Any] | None = None,
        *,
        mandatory: bool = False,
    ) -> int:
        tag, _n = self.b.publish(ch, exchange, key, body, props, mandatory=mandatory)
        return tag

    # ------------------------------------------------------------- inspection

    def confirm_of(self, ch: int, tag: int) -> tuple[bool, str | None] | None:
        st = self.confirms.get(ch)
        return None if st is None else st.outcome.get(tag)

    def acked(self, ch: int, tag: int) -> bool:
        return self.confirm_of(ch, tag) == (True, None)

    def nacked(self, ch: int, tag: int) -> bool:
        out = self.confirm_of(ch, tag)
        return out is not None and out[0] is False

    def delivers(self, effects: list[Effect] | None = None, ch: int | None = None) -> list[Deliver]:
        src = self.effects if effects is None else effects
        return [e for e in src if isinstance(e, Deliver) and (ch is None or e.channel_id == ch)]

    def bodies(self, effects: list[Effect], ch: int | None = None) -> list[bytes]:
        return [d.message.body for d in self.delivers(effects, ch)]

    def of_type(self, kind: type, effects: list[Effect] | None = None) -> list[Any]:
        src = self.effects if effects is None else effects
        return [e for e in src if isinstance(e, kind)]

    def info(self, queue: str) -> dict[str, Any]:
        return self.b.queue_info(self.b.queues[queue])

    def ready_bodies(self, queue: str) -> list[bytes]:
        """Ready messages of a queue in delivery order (without consuming them)."""
        return [e.message.body for e in ready_entries(self.b, queue)]


def ready_entries(b: Broker, queue: str) -> list[Any]:
    """Ready entries in delivery order, paged-out ones read back from the log (without
    taking them out of the queue)."""
    q = b.queues[queue]
    out: list[Any] = []
    for lane in reversed(q.lanes):  # highest priority first
        paged = b.pager.read_entries(q, list(lane.paged)) if lane.paged else []
        out += [e for _s, e in sorted(lane.requeued, key=lambda p: p[0])] + list(lane.ready) + paged + list(lane.tail)
    return out


__all__ = [
    "Harness",
    "FakeClock",
    "ready_entries",
    "Deliver",
    "Confirm",
    "Return",
    "ConsumerCancelled",
    "DeliveryExpired",
    "QueueReady",
    "AppendRecords",
]

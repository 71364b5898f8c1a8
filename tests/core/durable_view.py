"""What must survive a restart, as plain comparable data; and log replay helpers."""

from __future__ import annotations

from typing import Any, Iterable

from broker.core import Broker
from broker.core.routing import _freeze

from .helpers import FakeClock, Harness, broker_kwargs, ready_entries


def live_entries(b: Broker, queue_name: str) -> list[Any]:
    """Ready, requeued and unacked entries of a queue, in sequence order."""
    q = b.queues[queue_name]
    entries = ready_entries(b, queue_name)
    for level, lane in enumerate(q.lanes):
        seqs = [e.message.seq for e in entries if q.lane_for(e.message) is lane]
        assert seqs == sorted(seqs), f"queue {queue_name} out of FIFO order at priority {level}: {seqs}"
    for ch in b.channels.values():
        for d in ch.deliveries.values():
            if d.queue is q:
                entries.append(d.entry)
    entries.extend(q.delayed.whole())
    paged_delayed = [(seq, loc) for _due, seq, loc in q.delayed.paged_items()]
    if paged_delayed:
        entries.extend(b.pager.read_entries(q, paged_delayed))
    return sorted(entries, key=lambda e: e.message.seq)


def durable_view(b: Broker) -> dict[str, Any]:
    exchanges = {
        name: ex.settings() for name, ex in b.exchanges.items() if ex.durable and not ex.builtin
    }
    queues = {
        name: (q.qid, q.auto_delete, q.arguments) for name, q in b.queues.items() if q.persistent_log
    }
    bindings = set()
    for ex in b.exchanges.values():
        if not ex.durable:
            continue
        for (dest, key, _f), args in ex.table.bindings.items():
            kind, name = dest
            if kind == "q" and name in queues:
                bindings.add((ex.name, kind, name, key, _freeze(args)))
            elif kind == "x" and b.exchanges[name].durable:
                bindings.add((ex.name, kind, name, key, _freeze(args)))
    messages = {}
    for name in queues:
        delays = {seq: due_ms for seq, due_ms in b.queues[name].delayed.due_times()}
        messages[name] = [
            (
                e.message.seq,
                e.message.body,
                e.message.exchange,
                e.message.routing_key,
                e.message.properties,
                e.deliveries,
                e.expires_at,
                delays.get(e.message.seq),
            )
            for e in live_entries(b, name)
            if e.message.persistent
        ]
    # bound_from back-references must agree with the tables
    for name, q in b.queues.items():
        expect = {ex.name for ex in b.exchanges.values() if any(bk[0] == ("q", name) for bk in ex.table.bindings)}
        assert q.bound_from == expect, (name, q.bound_from, expect)
    for name, x in b.exchanges.items():
        expect = {ex.name for ex in b.exchanges.values() if any(bk[0] == ("x", name) for bk in ex.table.bindings)}
        assert x.bound_from == expect, (name, x.bound_from, expect)
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings, "messages": messages}


def fresh_broker(h: Harness, **kwargs: Any) -> Broker:
    """A new broker sharing ``h``'s clocks (a restart at the same moment)."""
    kwargs.setdefault("boot_id", "b1")
    kwargs.setdefault("read_log", h.read_log)
    return Broker(clock=FakeClock(h.mono.now), wall_clock=h.wall, **broker_kwargs(kwargs))


def replay_into(
    b: Broker, records: Iterable[tuple[int, int, bytes]], last_lsn: int, *, twice: bool = False
) -> Broker:
    b.begin_recovery()
    records = list(records)
    for lsn, rtype, payload in records:
        b.replay(rtype, payload, lsn)
        if twice:  # replay is idempotent
            b.replay(rtype, payload, lsn)
    b.finish_recovery(last_lsn)
    return b


def restart_from_log(h: Harness, **kwargs: Any) -> Broker:
    h.step()
    last = h.records[-1][0] if h.records else 0
    return replay_into(fresh_broker(h, **kwargs), h.records, last)

"""Property-based: random command sequences against a model of every message copy.

The model tracks each copy of each message (a message routed to two queues is two
copies) as ready, unacked on (channel, delivery tag), leased, or gone. After every
step it checks that the broker agrees: nothing lost or duplicated, ``queue_info``
counts, FIFO order with requeued messages back in their original place, redelivered
flags, prefetch and credit limits honoured at every single delivery, and no missed
dispatch (a ready message with a consumer able to take it). Confirms are checked by
the harness (in order, each tag once); the log is replayed into a fresh broker and
compared with the live durable state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.core import (
    Broker,
    ChannelError,
    Confirm,
    ConsumerCancelled,
    Deliver,
    DeliveryExpired,
    Return,
)
from broker.core.broker import DELIVERY_OVERHEAD_BYTES

from .durable_view import durable_view, restart_from_log
from .helpers import Harness, ready_entries

QUEUES = ("q0", "q1", "q2")  # q0 durable, q1 not, q2 a durable priority queue
MAX_PRIORITY = 3  # q2's x-max-priority
ACK_TIMEOUT_S = 10.0
LEASE_S = 5.0
BODY_BYTES = 6
CREDIT = 5 * (BODY_BYTES + DELIVERY_OVERHEAD_BYTES)


@dataclass
class Copy:
    queue: str
    body: bytes
    order: int  # publish order: FIFO position
    persistent: bool
    level: int = 0  # priority level (q2 only): higher first, FIFO within one
    state: str = "ready"  # ready | unacked | leased | gone
    delivered: bool = False
    ch: int = 0
    tag: int = 0
    ctag: str = ""
    deadline: float = 0.0
    lease_id: str = ""
    orphan: bool = False  # its queue was deleted while it was out


@dataclass
class ModelConsumer:
    ch: int
    tag: str
    queue: str
    prefetch: int
    no_ack: bool


@dataclass
class ModelChannel:
    id: int
    prefetch: int = 0
    credit: int = CREDIT
    consumers: dict[str, ModelConsumer] = field(default_factory=dict)
    published: int = 0
    expired: set[int] = field(default_factory=set)


class BrokerMachine(RuleBasedStateMachine):
    # ready messages a durable queue keeps in memory before paging the rest out
    MEMORY_MESSAGES = 2048

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(
            consumer_timeout_s=ACK_TIMEOUT_S,
            default_lease_s=LEASE_S,
            channel_credit_bytes=CREDIT,
            memory_messages_per_queue=self.MEMORY_MESSAGES,
        )
        self.h.queue("q0")
        self.h.queue("q1", durable=False)
        self.h.queue("q2", arguments={"x-max-priority": MAX_PRIORITY})
        for q in QUEUES:
            self.h.b.bind("amq.fanout", q)
        self.copies: dict[tuple[str, bytes], Copy] = {}
        self.channels: dict[int, ModelChannel] = {}
        self.n = 0
        self.h.step()
        for _ in range(2):
            self.open_channel()

    # ------------------------------------------------------------ helpers

    def now(self) -> float:
        return self.h.mono.now

    def open_channels(self) -> list[int]:
        return sorted(self.channels)

    def unacked_on(self, ch: int) -> list[Copy]:
        return sorted(
            (c for c in self.copies.values() if c.state == "unacked" and c.ch == ch), key=lambda c: c.tag
        )

    def consumer_unacked(self, ch: int, ctag: str) -> int:
        return sum(1 for c in self.copies.values() if c.state == "unacked" and c.ch == ch and c.ctag == ctag)

    def requeue(self, c: Copy) -> None:
        if c.orphan:
            c.state = "gone"  # nowhere to go back to
            return
        c.state = "ready"
        c.delivered = True

    def apply(self, effects: list[object]) -> None:
        """Bring the model along with the effects of one step, checking each delivery."""
        for eff in effects:
            if isinstance(eff, DeliveryExpired):
                mch = self.channels[eff.channel_id]
                (c,) = [c for c in self.unacked_on(eff.channel_id) if c.tag == eff.delivery_tag]
                assert c.deadline <= self.now(), "expired before its deadline"
                assert not c.orphan, "a delivery of a deleted queue expired"
                self.requeue(c)
                mch.expired.add(eff.delivery_tag)
            elif isinstance(eff, Deliver):
                mch = self.channels[eff.channel_id]
                mc = mch.consumers[eff.consumer_tag]
                c = self.copies[(mc.queue, eff.message.body)]
                assert c.state == "ready", f"delivered a copy that is {c.state}: {c}"
                assert eff.redelivered == c.delivered
                # limits hold at the moment of this delivery
                assert mch.credit > 0, "delivered without credit"
                mch.credit -= len(eff.message.body) + DELIVERY_OVERHEAD_BYTES
                if mc.no_ack:
                    c.state = "gone"
                    continue
                if mc.prefetch:
                    assert self.consumer_unacked(mch.id, mc.tag) < mc.prefetch, "consumer prefetch exceeded"
                if mch.prefetch:
                    assert len(self.unacked_on(mch.id)) < mch.prefetch, "channel prefetch exceeded"
                c.state, c.ch, c.tag, c.ctag = "unacked", eff.channel_id, eff.delivery_tag, eff.consumer_tag
                c.delivered = True
                c.deadline = self.now() + ACK_TIMEOUT_S

    def step(self) -> None:
        self.apply(self.h.step())

    # -------------------------------------------------------------- rules

    @rule()
    def open_channel(self) -> None:
        ch = self.h.channel()
        self.channels[ch] = ModelChannel(ch)

    @precondition(lambda self: self.channels)
    @rule(i=st.integers(0, 10))
    def close_channel(self, i: int) -> None:
        ch = self.open_channels()[i % len(self.channels)]
        self.h.b.close_channel(ch)
        for c in self.unacked_on(ch):
            self.requeue(c)
        del self.channels[ch]
        self.step()

    @rule(
        i=st.integers(0, 10),
        dest=st.sampled_from(["q0", "q1", "q2", "fanout"]),
        persistent=st.booleans(),
        count=st.integers(1, 4),
        priority=st.one_of(st.none(), st.integers(0, MAX_PRIORITY + 2)),
    )
    def publish(self, i: int, dest: str, persistent: bool, count: int, priority: int | None) -> None:
        if not self.channels:
            self.open_channel()
        ch = self.open_channels()[i % len(self.channels)]
        for _ in range(count):
            self.n += 1
            body = f"m{self.n:05d}".encode()
            assert len(body) == BODY_BYTES
            props: dict[str, int] | None = None if persistent else {"delivery_mode": 1}
            if priority is not None:
                props = {**(props or {}), "priority": priority}
            if dest == "fanout":
                self.h.publish(ch, "amq.fanout", "", body, props)
                queues = QUEUES
            else:
                self.h.publish(ch, "", dest, body, props)
                queues = (dest,)
            self.channels[ch].published += 1
            for q in queues:
                level = min(priority or 0, MAX_PRIORITY) if q == "q2" else 0
                self.copies[(q, body)] = Copy(q, body, self.n, persistent, level)
        self.step()

    @precondition(lambda self: self.channels)
    @rule(i=st.integers(0, 10), queue=st.sampled_from(QUEUES), prefetch=st.integers(0, 3), no_ack=st.booleans())
    def consume(self, i: int, queue: str, prefetch: int, no_ack: bool) -> None:
        ch = self.open_channels()[i % len(self.channels)]
        tag = self.h.b.consume(ch, queue, prefetch=prefetch, no_ack=no_ack)
        self.channels[ch].consumers[tag] = ModelConsumer(ch, tag, queue, prefetch, no_ack)
        self.step()

    @precondition(lambda self: any(m.consumers for m in self.channels.values()))
    @rule(i=st.integers(0, 100))
    def cancel(self, i: int) -> None:
        all_consumers = sorted((m.id, t) for m in self.channels.values() for t in m.consumers)
        ch, tag = all_consumers[i % len(all_consumers)]
        self.h.b.cancel(ch, tag)
        del self.channels[ch].consumers[tag]
        self.step()

    @precondition(lambda self: self.channels)
    @rule(i=st.integers(0, 10), prefetch=st.integers(0, 4))
    def qos_global(self, i: int, prefetch: int) -> None:
        ch = self.open_channels()[i % len(self.channels)]
        self.h.b.qos(ch, prefetch, global_=True)
        self.channels[ch].prefetch = prefetch
        self.step()

    @precondition(lambda self: self.channels)
    @rule(i=st.integers(0, 10), nbytes=st.sampled_from([1, 300, CREDIT]))
    def grant_credit(self, i: int, nbytes: int) -> None:
        ch = self.open_channels()[i % len(self.channels)]
        self.h.b.grant_credit(ch, nbytes)
        mch = self.channels[ch]
        mch.credit = min(mch.credit + nbytes, CREDIT)
        self.step()

    @precondition(lambda self: self.channels)
    @rule(
        i=st.integers(0, 10),
        pick=st.integers(-1, 20),
        op=st.sampled_from(["ack", "nack", "reject"]),
        multiple=st.booleans(),
        requeue=st.booleans(),
    )
    def settle(self, i: int, pick: int, op: str, multiple: bool, requeue: bool) -> None:
        ch = self.open_channels()[i % len(self.channels)]
        mch = self.channels[ch]
        open_ = self.unacked_on(ch)
        if pick == 20 and mch.expired:
            tag = min(mch.expired)  # expired: a late settle
        elif pick >= 0 and open_:
            tag = open_[pick % len(open_)].tag  # a real one
        elif pick == -1 and multiple:
            tag = 0  # "everything"
        else:
            tag = 1000 + pick  # unknown
        if op == "reject":
            multiple = False
        known = {c.tag for c in open_}
        if tag not in known and not (multiple and tag == 0):
            before = [self.h.info(q) for q in QUEUES]
            with pytest.raises(ChannelError) as ei:
                if op == "ack":
                    self.h.b.ack(ch, tag, multiple)
                elif op == "nack":
                    self.h.b.nack(ch, tag, multiple, requeue)
                else:
                    self.h.b.reject(ch, tag, requeue)
            expected_code = "delivery_expired" if tag in mch.expired else "unknown_delivery_tag"
            assert ei.value.code == expected_code
            assert [self.h.info(q) for q in QUEUES] == before
            self.step()
            return
        chosen = [c for c in open_ if (c.tag <= tag or tag == 0)] if multiple else [c for c in open_ if c.tag == tag]
        if op == "ack":
            n = self.h.b.ack(ch, tag, multiple)
        elif op == "nack":
            n = self.h.b.nack(ch, tag, multiple, requeue)
        else:
            n = self.h.b.reject(ch, tag, requeue)
        assert n == len(chosen)
        for c in chosen:
            if op != "ack" and requeue:
                self.requeue(c)
            else:
                c.state = "gone"
        self.step()

    @precondition(lambda self: any(self.unacked_on(ch) for ch in self.channels))
    @rule(i=st.integers(0, 100))
    def touch(self, i: int) -> None:
        open_ = [c for ch in self.open_channels() for c in self.unacked_on(ch)]
        c = open_[i % len(open_)]
        self.h.b.touch(c.ch, c.tag)
        c.deadline = self.now() + ACK_TIMEOUT_S
        self.step()

    @rule(queue=st.sampled_from(QUEUES), max_count=st.integers(1, 3))
    def get(self, queue: str, max_count: int) -> None:
        got = self.h.b.get(queue, max_count=max_count)
        ready = sorted((c for c in self.copies.values() if c.queue == queue and c.state == "ready"), key=_delivery_order)
        assert len(got) == min(max_count, len(ready))
        for (lease_id, d, redelivered), c in zip(got, ready):
            assert d.entry.message.body == c.body, "get broke priority or FIFO order"
            assert redelivered == c.delivered
            c.state, c.lease_id, c.delivered = "leased", lease_id, True
            c.deadline = self.now() + LEASE_S
        self.step()

    @precondition(lambda self: any(c.state == "leased" for c in self.copies.values()))
    @rule(
        picks=st.lists(st.integers(0, 100), min_size=1, max_size=3, unique=True),
        op=st.sampled_from(["ack", "nack", "drop", "extend"]),
    )
    def settle_leases(self, picks: list[int], op: str) -> None:
        leased = sorted((c for c in self.copies.values() if c.state == "leased"), key=lambda c: c.lease_id)
        chosen = list({id(c): c for c in (leased[p % len(leased)] for p in picks)}.values())
        ids = [c.lease_id for c in chosen]
        if op == "ack":
            assert self.h.b.ack_leases(ids) == len(ids)
            for c in chosen:
                c.state = "gone"
        elif op == "nack":
            assert self.h.b.nack_leases(ids) == len(ids)
            for c in chosen:
                self.requeue(c)
        elif op == "drop":
            assert self.h.b.nack_leases(ids, requeue=False) == len(ids)
            for c in chosen:
                c.state = "gone"
        else:
            assert self.h.b.extend_leases(ids, LEASE_S) == len(ids)
            for c in chosen:
                c.deadline = self.now() + LEASE_S
        self.step()

    @rule(seconds=st.sampled_from([0.5, 2.0, 4.9, 5.0, 11.0]))
    def sleep(self, seconds: float) -> None:
        self.h.mono.now += seconds
        self.h.wall.now += seconds
        # REST leases expire silently; consumer deliveries announce it (checked in apply)
        for c in self.copies.values():
            if c.state == "leased" and c.deadline <= self.now():
                self.requeue(c)
        self.h.b.advance()
        effects = self.h.step()
        self.apply(effects)
        for ch in self.channels:
            for c in self.unacked_on(ch):
                # (one whose queue was deleted never expires: nothing can go back)
                assert c.orphan or c.deadline > self.now(), f"delivery past its deadline not expired: {c}"

    @rule(queue=st.sampled_from(QUEUES))
    def purge(self, queue: str) -> None:
        ready = [c for c in self.copies.values() if c.queue == queue and c.state == "ready" and not c.orphan]
        assert self.h.b.purge_queue(queue) == len(ready)
        for c in ready:
            c.state = "gone"
        self.step()

    @rule(queue=st.sampled_from(QUEUES))
    def delete_and_redeclare(self, queue: str) -> None:
        ready = [c for c in self.copies.values() if c.queue == queue and c.state == "ready" and not c.orphan]
        assert self.h.b.delete_queue(queue) == len(ready)
        for c in self.copies.values():
            if c.queue == queue:
                if c.state == "ready":
                    c.state = "gone"
                c.orphan = True
        cancelled = set()
        for mch in self.channels.values():
            for tag, mc in list(mch.consumers.items()):
                if mc.queue == queue:
                    del mch.consumers[tag]
                    cancelled.add((mch.id, tag))
        self.h.queue(
            queue, durable=queue != "q1", arguments={"x-max-priority": MAX_PRIORITY} if queue == "q2" else None
        )
        self.h.b.bind("amq.fanout", queue)
        effects = self.h.step()
        got = {(e.channel_id, e.consumer_tag) for e in effects if isinstance(e, ConsumerCancelled)}
        assert got == cancelled
        self.apply(effects)

    @rule()
    def sync(self) -> None:
        self.apply(self.h.sync())
        for ch, mch in self.channels.items():
            st_ = self.h.confirms.get(ch)
            assert (st_.last if st_ else 0) == mch.published, "publishes left unconfirmed after durable()"
            assert st_ is None or all(v == (True, None) for v in st_.outcome.values())

    @rule()
    def replay_log(self) -> None:
        nb = restart_from_log(self.h)
        assert durable_view(nb) == durable_view(self.h.b)

    # ---------------------------------------------------------- invariants

    @invariant()
    def broker_agrees_with_model(self) -> None:
        b = self.h.b
        for q in QUEUES:
            model = [c for c in self.copies.values() if c.queue == q and not c.orphan]
            ready = sorted((c for c in model if c.state == "ready"), key=_delivery_order)
            unacked = [c for c in model if c.state in ("unacked", "leased")]
            info = self.h.info(q)
            assert info["messages_ready"] == len(ready)
            assert info["messages_unacked"] == len(unacked)
            assert self.h.ready_bodies(q) == [c.body for c in ready]  # FIFO, requeued in place
            assert [e.delivered for e in _ready(b, q)] == [c.delivered for c in ready]
        # every open delivery in the broker is one model copy, and vice versa
        broker_open = {
            (d.queue.name, d.entry.message.body, ch_id if ch_id else -1)
            for ch_id, ch in b.channels.items()
            for d in ch.deliveries.values()
        }
        n_open = sum(len(ch.deliveries) for ch in b.channels.values())
        assert len(broker_open) == n_open, "one message delivered twice"
        model_open = {
            (c.queue, c.body, c.ch if c.state == "unacked" else -1)
            for c in self.copies.values()
            if c.state in ("unacked", "leased")
        }
        assert broker_open == model_open
        for ch_id, mch in self.channels.items():
            bch = b.channels[ch_id]
            assert bch.unacked == len(self.unacked_on(ch_id))
            assert sorted(bch.consumers) == sorted(mch.consumers)
            for tag, mc in mch.consumers.items():
                assert bch.consumers[tag].unacked == self.consumer_unacked(ch_id, tag)

    @invariant()
    def no_missed_dispatch(self) -> None:
        for q in QUEUES:
            if not any(c.queue == q and c.state == "ready" and not c.orphan for c in self.copies.values()):
                continue
            for mch in self.channels.values():
                for mc in mch.consumers.values():
                    if mc.queue != q:
                        continue
                    blocked = (
                        mch.credit <= 0
                        or (not mc.no_ack and mc.prefetch and self.consumer_unacked(mch.id, mc.tag) >= mc.prefetch)
                        or (not mc.no_ack and mch.prefetch and len(self.unacked_on(mch.id)) >= mch.prefetch)
                    )
                    assert blocked, f"{q} has ready messages but consumer {mc} could take one"

    @invariant()
    def harness_saw_no_stray_confirms(self) -> None:
        for ch, st_ in self.h.confirms.items():
            if ch in self.channels:
                assert st_.last <= self.channels[ch].published

    def teardown(self) -> None:
        if getattr(self, "h", None) is None:
            return
        self.apply(self.h.sync())
        nb = restart_from_log(self.h)
        assert durable_view(nb) == durable_view(self.h.b)


def _delivery_order(c: Copy) -> tuple[int, int]:
    """Where a ready copy stands in its queue: higher priority first, then FIFO."""
    return -c.level, c.order


def _ready(b: Broker, q: str) -> list[Any]:
    return ready_entries(b, q)


BrokerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBrokerMachine = BrokerMachine.TestCase


class PagingBrokerMachine(BrokerMachine):
    """The same rules with durable queues keeping one ready message in memory: every
    other one is paged out once its record is durable and read back from the log."""

    MEMORY_MESSAGES = 1


PagingBrokerMachine.TestCase.settings = BrokerMachine.TestCase.settings
TestPagingBrokerMachine = PagingBrokerMachine.TestCase


# --------------------------------------------------- confirms under storage faults

confirm_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("publish"),
            st.integers(0, 2),  # channel index
            st.sampled_from(["durable", "transient-queue", "nowhere", "no-exchange", "mandatory-nowhere"]),
            st.booleans(),  # persistent
            st.sampled_from([None, "a", "b", "c"]),  # message_id
        ),
        st.tuples(st.just("durable"), st.integers(0, 3)),  # how many more LSNs become durable
        st.tuples(st.just("fail"), st.integers(1, 3)),  # fail the next few LSNs
        st.tuples(st.just("recover")),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=confirm_ops)
def test_confirms_exactly_once_in_order_under_faults(ops: list[tuple[object, ...]]) -> None:
    h = Harness()
    h.queue("d")
    h.queue("t", durable=False)
    h.b.declare_exchange("x", "direct")
    h.b.bind("x", "d", "d")
    h.b.bind("x", "t", "t")
    h.sync()
    chans = [h.channel() for _ in range(3)]
    # tag -> ("now", ack) or ("lsn", lsn) ; per channel
    expect: dict[int, dict[int, tuple[str, object]]] = {c: {} for c in chans}
    dedup: dict[str, int] = {}  # message_id -> LSN the first publish waited on
    failed: list[tuple[int, int]] = []
    storage_ok = True
    durable = h.b.durable_lsn

    def fail_lsn(lsn: int) -> bool:
        return any(a <= lsn <= b for a, b in failed)

    # Returns come in operation order: after the confirms of every earlier tag of their
    # channel, before their own (possibly in a later step than their publish).
    released: dict[int, int] = {c: 0 for c in chans}
    returned: dict[int, list[int]] = {c: [] for c in chans}
    expected_returns: dict[int, list[int]] = {c: [] for c in chans}

    def step() -> list[object]:
        effects = h.step()
        for e in effects:
            if isinstance(e, Return):
                assert released[e.channel_id] == e.delivery_tag - 1, (e.delivery_tag, released)
                returned[e.channel_id].append(e.delivery_tag)
            elif isinstance(e, Confirm) and e.channel_id in released:
                released[e.channel_id] = e.delivery_tag
        return effects

    def check_new_confirms() -> None:
        for ch in chans:
            st_ = h.confirms.get(ch)
            for tag, (ack, _reason) in (st_.outcome.items() if st_ else ()):
                kind, val = expect[ch][tag]
                if kind == "now":
                    assert ack is val, (ch, tag, ack, val)
                else:
                    assert isinstance(val, int)
                    if ack:
                        assert val <= durable and not fail_lsn(val), (tag, val, durable)
                    else:
                        assert fail_lsn(val)

    for op in ops:
        if op[0] == "publish":
            _, ci, dest, persistent, mid = op
            ch = chans[int(ci)]  # type: ignore[call-overload]
            props: dict[str, object] = {}
            if not persistent:
                props["delivery_mode"] = 1
            if mid is not None:
                props["message_id"] = mid
            exchange, key = {
                "durable": ("x", "d"),
                "transient-queue": ("x", "t"),
                "nowhere": ("x", "zzz"),
                "mandatory-nowhere": ("x", "zzz"),
                "no-exchange": ("nope", "d"),
            }[str(dest)]
            before = h.b.last_lsn
            is_dup = dest != "no-exchange" and mid is not None and mid in dedup
            tag = h.publish(ch, exchange, key, b"m", props or None, mandatory=dest == "mandatory-nowhere")
            logged = h.b.last_lsn != before
            if dest == "no-exchange":
                expect[ch][tag] = ("now", False)
            elif is_dup:
                lsn = dedup[str(mid)]
                expect[ch][tag] = ("lsn", lsn) if lsn else ("now", True)
                assert not logged
            elif dest == "durable" and persistent:
                if not storage_ok:
                    expect[ch][tag] = ("now", False)
                    assert not logged
                else:
                    assert logged
                    expect[ch][tag] = ("lsn", h.b.last_lsn)
                    if mid is not None:
                        dedup[str(mid)] = h.b.last_lsn
            else:
                assert not logged
                expect[ch][tag] = ("now", True)
                if mid is not None and dest != "mandatory-nowhere":
                    dedup[str(mid)] = 0  # (a returned publish was not taken: not remembered)
            step()
            if dest == "mandatory-nowhere" and not is_dup:
                expected_returns[ch].append(tag)
        elif op[0] == "durable":
            step()
            target = min(h.b.last_lsn, durable + int(op[1]))  # type: ignore[call-overload]
            while durable < target:
                durable += 1
                if not fail_lsn(durable):
                    h.b.durable(durable)
            step()
        elif op[0] == "fail":
            step()
            first = durable + 1
            last = min(h.b.last_lsn, durable + int(op[1]))  # type: ignore[call-overload]
            if first <= last:
                h.b.storage_failed(first, last, "boom")
                failed.append((first, last))
                storage_ok = False
                for m, lsn in list(dedup.items()):
                    if first <= lsn <= last:
                        del dedup[m]
                durable = last  # those LSNs are settled (failed); later ones may sync
            step()
        else:
            h.b.storage_recovered()
            storage_ok = True
        check_new_confirms()
    # the end: storage works, everything is synced: every tag answered exactly once
    h.b.storage_recovered()
    step()
    durable = h.b.last_lsn
    h.b.durable(durable)
    step()
    check_new_confirms()
    for ch in chans:
        st_ = h.confirms.get(ch)
        assert sorted(st_.outcome if st_ else ()) == sorted(expect[ch])
        assert returned[ch] == expected_returns[ch]

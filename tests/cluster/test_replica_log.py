"""The replicated log of one queue on one node (broker/cluster/replica_log.py) and what
its ops mean (broker/cluster/replica_ops.py): framing, a torn tail cut at open,
truncation by epoch (KIP-101/279), and the fold a new leader restores its queue from."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from broker.cluster import replica_follower
from broker.cluster.replica_follower import take_answer
from broker.cluster.replica_leader import LeaderSide
from broker.cluster.replica_log import ReplicaLog
from broker.cluster.replica_ops import (
    LedQueue,
    RecordTranslator,
    fold,
    published_ids,
    snapshot_op,
)
from broker.core import AppendRecords, Broker
from broker.core import records as rec


def _run(fn: object) -> None:
    trio.run(fn)  # type: ignore[arg-type]


def _translated(wall: float) -> tuple[Broker, RecordTranslator, list[dict[str, Any]], Callable[[], None]]:
    """A core whose queue ``q`` this node leads, its record translator, the ops the
    translator appends, and ``step``: the core's effects taken, its records translated
    and made durable."""
    core = Broker(clock=lambda: 0.0, wall_clock=lambda: wall)
    core.declare_queue("q")
    ops: list[dict[str, Any]] = []

    def append(queue: LedQueue, op: dict[str, Any], lsn: int, seq: int) -> int:
        ops.append(op)
        return len(ops)

    translator = RecordTranslator(append)
    translator.led[core.queues["q"].qid] = LedQueue("q", core.queues["q"].qid)

    def step() -> None:
        for effect in core.take_effects():
            if isinstance(effect, AppendRecords):
                translator.tap(effect)
                core.durable(effect.last_lsn)

    return core, translator, ops, step


def test_entries_survive_a_reopen_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "q.log"

    async def main() -> None:
        log = ReplicaLog(path)
        log.open()
        for i in range(3):
            log.append(5, {"t": "pub", "i": i})
        assert await log.sync() == 3

    _run(main)
    with open(path, "ab") as f:
        f.write(b"\x40\x00\x00\x00torn")
    again = ReplicaLog(path)
    again.open()
    assert again.end_offset == 3 and again.cut_bytes == 8 and again.last_epoch == 5
    assert [e[2]["i"] for e in again.read(2, 10)] == [1, 2]


def test_truncation_by_epoch_drops_what_the_new_leader_does_not_have(tmp_path: Path) -> None:
    async def main() -> None:
        leader = ReplicaLog(tmp_path / "leader.log")
        follower = ReplicaLog(tmp_path / "follower.log")
        leader.open()
        follower.open()
        # epoch 3 wrote 1..4; the follower got all four, the new leader (epoch 9) only
        # 1..2 before it took over and wrote 3..5 of its own
        for i in range(1, 5):
            follower.append(3, {"i": i})
        for i in range(1, 3):
            leader.append(3, {"i": i})
        for i in range(3, 6):
            leader.append(9, {"i": i, "new": True})
        await follower.sync()
        end = leader.end_of_epoch(follower.last_epoch)
        assert end == 2
        assert await follower.truncate_after(end) == 2
        follower.append_entries(leader.read(follower.end_offset + 1, 100))
        await follower.sync()
        assert follower.entries == leader.entries
        reopened = ReplicaLog(tmp_path / "follower.log")
        reopened.open()
        assert reopened.entries == leader.entries and reopened.epoch_starts == {3: 1, 9: 3}
        # an empty (wiped) follower keeps nothing and fetches everything
        assert ReplicaLog(tmp_path / "none.log").end_of_epoch(0) == 0
        assert leader.end_of_epoch(0) == 0 and leader.end_of_epoch(9) == 5

    _run(main)


def test_the_translator_turns_core_records_into_ops_and_fold_restores_them() -> None:
    core = Broker(clock=lambda: 0.0, wall_clock=lambda: 1_700_000_000.0)
    core.declare_queue("q")
    core.declare_queue("classic")
    ops: list[tuple[str, dict[str, object], int]] = []

    def append(queue: LedQueue, op: dict[str, object], lsn: int, seq: int) -> int:
        ops.append((queue.name, op, lsn))
        return len(ops)

    translator = RecordTranslator(append)
    translator.led[core.queues["q"].qid] = LedQueue("q", core.queues["q"].qid)
    ch = core.open_channel()
    for body in (b"a", b"b", b"c"):
        core.publish(ch, "", "q", body, {"message_id": body.decode()})
    core.publish(ch, "", "classic", b"not replicated", None)
    core.consume(ch, "q", prefetch=2)

    def step() -> None:
        for effect in core.take_effects():
            if isinstance(effect, AppendRecords):
                translator.tap(effect)
                core.durable(effect.last_lsn)

    step()
    core.ack(ch, 1)  # "a" settled; "b" delivered, unacked; "c" delivered in a's place
    step()
    kinds = [op["t"] for _q, op, _lsn in ops]
    assert kinds[:3] == ["pub", "pub", "pub"] and kinds[-1] == "set" and set(kinds[3:-1]) == {"dlv"}
    assert sorted(i for _q, op, _lsn in ops if op["t"] == "dlv" for i in op["ids"]) == [1, 2, 3]  # type: ignore[attr-defined]
    assert all(q == "q" for q, _op, _lsn in ops) and all(lsn for _q, op, lsn in ops if op["t"] == "pub")
    entries = [(1, i + 1, op) for i, (_q, op, _lsn) in enumerate(ops)]
    live, settled = fold(entries)
    assert [(m.body, m.deliveries) for m in live] == [(b"b", 1), (b"c", 1)]
    assert [mid for _x, mid, _w in settled] == ["a"]


def test_due_times_travel_the_log_from_a_delayed_publish_and_a_nack_with_delay() -> None:
    """A delay survives a failover: the ``pub`` op of a delayed publish carries its due
    time, a nack with a delay appends a ``due`` op, and fold hands both to the new
    leader."""
    now = 1_700_000_000.0
    core, _translator, ops, step = _translated(now)
    ch = core.open_channel()
    core.publish(ch, "", "q", b"later", None, delay_s=60)
    core.publish(ch, "", "q", b"nacked", None)
    core.consume(ch, "q", prefetch=1)
    step()
    core.nack(ch, 1, requeue=True, delay_s=30)
    step()
    assert ops[0]["t"] == "pub" and ops[0]["d"] == now + 60
    assert "d" not in ops[1]
    (due_op,) = [op for op in ops if op["t"] == "due"]
    assert due_op["n"] == [[2, round((now + 30) * 1000)]]
    live, _settled = fold([(1, i + 1, op) for i, op in enumerate(ops)])
    assert [(m.body, m.due) for m in live] == [(b"later", now + 60), (b"nacked", now + 30)]


def _pub(i: int) -> dict[str, object]:
    return {"t": "pub", "x": "", "k": "q", "p": {"message_id": f"id-{i}"}, "b": "eA==", "w": time.time()}


def test_compaction_keeps_what_the_log_folds_into_and_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "q.log"

    async def main() -> None:
        log = ReplicaLog(path)
        log.open()
        for i in range(1, 101):  # 100 messages in epoch 3, all but #7 settled; epoch 8 from 150
            log.append(3, _pub(i))
        log.append(3, {"t": "set", "ids": [i for i in range(1, 101) if i != 7]})
        log.append(3, {"t": "dlv", "ids": [7]})
        for i in range(102, 160):
            log.append(8 if i >= 150 else 3, _pub(i))
        await log.sync()
        log.append(8, {"t": "lead", "node": "x"})  # appended, not yet synced: stays unwritten
        before = fold(log.entries)
        ends = {e: log.end_of_epoch(e) for e in (0, 3, 8)}
        assert snapshot_op(log.entries[:20], 0.0, max_live_share=0.25) is None  # 20 live of 20: not worth it
        dropped = await log.compact(120, lambda prefix: snapshot_op(prefix, 0.0))
        assert dropped == 119 and log.first_offset == 120 and log.entries[0][2]["t"] == "snap"
        assert log.entries[0][0] == 3 and log.end_offset == 161
        after = fold(log.entries)
        assert [(m.id, m.deliveries) for m in after[0]] == [(m.id, m.deliveries) for m in before[0]]
        assert sorted(after[1]) == sorted(before[1])
        assert {e: log.end_of_epoch(e) for e in (0, 3, 8)} == ends
        await log.sync()
        reopened = ReplicaLog(path)
        reopened.open()
        assert reopened.entries == log.entries and reopened.epoch_starts == log.epoch_starts

    _run(main)


def test_a_failed_sync_keeps_its_entries_for_the_next_one(tmp_path: Path) -> None:
    """A write that fails (here: the file cannot be opened) counts nothing as synced
    and keeps what it was to write: the next sync writes it before the later entries.
    (Dropping it made the next sync claim every offset synced while the file began
    after the failed batch.)"""
    path = tmp_path / "q.log"

    async def main() -> None:
        log = ReplicaLog(path)
        log.open()
        for i in range(1, 4):
            log.append(5, _pub(i))
        path.mkdir()  # in the way of the log's file
        with pytest.raises(OSError):
            await log.sync()
        assert log.synced == 0
        path.rmdir()
        for i in range(4, 6):
            log.append(5, _pub(i))
        assert await log.sync() == 5

    _run(main)
    reopened = ReplicaLog(path)
    reopened.open()
    assert [e[1] for e in reopened.entries] == [1, 2, 3, 4, 5] and reopened.cut_bytes == 0


def test_a_failed_fsync_is_cut_back_and_written_again_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written but not fsynced (the fsync failed): the bytes are cut off the file and
    written again by the next sync, not left there to be written a second time."""
    path = tmp_path / "q.log"

    async def main() -> None:
        log = ReplicaLog(path)
        log.open()
        log.append(5, _pub(1))
        assert await log.sync() == 1
        failing = [OSError(5, "EIO")]
        real = log._fsync

        def fsync() -> None:
            if failing:
                raise failing.pop()
            real()

        monkeypatch.setattr(log, "_fsync", fsync)
        for i in range(2, 4):
            log.append(5, _pub(i))
        with pytest.raises(OSError):
            await log.sync()
        assert log.synced == 1
        log.append(5, _pub(4))
        assert await log.sync() == 4

    _run(main)
    reopened = ReplicaLog(path)
    reopened.open()
    assert [e[1] for e in reopened.entries] == [1, 2, 3, 4] and reopened.cut_bytes == 0


def test_a_prefix_not_worth_compacting_is_folded_again_only_once_half_as_long_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deep queue (every message live): the follower's compaction declines, and the
    next fetch answers do not fold the whole prefix again each time (the cost grew
    with the log at every batch: confirmed publishes slowed down as the queue grew)."""
    folds: list[int] = []

    def counting(prefix: list[Any]) -> dict[str, Any] | None:
        folds.append(len(prefix))
        return snapshot_op(prefix, 0.0)

    monkeypatch.setattr(replica_follower, "snapshot", counting)

    async def main() -> None:
        log = ReplicaLog(tmp_path / "q.log")
        log.open()
        offset = 0
        for _batch in range(40):  # 40 fetch answers of 10 publishes, none settled
            entries = [(3, offset + i + 1, _pub(offset + i + 1)) for i in range(10)]
            offset += 10
            await take_answer("q", log, {"entries": entries, "safe": offset}, compact_after=100)
        assert log.first_offset == 1  # nothing compacted: all live
        # tried once 100 entries precede the safe offset, then each time the prefix
        # is half as long again: not at each of the 30 answers past the first try
        assert folds == [110, 170, 260, 390]
        assert not log.wants_compaction(584, 100) and log.wants_compaction(585, 100)

    _run(main)


def test_a_follower_behind_the_compacted_prefix_installs_the_snapshot(tmp_path: Path) -> None:
    """The leader compacts once every replica holds the prefix (``held_by_all``); a
    follower that comes back empty (wiped, or newly added) gets the snapshot as the
    first entry of its fetch and installs it, then the entries after it."""

    async def main() -> None:
        leader_log = ReplicaLog(tmp_path / "leader.log")
        leader_log.open()
        side = LeaderSide(
            "q", 5, "a", ["a", "b"], leader_log,
            release=lambda lsns: None, deliverable=lambda seq: None, alive=lambda: True, compact_after=50,
        )
        follower = ReplicaLog(tmp_path / "b.log")
        follower.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(side.serve_sync)
            for i in range(1, 81):
                side.appended(leader_log.append(5, _pub(i)), 0)
                side.appended(leader_log.append(5, {"t": "set", "ids": [leader_log.end_offset]}), 0)
            while leader_log.synced < leader_log.end_offset:
                await trio.sleep(0.01)
            assert leader_log.first_offset == 1  # b holds nothing yet: nothing compacted
            while follower.end_offset < leader_log.end_offset:
                answer = await side.fetch("b", 5, follower.end_offset + 1, 0)
                await take_answer("q", follower, answer, compact_after=50)
            await side.fetch("b", 5, follower.end_offset + 1, 0)  # acknowledges everything
            side.appended(leader_log.append(5, _pub(999)), 0)  # wakes the sync loop: it compacts
            with trio.fail_after(10):
                while leader_log.first_offset == 1:
                    await trio.sleep(0.01)
            assert leader_log.entries[0][2]["t"] == "snap"
            # b is wiped: it comes back empty and fetches from 1
            wiped = ReplicaLog(tmp_path / "wiped.log")
            wiped.open()
            while wiped.end_offset < leader_log.end_offset:
                answer = await side.fetch("b", 5, wiped.end_offset + 1, 0)
                await take_answer("q", wiped, orjson.loads(orjson.dumps(answer)))  # (as over the wire)
            assert [list(e) for e in wiped.entries] == [list(e) for e in leader_log.entries]
            reopened = ReplicaLog(tmp_path / "wiped.log")
            reopened.open()
            assert reopened.entries == wiped.entries and reopened.epoch_starts == leader_log.epoch_starts
            live, _settled = fold(wiped.entries)
            assert [m.body for m in live] == [b"x"]  # (#999's body)
            side.stop()
            nursery.cancel_scope.cancel()

    _run(main)


def test_published_ids_name_the_pub_entries_a_stepping_down_leader_forgets() -> None:
    tail = [
        (5, 10, {"t": "pub", "x": "", "k": "q", "p": {"message_id": "m1"}, "b": "", "w": 1.0}),
        (5, 11, {"t": "pub", "x": "ex", "k": "q", "p": None, "b": "", "w": 1.0}),  # no id
        (5, 12, {"t": "dlv", "ids": [10]}),
        (5, 13, {"t": "pub", "x": "ex", "k": "q", "p": {"message_id": "m3", "priority": 1}, "b": "", "w": 1.0}),
    ]
    assert published_ids(tail) == [("", "m1"), ("ex", "m3")]


def test_snapshot_op_declines_by_count_exactly_where_the_fold_would() -> None:
    """The count that declines a deep prefix without folding it agrees with the fold:
    a prefix is compacted when at most a quarter of it is live, whatever mix of
    publishes, settles (some twice) and an earlier snapshot it holds."""
    rng = random.Random(7)
    for _case in range(200):
        ops: list[dict[str, Any]] = []
        published: list[int] = []
        for offset in range(1, rng.randint(2, 80)):
            if published and rng.random() < 0.5:
                ids = rng.sample(published, min(len(published), rng.randint(1, 3)))
                ops.append({"t": "set", "ids": ids})
            else:
                ops.append(_pub(offset))
                published.append(offset)
        entries = [(1, i + 1, op) for i, op in enumerate(ops)]
        live, _settled = fold(entries)
        expected_none = len(live) > 0.25 * len(entries)
        assert (snapshot_op(entries, 0.0) is None) == expected_none


def test_compaction_looks_at_its_prefix_off_the_event_loop_and_decides_as_before(tmp_path: Path) -> None:
    """The count that declines a deep queue's prefix and the fold of a drained one run
    in the rewrite's worker thread, not on the event loop (a log of a million entries
    stalled it for seconds); what they decide is what the same fold decides on the
    same prefix: declined with the same next try, or the same snapshot entry."""
    on_loop: list[bool] = []

    def looking(prefix: list[Any]) -> dict[str, Any] | None:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return snapshot_op(prefix, 0.0)

    async def main() -> None:
        deep = ReplicaLog(tmp_path / "deep.log")
        deep.open()
        for i in range(1, 201):
            deep.append(3, _pub(i))
        await deep.sync()
        assert snapshot_op(deep.entries[:150], 0.0) is None  # (a deep queue: declined)
        assert await deep.compact(150, looking) == 0
        assert deep.first_offset == 1 and not deep.wants_compaction(224, 10) and deep.wants_compaction(225, 10)
        drained = ReplicaLog(tmp_path / "drained.log")
        drained.open()
        for i in range(1, 101):
            offset = drained.append(3, _pub(i))
            drained.append(4, {"t": "set", "ids": [offset]})
        await drained.sync()
        prefix = list(drained.entries[:150])
        expected = (4, 150, {**(snapshot_op(prefix, 0.0) or {}), "t": "snap", "epochs": [[3, 1], [4, 2]]})
        assert await drained.compact(150, looking) == 149
        assert [list(e) for e in drained.entries[:1]] == [list(expected)]
        assert [e[1] for e in drained.entries] == list(range(150, 201))
        reopened = ReplicaLog(tmp_path / "drained.log")
        reopened.open()
        assert [list(e) for e in reopened.entries] == [list(e) for e in drained.entries]

    _run(main)
    assert on_loop == [False, False], "the prefix was looked at on the event loop"


def test_a_publish_without_dedup_is_marked_and_a_new_leader_does_not_remember_it() -> None:
    """A publish made without deduplication (AMQP's by default) keeps its message_id
    as a property in its ``pub`` entry, marked ``nd``: the stepping-down leader does not
    forget its id (published_ids), the fold does not count it among the settled ids,
    a compacted log (snapshot) keeps the mark, and the new leader restores it without
    remembering it, while a deduplicated publish's id is still remembered."""
    wall = 1_700_000_000.0
    core, _translator, ops, step = _translated(wall)
    ch = core.open_channel()
    core.publish(ch, "", "q", b"plain, settled", {"message_id": "p1"}, dedup=False)
    core.publish(ch, "", "q", b"plain, live", {"message_id": "p2"}, dedup=False)
    core.publish(ch, "", "q", b"dedup, settled", {"message_id": "d1"})
    core.publish(ch, "", "q", b"dedup, live", {"message_id": "d2"})
    core.consume(ch, "q", prefetch=4)
    step()
    core.ack(ch, 1)
    core.ack(ch, 3)
    step()
    pubs = [op for op in ops if op["t"] == "pub"]
    assert [op["p"] for op in pubs] == [{"message_id": i} for i in ("p1", "p2", "d1", "d2")]
    assert ["nd" in op for op in pubs] == [True, True, False, False]
    entries = [(1, i + 1, op) for i, op in enumerate(ops)]
    assert published_ids(entries) == [("", "d1"), ("", "d2")]
    folded = fold(entries)
    snap = snapshot_op(entries, 0.0, max_live_share=1.0)
    assert snap is not None
    assert [len(row) for row in snap["live"]] == [9, 8]  # (old snapshots' rows: 8 columns)
    for live, settled in (folded, fold([(1, len(ops), snap)])):
        assert [(m.body, m.dedup) for m in live] == [(b"plain, live", False), (b"dedup, live", True)]
        assert [(x, mid) for x, mid, _w in settled] == [("", "d1")]
        # the new leader, as replication.py takes the queue over
        leader = Broker(clock=lambda: 0.0, wall_clock=lambda: wall)
        leader.declare_queue("q")
        for m in live:
            leader.restore_message("q", m.exchange, m.routing_key, m.body, m.properties, m.wall, 1, m.due, dedup=m.dedup)
        for x, mid, when in settled:
            leader.remember_message_id(x, mid, when)
        assert [leader.dedup.lookup("", i, wall) is not None for i in ("p1", "p2", "d1", "d2")] == [
            False, False, True, True,
        ]
        assert [e.message.properties for e in leader.queues["q"].lanes[0].ready] == [
            {"message_id": "p2"}, {"message_id": "d2"},
        ]


def test_a_dead_letter_copy_keeps_its_own_message_id_across_a_failover() -> None:
    """The copy of a dead letter a node keeps for its own queues (here a quorum queue
    it leads) while it holds the dead letter for other nodes' queues is logged with a
    copy key as its deduplication id (``DeadLetters._copy_here_once``). Its ``pub``
    entry carries the message's own properties, and is marked ``nd``: a new leader
    delivers it with its own ``message_id`` (or none), never the copy key, and does
    not take the copy key or the id for a deduplication id."""
    wall = 1_700_000_000.0
    core, translator, ops, _step = _translated(wall)
    qid = core.queues["q"].qid
    copies = [
        rec.encode_enqueue(7, wall, None, [qid], "dlx", "k", "\x00copy:src\x007", {"message_id": "m1", "priority": 1}, b"with id"),
        rec.encode_enqueue(8, wall, None, [qid], "dlx", "k", "\x00copy:src\x008", None, b"without"),
    ]
    translator.tap(AppendRecords([(rec.RecordType.ENQUEUE, p) for p in copies], 1, 2))
    assert [(op["p"], "nd" in op) for op in ops] == [({"message_id": "m1", "priority": 1}, True), (None, False)]
    entries = [(1, i + 1, op) for i, op in enumerate(ops)]
    assert published_ids(entries) == []
    live, settled = fold(entries)
    assert settled == []
    leader = Broker(clock=lambda: 0.0, wall_clock=lambda: wall)
    leader.declare_queue("q")
    for m in live:
        leader.restore_message("q", m.exchange, m.routing_key, m.body, m.properties, m.wall, 0, m.due, dedup=m.dedup)
    assert [e.message.properties for e in leader.queues["q"].lanes[0].ready] == [
        {"message_id": "m1", "priority": 1}, None,
    ]
    assert leader.dedup.lookup("dlx", "m1", wall) is None

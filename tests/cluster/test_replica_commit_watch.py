"""``LeaderSide.watch``: whether a held record reached its quorum queue's majority, the
answer a dead letter's source waits for before it is settled (``dead_letters.py``).
True only once the in-sync majority holds the record; False when the leader stops
first, or for a record it never held. In process, with a real replica log."""

from __future__ import annotations

import time
from pathlib import Path

from broker.cluster.replica_leader import LeaderSide
from broker.cluster.replica_log import ReplicaLog


def _pub(i: int) -> dict[str, object]:
    return {"t": "pub", "x": "dlx", "k": "dead", "p": {}, "b": "eA==", "w": time.time()}


async def test_a_watch_is_true_once_the_majority_has_the_record_and_false_when_the_leader_stops(tmp_path: Path) -> None:
    log = ReplicaLog(tmp_path / "q.log")
    log.open()
    released: list[int] = []
    side = LeaderSide(
        "q", 5, "a", ["a", "b", "c"], log,
        release=released.extend, deliverable=lambda seq: None, alive=lambda: True,
    )
    side.appended(log.append(5, _pub(1)), 7, 1)
    watch = side.watch(7)
    assert not watch.done.is_set()
    never = side.watch(99)  # a record this leader does not hold
    assert never.done.is_set() and not never.committed
    await log.sync()
    side.advance(None)
    assert not watch.done.is_set()  # on the leader's disk alone
    await side.fetch("b", 5, log.end_offset + 1, 0)  # b holds it; c, in the in-sync set, not yet
    assert not watch.done.is_set() and released == []
    side.advance(["a", "b"])  # c left the in-sync set: a and b are the majority
    assert watch.done.is_set() and watch.committed and released == [7]

    # the leader stops before the majority has the next record: False
    side.appended(log.append(5, _pub(2)), 8, 2)
    late = side.watch(8)
    await log.sync()
    side.advance(None)
    assert not late.done.is_set()
    assert side.take_held() == [8]
    assert late.done.is_set() and not late.committed
    side.stop()
    stopped = side.watch(8)
    assert stopped.done.is_set() and not stopped.committed

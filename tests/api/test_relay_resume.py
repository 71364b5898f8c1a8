"""A relayed quorum-queue consumer between the loss of its leader and the next one
(``broker/api/channel/relay_resume.py``): it resumes on the first leader that takes
its consume, and gives up (with the reason its channel's ``cancel`` event carries)
when the queue is deleted, the time runs out or it is withdrawn. The real-node test
of the resume itself is tests/cluster/test_quorum_consumer_failover.py; these cover
the ends that need 30 s or a leaderless delete there."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from broker.api.channel.relay_resume import RESUME_POLL_S, RESUME_S, Resumption
from broker.core import ErrorReply, Unavailable

OP = {"op": "consume", "queue": "q", "consumer_tag": "c1"}


class _Cluster:
    """Where the queue's leader is, and what a consume there answers, as a test sets it."""

    def __init__(self) -> None:
        self.located: tuple[str, str | None] | None = ("b", None)  # known, but no leader yet
        self.refusal: ErrorReply | None = Unavailable("no leader yet", code="queue_unavailable")
        self.consumes: list[tuple[str, str, str]] = []

    def owner_of(self, queue: str) -> tuple[str, str | None] | None:
        assert queue == "q"
        return self.located

    async def consume_at(self, queue: str, owner: str, url: str, tag: str, op: dict[str, Any], relays: list[Any]) -> None:
        assert (queue, tag, op) == ("q", "c1", OP)
        self.consumes.append((owner, url, tag))
        if self.refusal is not None:
            raise self.refusal
        relays.append(("relay", owner))



def _start(nursery: trio.Nursery, resumption: Resumption, cluster: _Cluster) -> list[bool]:
    """Run ``resumption`` in ``nursery``; its outcome lands in the list returned."""
    outcome: list[bool] = []

    async def run() -> None:
        outcome.append(await resumption.run(cluster.owner_of, cluster.consume_at, lambda: False))

    nursery.start_soon(run)
    return outcome

async def test_it_resumes_on_the_first_leader_that_takes_the_consume(autojump_clock: trio.testing.MockClock) -> None:
    cluster = _Cluster()
    resumption = Resumption("q", "c1", OP, "queue_unavailable: leader lost")
    async with trio.open_nursery() as nursery:
        outcome = _start(nursery, resumption, cluster)
        await trio.sleep(3 * RESUME_POLL_S)
        assert cluster.consumes == [] and not outcome  # no leader named: nothing asked
        cluster.located = ("c", "http://127.0.0.1:1")
        await trio.sleep(2 * RESUME_POLL_S)
        assert cluster.consumes and not outcome  # named, but it refuses for now
        cluster.refusal = None
        started = trio.current_time()
    assert outcome == [True]
    assert trio.current_time() - started <= RESUME_POLL_S
    assert cluster.consumes[-1] == ("c", "http://127.0.0.1:1", "c1")
    assert resumption.relays == [("relay", "c")]


async def test_it_gives_up_after_resume_s_with_the_last_refusal_as_its_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = _Cluster()
    cluster.located = ("c", "http://127.0.0.1:1")
    resumption = Resumption("q", "c1", OP, "queue_unavailable: leader lost")
    start = trio.current_time()
    assert await resumption.run(cluster.owner_of, cluster.consume_at, lambda: False) is False
    assert RESUME_S <= trio.current_time() - start < RESUME_S + 2 * RESUME_POLL_S
    assert resumption.reason == "queue_unavailable: no leader yet"
    assert len(cluster.consumes) >= RESUME_S / RESUME_POLL_S / 2  # it kept asking meanwhile
    assert not resumption.withdrawn


async def test_a_queue_deleted_while_it_waits_ends_it_at_once(autojump_clock: trio.testing.MockClock) -> None:
    cluster = _Cluster()
    resumption = Resumption("q", "c1", OP, "queue_unavailable: leader lost")
    async with trio.open_nursery() as nursery:
        outcome = _start(nursery, resumption, cluster)
        await trio.sleep(1.0)
        cluster.located = None  # gone from the cluster's definitions
        deleted_at = trio.current_time()
    assert outcome == [False]
    assert trio.current_time() - deleted_at <= RESUME_POLL_S
    assert resumption.reason == "queue 'q' was deleted"


async def test_withdrawn_while_it_waits_it_ends_marked_withdrawn(autojump_clock: trio.testing.MockClock) -> None:
    cluster = _Cluster()
    resumption = Resumption("q", "c1", OP, "queue_unavailable: leader lost")
    async with trio.open_nursery() as nursery:
        outcome = _start(nursery, resumption, cluster)
        await trio.sleep(2.0)
        resumption.withdraw()
        withdrawn_at = trio.current_time()
    assert outcome == [False] and resumption.withdrawn
    assert trio.current_time() == withdrawn_at


async def test_the_channels_end_stops_it_without_a_consume(autojump_clock: trio.testing.MockClock) -> None:
    cluster = _Cluster()
    cluster.located = ("c", "http://127.0.0.1:1")
    cluster.refusal = None
    resumption = Resumption("q", "c1", OP, "queue_unavailable: leader lost")
    assert await resumption.run(cluster.owner_of, cluster.consume_at, lambda: True) is False
    assert cluster.consumes == []

"""A relayed quorum-queue consumer between the loss of its leader and the next one
(``broker/api/channel/relay_resume.py``): it resumes on the first leader that takes
its consume, and gives up (with the reason its channel's ``cancel`` event carries)
when the queue is deleted, the time runs out or it is withdrawn. The real-node test
of the resume itself is tests/cluster/test_quorum_consumer_failover.py; these cover
the ends that need 30 s or a leaderless delete there. Then the channel's own consumer
of a quorum queue this node stops leading: resumed, not cancelled (the real-node test
is tests/cluster/test_quorum_consumer_stepdown.py)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from broker.api.channel.ops import OPS
from broker.api.channel.relay_resume import RESUME_POLL_S, RESUME_S, Resumption
from broker.api.channel.session import ServedChannel
from broker.cluster.mirror import moved_reason
from broker.core import ConsumerCancelled, Deliver, ErrorReply, Unavailable
from broker.runtime import BrokerRuntime, CommandGateway, RuntimeOptions

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


# -- a channel's own consumer of a quorum queue this node stops leading -------------
#
# The HTTP channel (``ServedChannel``, with its relayed consumers and their ``local``
# part) over a real core, in a runtime whose cluster port is a stand-in: this node
# ("a") leads quorum queue "q" while the core holds it; a step-down is the core's
# delete with the cluster's ``queue_moved`` reason (``broker/cluster/mirror.py``).


class _Port:
    """The cluster port as the channel's relays ask it: where ``q`` is led."""

    node_name = "a"
    secret = None
    peer_ssl = None

    def __init__(self) -> None:
        self.located: tuple[str, str | None] | None = ("a", "http://127.0.0.1:1")

    def owner_of(self, queue: str) -> tuple[str, str | None] | None:
        return self.located if queue == "q" else None

    def is_replicated(self, queue: str) -> bool:
        return queue == "q"

    def peer_channel(self, channel_id: int, opened: bool) -> None:
        pass


class _Response:
    """A response that never sends at once: the channel's events stay in its outbox."""

    def can_send_nowait(self) -> bool:
        return False


def _channel(nursery: trio.Nursery) -> tuple[Any, Any, _Port]:
    """(the channel, its gateway, the cluster port) with quorum queue ``q`` led here."""
    runtime = BrokerRuntime(RuntimeOptions(data_dir=None))
    port = _Port()
    runtime.cluster = port  # type: ignore[assignment]  # (a stand-in for the ClusterPort)
    gateway = CommandGateway(runtime)
    gateway.run(lambda core: core.declare_queue("q", durable=True))
    channel_id = gateway.open_channel()
    session = ServedChannel(runtime, channel_id, _Response(), gateway=gateway)  # type: ignore[arg-type]
    session.tasks = nursery
    gateway.attach(channel_id, session)
    return session, gateway, port


async def _consume(session: Any, **fields: Any) -> None:
    await OPS["consume"](session, {"op": "consume", "queue": "q", "consumer_tag": "w", "id": 1, **fields})
    session.batch.flush()


def _events(session: Any) -> list[Any]:
    """The channel's outbox so far (emptied): events, and the core's effects."""
    out, session.outbox = session.outbox, []
    return out


def _step_down(gateway: Any) -> None:
    gateway.run(lambda core: core.delete_queue("q", reason=moved_reason("q", "lease lost")))


async def test_a_local_consumer_cancelled_by_a_step_down_consumes_here_again_when_this_node_leads_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        session, gateway, _port = _channel(nursery)
        cid = session.channel_id
        await _consume(session, prefetch=3, arguments={"x-priority": 2})
        gateway.run(lambda core: core.publish(cid, "", "q", b"m0", None))
        ok, *effects = _events(session)
        (delivered,) = [e for e in effects if isinstance(e, Deliver)]
        assert ok["ev"] == "consume_ok" and delivered.message.body == b"m0"
        _step_down(gateway)
        assert not [e for e in _events(session) if isinstance(e, ConsumerCancelled)]  # no cancel for the client
        assert session.relayed.has_consumer("w")  # waiting for the next leader: the tag stays taken
        await trio.sleep(2.5 * RESUME_POLL_S)  # named leader (this node), but its core has no queue yet
        assert not gateway.views.has_consumer(cid, "w")
        gateway.run(lambda core: core.declare_queue("q", durable=True))  # this node leads it again
        gateway.run(lambda core: core.publish(cid, "", "q", b"m1", None))
        await trio.sleep(RESUME_POLL_S)  # (the virtual clock: off the polls' beat, half a poll on)
        assert gateway.views.has_consumer(cid, "w") and not session.relayed.has_consumer("w")
        (info,) = gateway.views.channel_info(cid)["consumers"]
        assert info["prefetch"] == 3 and info["consumer_tag"] == "w"  # what the first consume asked
        (again,) = [e for e in _events(session) if isinstance(e, Deliver)]
        assert again.consumer_tag == "w" and again.message.body == b"m1"
        # the old delivery's tag does nothing now (no error): its queue is gone
        assert gateway.run(lambda core: core.ack(cid, delivered.delivery_tag)) == 1
        # and a second step-down is survived the same way
        _step_down(gateway)
        assert not [e for e in _events(session) if isinstance(e, ConsumerCancelled)]
        nursery.cancel_scope.cancel()


async def test_a_local_consumer_of_a_deleted_quorum_queue_is_cancelled_as_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        session, gateway, _port = _channel(nursery)
        await _consume(session)
        _events(session)
        gateway.run(lambda core: core.delete_queue("q"))
        (cancelled,) = _events(session)
        assert isinstance(cancelled, ConsumerCancelled) and cancelled.reason == "queue deleted"
        assert not session.relayed.has_consumer("w")


async def test_a_step_down_then_the_queues_delete_cancels_it_with_the_resumptions_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        session, gateway, port = _channel(nursery)
        await _consume(session)
        _events(session)
        _step_down(gateway)
        assert _events(session) == []
        await trio.sleep(1.0)
        port.located = None  # deleted from the cluster while it waited
        await trio.sleep(2 * RESUME_POLL_S)
        assert _events(session) == [{"ev": "cancel", "consumer_tag": "w", "reason": "queue 'q' was deleted"}]
        assert not session.relayed.has_consumer("w")


async def test_cancelled_while_it_waits_it_does_not_consume_again(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        session, gateway, _port = _channel(nursery)
        await _consume(session)
        _step_down(gateway)
        _events(session)
        await OPS["cancel"](session, {"op": "cancel", "consumer_tag": "w", "id": 2})
        assert _events(session) == [{"ev": "cancel_ok", "id": 2, "consumer_tag": "w"}]
        gateway.run(lambda core: core.declare_queue("q", durable=True))
        await trio.sleep(RESUME_S)
        assert not gateway.views.has_consumer(session.channel_id, "w") and _events(session) == []
        nursery.cancel_scope.cancel()


async def test_the_channels_end_while_it_waits_ends_it(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        session, gateway, _port = _channel(nursery)
        await _consume(session)
        _step_down(gateway)
        _events(session)
        session.stop_consumers()  # the channel ends (its close, an error, the broker's shutdown)
        assert not session.relayed.has_consumer("w")
        gateway.run(lambda core: core.declare_queue("q", durable=True))
        await trio.sleep(RESUME_S)
        assert not gateway.views.has_consumer(session.channel_id, "w") and _events(session) == []
        nursery.cancel_scope.cancel()


async def test_another_nodes_channel_sees_the_step_down_as_a_cancel_for_that_node_to_resume(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        session, gateway, _port = _channel(nursery)
        session.forwarded = True  # a relay's channel: its node resumes the consumer
        await _consume(session)
        _events(session)
        _step_down(gateway)
        (cancelled,) = _events(session)
        assert isinstance(cancelled, ConsumerCancelled) and cancelled.reason.startswith("queue_moved: ")
        nursery.cancel_scope.cancel()

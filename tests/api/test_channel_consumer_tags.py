"""An HTTP channel's consumer tags name one consumer each, whatever its kind: a
queue consumer's, the direct reply-to consumer's, a relayed consumer's of another
node's queue, and a quorum queue's consumer waiting for its next leader (one answer
to "is this tag taken", the core's: broker/core/consumertags.py). A tag is free
again once its consumer is cancelled, and after a relayed consume that failed.

The first part on a single node (an in-process broker over memory streams); the
second with a stand-in cluster port (tests/api/test_relay_resume.py's), where
queue ``far`` is led by node ``b`` at an address nobody listens on: a relayed
consume of it is refused for its tag before it tries, and fails with
``queue_unavailable`` after it tried. The cells with a live relay are
tests/cluster/test_consumer_tag_holders.py."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
import trio.testing

from broker.api.channel import relayed as relayed_module
from broker.api.channel.ops import OPS
from broker.api.channel.relay_resume import RESUME_POLL_S
from broker.core import ChannelError, ErrorReply
from tests.api.test_relay_resume import _channel, _step_down
from tests.support.app import MemoryBroker
from tests.support.channel import Clients
from tests.support.memory_fixtures import broker, clients  # noqa: F401 (fixtures)

REPLY_TO = "amq.rabbitmq.reply-to"
IN_USE = "consumer tag 't' is already in use on this channel"
QUEUE = {"op": "consume", "queue": "q", "consumer_tag": "t"}
REPLY = {"op": "consume", "queue": REPLY_TO, "consumer_tag": "t", "no_ack": True}

# -- a single node ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [(QUEUE, QUEUE), (QUEUE, REPLY), (REPLY, QUEUE)],
    ids=["queue-then-queue", "queue-then-reply", "reply-then-queue"],
)
async def test_a_tag_in_use_is_refused_with_not_allowed(
    broker: MemoryBroker, clients: Clients, first: dict[str, Any], second: dict[str, Any]
) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        await ch.ok({"op": "declare_queue", "queue": "q"})
        await ch.ok(first)
        error = await ch.call(second)
        assert (error["ev"], error["error"], error["message"]) == ("error", "not_allowed", IN_USE)


async def test_a_cancelled_consumers_tag_is_free_again_for_either_kind(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        await ch.ok({"op": "declare_queue", "queue": "q"})
        for first, second in ((QUEUE, REPLY), (REPLY, QUEUE), (QUEUE, QUEUE)):
            await ch.ok(first)
            await ch.ok({"op": "cancel", "consumer_tag": "t"})
            ok = await ch.call(second)
            assert (ok["ev"], ok["consumer_tag"]) == ("consume_ok", "t")
            await ch.ok({"op": "cancel", "consumer_tag": "t"})


# -- a cluster node (a stand-in cluster port) ------------------------------------------

FAR = {"op": "consume", "queue": "far", "consumer_tag": "w", "id": 9}


def _with_far(port: Any) -> None:
    """``far`` is node b's, at an address nobody listens on."""
    here = port.owner_of
    port.owner_of = lambda queue: ("b", "http://127.0.0.1:1") if queue == "far" else here(queue)


async def _refused(session: Any, op: dict[str, Any]) -> ErrorReply:
    with pytest.raises(ErrorReply) as refused:
        await OPS["consume"](session, op)
    session.batch.flush()
    return refused.value


async def test_a_relayed_consume_of_a_tag_in_use_is_refused_before_it_tries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        session, gateway, port = _channel(nursery)
        _with_far(port)
        gateway.run(lambda core: core.declare_queue("mine"))
        for holder in ({"queue": "mine"}, {"queue": REPLY_TO, "no_ack": True}):
            await OPS["consume"](session, {"op": "consume", "consumer_tag": "w", "id": 1, **holder})
            error = await _refused(session, FAR)
            assert isinstance(error, ChannelError) and error.code == "not_allowed", error
            assert "consumer tag 'w' is" in error.message and "in use on this channel" in error.message
            await OPS["cancel"](session, {"op": "cancel", "consumer_tag": "w", "id": 2})
        # a free tag: it tries, and fails for the owner (nobody there), not the tag
        error = await _refused(session, FAR)
        assert error.code == "queue_unavailable", error
        # ... and the tag that failed is free: a local consume takes it
        await OPS["consume"](session, {"op": "consume", "queue": "mine", "consumer_tag": "w", "id": 3})
        assert gateway.views.has_consumer(session.channel_id, "w")
        nursery.cancel_scope.cancel()


async def test_a_quorum_consumer_waiting_for_its_next_leader_keeps_its_tag(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        session, gateway, port = _channel(nursery)
        _with_far(port)
        cid = session.channel_id
        gateway.run(lambda core: core.declare_queue("mine"))
        await OPS["consume"](session, {"op": "consume", "queue": "q", "consumer_tag": "w", "id": 1})
        session.batch.flush()
        _step_down(gateway)  # "w" waits for q's next leader (this node, once its core has q)
        await trio.sleep(RESUME_POLL_S)
        assert session.relayed.has_consumer("w") and not gateway.views.has_consumer(cid, "w")
        for op in (
            {"op": "consume", "queue": "mine", "consumer_tag": "w", "id": 2},
            {"op": "consume", "queue": REPLY_TO, "consumer_tag": "w", "no_ack": True, "id": 3},
            FAR,
        ):
            error = await _refused(session, op)
            assert isinstance(error, ChannelError) and error.code == "not_allowed", (op, error)
        assert gateway.views.consumer_tags(cid) == [] and gateway.views.reply_address(cid) is None
        # this node leads q again: the consumer resumes here, under its tag
        gateway.run(lambda core: core.declare_queue("q", durable=True))
        await trio.sleep(2 * RESUME_POLL_S)
        assert gateway.views.has_consumer(cid, "w") and not session.relayed.has_consumer("w")
        error = await _refused(session, {"op": "consume", "queue": "mine", "consumer_tag": "w", "id": 4})
        assert error.code == "not_allowed"
        nursery.cancel_scope.cancel()


async def test_a_withdrawn_resumptions_tag_is_free_again(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        session, gateway, _port = _channel(nursery)
        cid = session.channel_id
        gateway.run(lambda core: core.declare_queue("mine"))
        await OPS["consume"](session, {"op": "consume", "queue": "q", "consumer_tag": "w", "id": 1})
        _step_down(gateway)
        await trio.sleep(RESUME_POLL_S)
        await OPS["cancel"](session, {"op": "cancel", "consumer_tag": "w", "id": 2})
        await OPS["consume"](session, {"op": "consume", "queue": "mine", "consumer_tag": "w", "id": 3})
        session.batch.flush()
        assert gateway.views.consumer_queues(cid) == [("w", "mine")]
        nursery.cancel_scope.cancel()


async def test_a_generated_relayed_tag_passes_over_one_a_client_chose(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relayed_module, "_names", itertools.count(1))
    async with trio.open_nursery() as nursery:
        session, gateway, port = _channel(nursery)
        _with_far(port)
        gateway.run(lambda core: core.declare_queue("mine"))
        await OPS["consume"](session, {"op": "consume", "queue": "mine", "consumer_tag": "amq.ctag-relayed-1", "id": 1})
        # no tag named: not refused for the client's, but tried (and failed for the owner)
        error = await _refused(session, {"op": "consume", "queue": "far", "id": 2})
        assert error.code == "queue_unavailable", error
        assert not gateway.views.consumer_tag_taken(session.channel_id, "amq.ctag-relayed-2")  # given back
        nursery.cancel_scope.cancel()

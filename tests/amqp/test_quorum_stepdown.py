"""Cluster mode, the AMQP front end's decision when a consumer of a quorum queue this
node leads is cancelled by the core (``AMQPChannel`` with ``relays.quorum_of``): a
step-down (the cluster's ``queue_moved`` reason) sends no ``basic.cancel`` and the
consumer goes on, here again once this node leads the queue again; a delete sends
``basic.cancel`` as before. The in-process core with a stand-in cluster port, over
memory streams with the raw pamqp client; the real-node test is
tests/cluster/test_quorum_consumer_stepdown.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio
from pamqp import commands

from broker.cluster.mirror import moved_reason
from broker.runtime import CommandGateway
from tests.amqp.rawclient import RawAMQP, open_amqp

Basic = commands.Basic


class _Port:
    """The cluster port as an AMQP channel asks it: this node ("a") leads quorum queue
    ``q`` (a publish is never forwarded)."""

    node_name = "a"
    secret = None
    peer_ssl = None

    def owner_of(self, queue: str) -> tuple[str, str | None] | None:
        return ("a", "http://127.0.0.1:1") if queue == "q" else None

    def is_replicated(self, queue: str) -> bool:
        return queue == "q"

    def plan(self, *_args: Any) -> None:
        return None

    def peer_channel(self, channel_id: int, opened: bool) -> None:
        pass


@pytest.fixture
def clustered(app: Any) -> Iterator[CommandGateway]:
    """``app``'s runtime in a stand-in cluster, quorum queue ``q`` declared (led here)."""
    gateway = CommandGateway(app.runtime)
    gateway.run(lambda core: core.declare_queue("q", durable=True))
    app.runtime.cluster = _Port()
    try:
        yield gateway
    finally:
        app.runtime.cluster = None


async def _consume_one(c: RawAMQP, gateway: CommandGateway, body: bytes) -> Any:
    """Consume ``q`` as ``w`` on channel 1; ``body`` published, its delivery."""
    await c.open_channel(1)
    await c.send(1, Basic.Qos(prefetch_count=5))
    await c.expect(Basic.QosOk, 1)
    await c.send(1, Basic.Consume(queue="q", consumer_tag="w"))
    await c.expect(Basic.ConsumeOk, 1)
    gateway.run(lambda core: core.publish(core.open_channel(), "", "q", body, None))
    method, _props, got = await c.message()
    assert got == body and method.consumer_tag == "w"
    return method


async def test_a_step_down_sends_no_basic_cancel_and_the_consumer_consumes_here_again(
    app: Any, clustered: CommandGateway,
) -> None:
    gateway = clustered
    async with open_amqp(app) as c:
        first = await _consume_one(c, gateway, b"m0")
        gateway.run(lambda core: core.delete_queue("q", reason=moved_reason("q", "lease lost")))
        gateway.run(lambda core: core.declare_queue("q", durable=True))  # led here again
        gateway.run(lambda core: core.publish(core.open_channel(), "", "q", b"m1", None))
        with trio.fail_after(5):  # (the resumption looks every 0.25 s)
            method, _props, body = await c.message()  # a basic.cancel first would fail here
        assert body == b"m1" and method.consumer_tag == "w" and method.delivery_tag > first.delivery_tag
        # the old delivery's tag does nothing now: no channel error
        await c.send(1, Basic.Ack(delivery_tag=first.delivery_tag))
        await c.send(1, Basic.Ack(delivery_tag=method.delivery_tag))
        await c.send(1, commands.Queue.Declare(queue="q", passive=True))
        ok = await c.expect(commands.Queue.DeclareOk, 1)
        assert ok.consumer_count == 1 and ok.message_count == 0


async def test_a_delete_sends_basic_cancel_as_before(app: Any, clustered: CommandGateway) -> None:
    gateway = clustered
    async with open_amqp(app) as c:
        await _consume_one(c, gateway, b"m0")
        gateway.run(lambda core: core.delete_queue("q"))
        cancel = await c.expect(Basic.Cancel, 1)
        assert cancel.consumer_tag == "w"

"""A channel's consumer tags across every kind of consumer in a cluster: a consumer
of another node's queue (relayed, broker/api/channel/relayed.py) is not in this
node's core as a consumer, yet its tag is taken on the channel like any other's
(the core keeps every tag of a channel: broker/core/consumertags.py). Each cell of
"a tag held by X, taken again by a new consumer of kind Y" on an HTTP channel and
an AMQP channel of node a, with queue ``there`` led by node b (relayed) and queue
``here`` led by a; and a relayed consumer's tag is free again once it is cancelled.

The same cells without a live relay (a core consumer's, the reply consumer's, a
quorum consumer waiting for its next leader) are in-process:
tests/api/test_channel_consumer_tags.py and tests/amqp/test_consumer_tags.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from pamqp import commands

from tests.amqp.rawclient import RawAMQP
from tests.cluster.conftest import wait_caught_up
from tests.cluster.test_cluster_amqp import CLIENT_LOCAL, AMQPNode, amqp_nodes
from tests.support.etcd import EtcdProcess
from tests.support.rawchannel import RawChannel

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REPLY_TO = "amq.rabbitmq.reply-to"
Basic = commands.Basic


def _http_refused(port: int, first: dict[str, object], second: dict[str, object]) -> dict[str, object]:
    """On a new channel: consume with ``first`` (it must succeed), then with ``second``
    under the same tag ``t``: the error event that refuses the second."""
    ch = RawChannel(port)
    try:
        ok = ch.call({"op": "consume", "consumer_tag": "t", **first})
        assert (ok["ev"], ok.get("consumer_tag")) == ("consume_ok", "t"), ok
        refused = ch.call({"op": "consume", "consumer_tag": "t", **second})
        assert refused["ev"] == "error", refused
        return refused
    finally:
        ch.close()


def test_a_relayed_consumers_tag_on_an_http_channel(tmp_path: Path, etcd: EtcdProcess) -> None:
    with amqp_nodes(tmp_path, etcd) as (a, b):
        assert b.proc.request("PUT", "/queues/there", {"durable": True, "arguments": CLIENT_LOCAL})[0] == 201
        assert a.proc.request("PUT", "/queues/here", {"durable": True, "arguments": CLIENT_LOCAL})[0] == 201
        wait_caught_up(a.proc, b.proc)
        relayed = {"queue": "there"}
        cells = [
            (relayed, {"queue": "here"}),  # a relayed consumer's tag: a local consume
            (relayed, {"queue": REPLY_TO, "no_ack": True}),  # ... a reply consumer
            (relayed, relayed),  # ... another relayed consume
            ({"queue": "here"}, relayed),  # a local consumer's tag: a relayed consume
            ({"queue": REPLY_TO, "no_ack": True}, relayed),  # the reply consumer's: a relayed consume
        ]
        for first, second in cells:
            refused = _http_refused(a.proc.port, first, second)
            assert refused["error"] == "not_allowed", (first, second, refused)
            assert "consumer tag 't' is" in str(refused["message"]), refused
            assert "in use on this channel" in str(refused["message"]), refused
        # nothing of a refused relayed consume stayed on the owner; b's consumers of
        # there are the relays of the channels above, all closed
        status, info = b.proc.request("GET", "/queues/there")
        assert status == 200 and info["consumers"] == 0, info
        # a relayed consumer cancelled: its tag is free again, for every kind
        ch = RawChannel(a.proc.port)
        try:
            for second in ({"queue": "here"}, {"queue": REPLY_TO, "no_ack": True}, relayed):
                assert ch.call({"op": "consume", "consumer_tag": "t", **relayed})["ev"] == "consume_ok"
                assert ch.call({"op": "cancel", "consumer_tag": "t"})["ev"] == "cancel_ok"
                ok = ch.call({"op": "consume", "consumer_tag": "t", **second})
                assert (ok["ev"], ok.get("consumer_tag")) == ("consume_ok", "t"), (second, ok)
                assert ch.call({"op": "cancel", "consumer_tag": "t"})["ev"] == "cancel_ok"
        finally:
            ch.close()


async def _amqp_refusal(port: int, first: Basic.Consume, second: Basic.Consume) -> tuple[int, str]:
    """On a new connection: ``first`` (it must succeed), then ``second``: how the
    connection is closed (530 is a connection exception)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        client = RawAMQP(stream)
        await client.handshake()
        await client.open_channel(1)
        await client.send(1, first)
        await client.expect(Basic.ConsumeOk, 1)
        await client.send(1, second)
        return await client.closed_with(None)
    finally:
        await stream.aclose()


async def _amqp_cells(a: AMQPNode) -> list[tuple[int, str]]:
    relayed = Basic.Consume(queue="there", consumer_tag="t")
    here = Basic.Consume(queue="here", consumer_tag="t")
    reply = Basic.Consume(queue=REPLY_TO, consumer_tag="t", no_ack=True)
    out = []
    with trio.fail_after(60):
        for first, second in ((relayed, here), (relayed, reply), (relayed, relayed), (here, relayed), (reply, relayed)):
            out.append(await _amqp_refusal(a.amqp_port, first, second))
        # a relayed consumer cancelled: its tag is free again
        stream = await trio.open_tcp_stream("127.0.0.1", a.amqp_port)
        try:
            client = RawAMQP(stream)
            await client.handshake()
            await client.open_channel(1)
            for second in (here, reply, relayed):
                await client.send(1, relayed)
                await client.expect(Basic.ConsumeOk, 1)
                await client.send(1, Basic.Cancel(consumer_tag="t"))
                await client.expect(Basic.CancelOk, 1)
                await client.send(1, second)
                assert (await client.expect(Basic.ConsumeOk, 1)).consumer_tag == "t"
                await client.send(1, Basic.Cancel(consumer_tag="t"))
                await client.expect(Basic.CancelOk, 1)
        finally:
            await stream.aclose()
    return out


def test_a_relayed_consumers_tag_on_an_amqp_channel(tmp_path: Path, etcd: EtcdProcess) -> None:
    with amqp_nodes(tmp_path, etcd) as (a, b):
        assert b.proc.request("PUT", "/queues/there", {"durable": True, "arguments": CLIENT_LOCAL})[0] == 201
        assert a.proc.request("PUT", "/queues/here", {"durable": True, "arguments": CLIENT_LOCAL})[0] == 201
        wait_caught_up(a.proc, b.proc)
        refusals = trio.run(_amqp_cells, a)
        assert refusals == [(530, "NOT_ALLOWED - attempt to reuse consumer tag 't'")] * 5, refusals

"""Transactions end to end: the wire protocol's tx ops and the client's
``async with ch.transaction():`` against a real broker."""

from __future__ import annotations

import pytest
import trio

import client
from client import ClientError, ConnectionLost, PublishNacked
from tests.support.broker import BrokerProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow


def test_tx_ops_on_the_wire_and_their_wrong_states(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with BrokerProcess(tmp_path / "data") as broker:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        ch = RawChannel(broker.port)
        ch.send({"op": "tx_select", "id": 1})
        assert ch.next_event() == {"ev": "ok", "id": 1, "op": "tx_select"}
        ch.send({"op": "publish", "routing_key": "q", "body": "a"}, {"op": "publish", "routing_key": "q", "body": "b"})
        ch.send({"op": "tx_commit", "id": 2})
        events = [ch.next_event()]
        while events[-1].get("id") != 2:
            events.append(ch.next_event())
        assert events[-1] == {"ev": "ok", "id": 2, "op": "tx_commit", "operations": 2}
        # the two publishes were confirmed first (one event may confirm both)
        assert {e["ev"] for e in events[:-1]} == {"ack"} and events[-2]["delivery_tag"] == 2
        assert broker.request("GET", "/queues/q")[1]["messages_ready"] == 2
        ch.send({"op": "tx_select", "id": 3})  # already transactional
        error = ch.next_event()
        assert error["ev"] == "error" and error["error"] == "precondition_failed" and error["id"] == 3
        ch.close()


async def test_client_commit_rollback_acks_and_a_dropped_connection(async_broker: BrokerProcess) -> None:
    broker = async_broker
    async with client.connect(broker.url) as conn:
        await conn.declare_queue("q")
        async with conn.channel() as ch:
            async with ch.transaction():
                handles = [await ch.start_publish("", "q", f"c{i}") for i in range(3)]
                with pytest.raises(ClientError, match="start_publish"):
                    await ch.publish("", "q", "x")
                assert (await conn.queue_info("q")).messages_ready == 0  # not before the commit
            for handle in handles:
                await handle
            assert (await conn.queue_info("q")).messages_ready == 3

            with pytest.raises(RuntimeError, match="boom"):
                async with ch.transaction():
                    doomed = await ch.start_publish("", "q", "never")
                    raise RuntimeError("boom")
            with pytest.raises(PublishNacked, match="rolled back"):
                await doomed
            assert (await conn.queue_info("q")).messages_ready == 3

            with pytest.raises(ClientError, match="transactional"):
                await ch.start_publish("", "q", "outside")  # the channel stays transactional

            # acks inside a transaction take effect at its commit
            async with ch.consume("q", prefetch=10) as messages:
                with trio.fail_after(10):
                    got = [await messages.receive() for _ in range(3)]
                async with ch.transaction():
                    for message in got:
                        await message.ack()
                    assert (await conn.queue_info("q")).messages_unacked == 3
            assert (await conn.queue_info("q")).messages_unacked == 0

        # the connection drops during a transaction: nothing of it is applied or resent
        async with conn.channel() as ch2:
            with pytest.raises(ConnectionLost):
                async with ch2.transaction():
                    lost = await ch2.start_publish("", "q", "lost")
                    await trio.to_thread.run_sync(broker.kill)
                    await trio.to_thread.run_sync(broker.start)
                    with trio.fail_after(30):
                        while ch2.statistics().reconnects == 0:
                            await trio.sleep(0.05)
            with pytest.raises(ConnectionLost):
                await lost
            info = await conn.queue_info("q")
            assert (info.messages_ready, info.messages_unacked) == (0, 0)

"""Single active consumer end to end: the channel protocol's ``consume_ok`` says who is
active and a standby is told when it takes over; the client exposes it as
``MessageStream.receiving`` / ``wait_receiving()``."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import client
from tests.support.broker import BrokerProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow


def test_consume_ok_says_who_is_active_and_the_standby_is_told_over_the_wire(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data") as broker:
        first, second = RawChannel(broker.port), RawChannel(broker.port)
        first.send({"op": "declare_queue", "queue": "q", "arguments": {"x-single-active-consumer": True}, "id": 1})
        first.send({"op": "consume", "queue": "q", "consumer_tag": "a", "id": 2})
        events = [first.next_event() for _ in range(2)]  # ok, consume_ok
        assert events[-1] == {"ev": "consume_ok", "id": 2, "consumer_tag": "a", "active": True}
        second.send({"op": "consume", "queue": "q", "consumer_tag": "b", "id": 3})
        assert second.next_event() == {"ev": "consume_ok", "id": 3, "consumer_tag": "b", "active": False}
        first.send({"op": "close"})
        assert second.next_event() == {"ev": "active", "consumer_tag": "b"}
        first.close()
        second.close()


async def test_the_client_standby_takes_over_with_the_unacked_messages(async_broker: BrokerProcess) -> None:
    broker = async_broker
    async with client.connect(broker.url) as conn:
        async with conn.channel() as setup:
            await setup.declare_queue("q", arguments={"x-single-active-consumer": True})
            for i in range(3):
                await setup.publish("", "q", f"m{i}")
        async with conn.channel() as active_ch, conn.channel() as standby_ch:
            async with active_ch.consume("q", prefetch=1) as active, standby_ch.consume("q") as standby:
                with trio.fail_after(10):
                    first = await active.receive()
                assert first.body == b"m0" and active.receiving
                with trio.fail_after(10):
                    while standby.receiving:  # its consume_ok said "standby"
                        await trio.sleep(0.01)
                await active_ch.aclose()  # m0 was never acked: it goes to the next consumer
                with trio.fail_after(10):
                    await standby.wait_receiving()
                    got = [await standby.receive() for _ in range(3)]
                assert [(m.body, m.redelivered) for m in got] == [
                    (b"m0", True), (b"m1", False), (b"m2", False)
                ]
                for m in got:
                    await m.ack()

"""Back-pressure: while the broker refuses publishes (its disk reserve is used up),
AMQP clients that asked for it get connection.blocked, then unblocked (RabbitMQ's
alarms)."""

from __future__ import annotations

import trio
from pamqp import commands

from tests.amqp.rawclient import open_amqp


async def test_blocked_and_unblocked_follow_the_publish_refusal(app) -> None:
    core = app.runtime.core
    async with open_amqp(app) as c:
        await c.open_channel(1)
        core.refuse_publishes("disk full: the space reserve is used up")
        with trio.fail_after(5):
            blocked = await c.expect(commands.Connection.Blocked, 0)
        assert "disk" in blocked.reason
        core.accept_publishes()
        with trio.fail_after(5):
            await c.expect(commands.Connection.Unblocked, 0)
        # and the connection goes on
        ok = await c.declare(1, "after")
        assert ok.queue == "after"


async def test_a_publish_during_the_refusal_is_blocked_at_once_and_nacked_if_persistent(app) -> None:
    core = app.runtime.core
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "dq", durable=True)
        await c.send(1, commands.Confirm.Select())
        await c.expect(commands.Confirm.SelectOk, 1)
        core.refuse_publishes("disk full")
        await c.publish(1, "", "dq", b"x", properties=commands.Basic.Properties(delivery_mode=2))
        seen = []
        with trio.fail_after(5):
            while len(seen) < 2:
                _ch, value = await c.recv()
                seen.append(type(value).__name__)
        assert set(seen) == {"Blocked", "Nack"}
        core.accept_publishes()


async def test_a_publisher_far_ahead_of_the_disk_is_blocked_until_its_confirms_catch_up(app) -> None:
    """Over UNCONFIRMED_MAX_BYTES of publishes waiting for the disk: connection.blocked
    (and the connection is not read); unblocked once the log reports them durable."""
    from broker.amqp.session import UNCONFIRMED_MAX_BYTES
    from tests.support.fakewal import FakeWAL

    wal = FakeWAL()
    app.runtime.wal = wal
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.send(1, commands.Queue.Declare(queue="slow-disk", durable=True))
        with trio.fail_after(5):
            while not wal.appends:
                await trio.sleep(0.01)
        app.runtime.log_reports.on_durable(wal.last_lsn)  # the declare's record
        await c.expect(commands.Queue.DeclareOk, 1)
        await c.send(1, commands.Confirm.Select())
        await c.expect(commands.Confirm.SelectOk, 1)
        body = b"x" * (1 << 20)
        for _ in range(UNCONFIRMED_MAX_BYTES // len(body) + 2):
            await c.publish(1, "", "slow-disk", body, properties=commands.Basic.Properties(delivery_mode=2))
        with trio.fail_after(5):
            blocked = await c.expect(commands.Connection.Blocked, 0)
        assert "unconfirmed" in blocked.reason
        app.runtime.log_reports.on_durable(wal.last_lsn)
        with trio.fail_after(5):
            while True:
                _ch, frame = await c.recv()
                if isinstance(frame, commands.Connection.Unblocked):
                    break


async def test_a_memory_alarm_blocks_publishers_and_their_publishes_wait(app) -> None:
    """The runtime's flow signal (a memory or disk alarm): connection.blocked at once,
    a publish waits (the connection is not read) and goes through when it clears."""
    from broker.runtime import ALARM_MEMORY

    flow = app.runtime.flow
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "waits")
        await c.send(1, commands.Confirm.Select())
        await c.expect(commands.Confirm.SelectOk, 1)
        flow.raise_alarm(ALARM_MEMORY, "memory above the high watermark")
        with trio.fail_after(5):
            blocked = await c.expect(commands.Connection.Blocked, 0)
        assert "memory" in blocked.reason
        await c.publish(1, "", "waits", b"patient")
        await c.send(1, commands.Queue.Declare(queue="waits", passive=True))
        with trio.move_on_after(0.3):
            await c.recv()
            raise AssertionError("nothing may be answered while the publish waits")
        assert app.runtime.core.views.queue_counter("messages_ready", "waits") == 0
        flow.clear_alarm(ALARM_MEMORY)
        seen = []
        with trio.fail_after(5):
            while len(seen) < 3:
                _ch, frame = await c.recv()
                seen.append(type(frame).__name__)
        assert seen[0] == "Unblocked" and set(seen[1:]) == {"Ack", "DeclareOk"}


async def test_a_publish_blocked_too_long_is_nacked(app) -> None:
    import dataclasses

    from broker.runtime import ALARM_MEMORY

    app.runtime.options = dataclasses.replace(app.runtime.options, blocked_publish_wait_s=0.2)
    flow = app.runtime.flow
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "refused")
        await c.send(1, commands.Confirm.Select())
        await c.expect(commands.Confirm.SelectOk, 1)
        flow.raise_alarm(ALARM_MEMORY, "memory above the high watermark")
        try:
            await c.publish(1, "", "refused", b"x")
            with trio.fail_after(5):
                while True:
                    _ch, frame = await c.recv()
                    if isinstance(frame, (commands.Basic.Ack, commands.Basic.Nack)):
                        break
            assert isinstance(frame, commands.Basic.Nack) and frame.delivery_tag == 1
        finally:
            flow.clear_alarm(ALARM_MEMORY)

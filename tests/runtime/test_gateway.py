"""The command gateway and the runtime's one book of pending confirms.

The gateway runs a core command, carries out its effects and, where asked, waits
until the records the command logged are durable; a batch defers the effects to its
flush. Durability is reported by hand through the log's callback
(``runtime.log_reports.on_durable``), with a fake log in place of the WAL.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from broker.core import (
    REST_CHANNEL,
    Confirm,
    Deliver,
    NotFound,
    Return,
    StoredMessage,
)
from broker.runtime import (
    BrokerRuntime,
    CommandGateway,
    PendingConfirms,
    PublishOutcome,
    PublishWaiter,
    RuntimeOptions,
)
from tests.support.fakewal import FakeWAL
from tests.support.sink import RecordingSink


def _runtime(*, wal: bool = False) -> tuple[BrokerRuntime, CommandGateway, FakeWAL | None]:
    runtime = BrokerRuntime(RuntimeOptions(data_dir=None))
    fake = FakeWAL() if wal else None
    if fake is not None:
        runtime.wal = fake  # type: ignore[assignment]  # (a stand-in for the LogPort)
    return runtime, CommandGateway(runtime), fake


def _consumer(gateway: CommandGateway, queue: str) -> tuple[int, Sink]:
    channel_id = gateway.open_channel()
    sink = RecordingSink()
    gateway.attach(channel_id, sink)
    gateway.run(lambda core: core.consume(channel_id, queue, consumer_tag="c"))
    return channel_id, sink


async def test_run_carries_out_the_commands_effects() -> None:
    runtime, gateway, _ = _runtime()
    gateway.run(lambda core: core.declare_queue("q", durable=False))
    _cid, sink = _consumer(gateway, "q")
    publisher = gateway.open_channel()
    gateway.run(lambda core: core.publish(publisher, "", "q", b"x", None))
    assert [type(e) for e in sink.effects] == [Deliver]


async def test_a_batch_carries_out_its_effects_at_its_flush() -> None:
    runtime, gateway, _ = _runtime()
    gateway.run(lambda core: core.declare_queue("q", durable=False))
    _cid, sink = _consumer(gateway, "q")
    publisher = gateway.open_channel()
    batch = gateway.batch()
    batch.run(lambda core: core.publish(publisher, "", "q", b"1", None))
    batch.run(lambda core: core.publish(publisher, "", "q", b"2", None))
    assert sink.effects == []
    batch.flush()
    assert [e.message.body for e in sink.effects if isinstance(e, Deliver)] == [b"1", b"2"]


async def test_run_durable_waits_until_the_records_the_command_logged_are_durable() -> None:
    runtime, gateway, wal = _runtime(wal=True)
    assert wal is not None
    done = trio.Event()

    async def declare() -> None:
        await gateway.run_durable(lambda core: core.declare_queue("q", durable=True))
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(declare)
        await trio.testing.wait_all_tasks_blocked()
        assert wal.last_lsn == 1 and not done.is_set()
        runtime.log_reports.on_durable(wal.last_lsn)
        with trio.fail_after(5):
            await done.wait()


@pytest.mark.parametrize(
    "declare",
    [
        lambda core: core.declare_queue("transient", durable=False),
        # durable but exclusive: never logged, so a channel and REST both answer at once
        lambda core: core.declare_queue("mine", durable=True, exclusive=True, channel_id=core.open_channel()),
        lambda core: core.declare_exchange("amq.direct", "direct"),  # exists: nothing to log
    ],
    ids=["transient", "exclusive", "existing"],
)
async def test_run_durable_answers_at_once_when_the_command_logged_nothing(declare: Any) -> None:
    runtime, gateway, wal = _runtime(wal=True)
    assert wal is not None
    gateway.run(lambda core: core.declare_queue("other", durable=True))  # pending, not ours
    assert wal.last_lsn == 1
    with trio.fail_after(1):
        await gateway.run_durable(declare)
    assert wal.last_lsn == 1 and runtime.core.durable_lsn == 0


async def test_a_rest_publish_is_answered_by_its_confirm() -> None:
    runtime, gateway, wal = _runtime(wal=True)
    assert wal is not None
    gateway.run(lambda core: core.declare_queue("q", durable=True))
    runtime.log_reports.on_durable(wal.last_lsn)
    outcomes: list[PublishOutcome] = []

    async def publish() -> None:
        outcomes.append(await gateway.publish_and_confirm("", "q", b"x", None))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish)
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == []  # its record waits for the disk
        runtime.log_reports.on_durable(wal.last_lsn)
    assert outcomes == [PublishOutcome(True, None, 1, False)]
    assert outcomes[0].refusal() is None


async def test_a_rest_publish_to_a_missing_exchange_is_its_not_found_error() -> None:
    _runtime_, gateway, _ = _runtime()
    outcome = await gateway.publish_and_confirm("ghost", "k", b"x", None)
    assert not outcome.ack
    error = outcome.refusal()
    assert isinstance(error, NotFound) and error.message == "no exchange 'ghost'"


async def test_a_channel_publish_charges_its_channel_until_confirmed() -> None:
    runtime, gateway, wal = _runtime(wal=True)
    assert wal is not None
    gateway.run(lambda core: core.declare_queue("q", durable=True))
    runtime.log_reports.on_durable(wal.last_lsn)
    channel_id = gateway.open_channel()
    sink = RecordingSink()
    gateway.attach(channel_id, sink)
    for body in (b"a", b"bb"):
        gateway.publish(channel_id, "", "q", body, None, charge=100 + len(body))
    gateway.flush()
    assert runtime.confirms.unconfirmed_bytes(channel_id) == 203
    runtime.log_reports.on_durable(wal.last_lsn)
    assert runtime.confirms.unconfirmed_bytes(channel_id) == 0
    assert [(e.delivery_tag, e.multiple) for e in sink.effects if isinstance(e, Confirm)] == [(2, True)]


def test_the_book_settles_every_tag_up_to_a_confirm_and_wakes_rest_waiters() -> None:
    book = PendingConfirms()
    waiter = PublishWaiter()
    book.track(REST_CHANNEL, 1, 0)
    book.track(REST_CHANNEL, 2, 0, waiter)
    book.track(REST_CHANNEL, 3, 0, PublishWaiter())
    book.track(5, 1, 10)
    book.returned(Return(REST_CHANNEL, 2, 312, "NO_ROUTE", StoredMessage(1, "", "q", b"x", None)))
    book.confirmed(Confirm(REST_CHANNEL, 2, True, True, None))
    assert waiter.event.is_set() and waiter.ack and waiter.returned
    assert book.unconfirmed_bytes(5) == 10  # another channel's publish is untouched
    book.confirmed(Confirm(5, 1, False, False, "queue 'q' is full"))
    assert book.unconfirmed_bytes(5) == 0
    book.forget(REST_CHANNEL)
    book.confirmed(Confirm(REST_CHANNEL, 3, False, True, None))  # nobody left: no harm

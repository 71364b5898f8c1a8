"""The runtime carrying out the core's effects, through its public methods only.

An in-memory ``BrokerRuntime`` (no data directory), with the tests' stand-in log
(``tests/support/fakewal.py``, durability released by the test) where durability
matters, and recording sinks in place of the API layer's channels. Time is trio's
virtual clock (``autojump_clock``) wherever a timer is involved. The checkpoint on
close needs a real data directory: those tests use one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from broker.core import REST_CHANNEL, Confirm, Deliver, Effect, Return, Unavailable
from broker.runtime import BrokerRuntime, RuntimeOptions
from broker.runtime.gateway import CommandGateway, PublishOutcome
from broker.storage import WALClosed
from tests.support.fakewal import FakeWAL, attach_fake_wal

PERSISTENT = {"delivery_mode": 2}


def virtual_wall_clock() -> float:
    """The epoch clock (delays, TTLs) following trio's clock, so ``autojump_clock``
    moves both."""
    return 1_700_000_000.0 + trio.current_time()


class RecordingSink:
    """A channel's sink (``ChannelSink`` and ``Flushable``) that keeps what it got."""

    def __init__(self, runtime: BrokerRuntime | None = None, channel_id: int = 0) -> None:
        self.effects: list[Effect] = []
        self.closing_reasons: list[str] = []
        self.shut_down = False
        self.flushes = 0
        #: with a runtime: ending the channel when told the broker is closing (a client
        #: that closes its channel in answer to ``closing``)
        self._runtime = runtime
        self._channel_id = channel_id

    def push(self, effect: Effect) -> None:
        self.effects.append(effect)

    def closing(self, reason: str) -> None:
        self.closing_reasons.append(reason)
        if self._runtime is not None:
            self._runtime.remove_sink(self._channel_id)

    def shutdown(self) -> None:
        self.shut_down = True

    def flush_nowait(self) -> bool:
        self.flushes += 1
        return False

    def of(self, kind: type[Effect]) -> list[Any]:
        return [e for e in self.effects if isinstance(e, kind)]


@pytest.fixture
async def runtime() -> Any:
    """A ready in-memory runtime, serving (timers run) until the test ends."""
    rt = BrokerRuntime(RuntimeOptions(), wall_clock=virtual_wall_clock)
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.serve)
        await rt.ready_event.wait()
        yield rt
        nursery.cancel_scope.cancel()


def open_channel(runtime: BrokerRuntime) -> tuple[int, RecordingSink]:
    channel_id = runtime.core.open_channel()
    sink = RecordingSink()
    runtime.add_sink(channel_id, sink)
    return channel_id, sink


# -- the pump: channel events ---------------------------------------------------------------


async def test_the_pump_carries_deliveries_to_the_sink_of_their_channel(runtime: BrokerRuntime) -> None:
    core = runtime.core
    core.declare_queue("q", durable=False)
    consumer, consumer_sink = open_channel(runtime)
    publisher, publisher_sink = open_channel(runtime)
    core.consume(consumer, "q", consumer_tag="c")
    core.publish(publisher, "", "q", b"hello", {"delivery_mode": 1})
    assert consumer_sink.of(Deliver) == []  # nothing happens until the pump
    runtime.pump()
    [deliver] = consumer_sink.of(Deliver)
    assert (deliver.channel_id, deliver.consumer_tag, deliver.redelivered) == (consumer, "c", False)
    assert publisher_sink.of(Deliver) == []
    [confirm] = publisher_sink.of(Confirm)
    assert confirm.ack and confirm.delivery_tag == 1


async def test_an_unroutable_mandatory_publish_is_returned_before_its_confirm(runtime: BrokerRuntime) -> None:
    channel_id, sink = open_channel(runtime)
    runtime.core.publish(channel_id, "", "nowhere", b"x", None, mandatory=True)
    runtime.pump()
    assert [type(e) for e in sink.effects] == [Return, Confirm]
    assert sink.effects[0].delivery_tag == sink.effects[1].delivery_tag == 1


async def test_events_of_a_channel_without_a_sink_are_dropped(runtime: BrokerRuntime) -> None:
    core = runtime.core
    core.declare_queue("q", durable=False)
    gone = core.open_channel()  # a channel whose sink already went
    core.consume(gone, "q", consumer_tag="c")
    core.publish(gone, "", "q", b"x", None)
    runtime.pump()  # no error: nobody to tell
    assert core.queues["q"].ready_count() == 0  # delivered (to nobody listening)


async def test_sinks_that_asked_are_flushed_once_per_pump(runtime: BrokerRuntime) -> None:
    _channel_id, sink = open_channel(runtime)
    runtime.want_flush(sink)
    runtime.pump()
    runtime.pump()
    assert sink.flushes == 1


async def test_a_removed_sink_gets_nothing_more(runtime: BrokerRuntime) -> None:
    core = runtime.core
    core.declare_queue("q", durable=False)
    channel_id, sink = open_channel(runtime)
    core.consume(channel_id, "q", consumer_tag="c")
    runtime.remove_sink(channel_id)
    core.publish(REST_CHANNEL, "", "q", b"x", None)
    runtime.pump()
    assert sink.effects == []


# -- the log: appends, durable confirms, waiters ---------------------------------------------


async def test_records_go_to_the_log_and_confirms_wait_for_their_durability(runtime: BrokerRuntime) -> None:
    core = runtime.core
    core.declare_queue("d", durable=True)
    runtime.pump()
    wal = attach_fake_wal(runtime)
    channel_id, sink = open_channel(runtime)
    core.publish(channel_id, "", "d", b"1", PERSISTENT)
    core.publish(channel_id, "", "d", b"2", PERSISTENT)
    runtime.pump()
    assert [(last - first + 1, lazy) for first, last, lazy in wal.appends] in ([(1, False), (1, False)], [(2, False)])
    assert sink.of(Confirm) == []  # not durable yet
    wal.make_durable(wal.last_lsn - 1)
    assert [(c.delivery_tag, c.ack) for c in sink.of(Confirm)] == [(1, True)]
    wal.make_durable()
    assert [(c.delivery_tag, c.ack) for c in sink.of(Confirm)] == [(1, True), (2, True)]


async def test_an_ack_is_appended_lazily(runtime: BrokerRuntime) -> None:
    core = runtime.core
    core.declare_queue("d", durable=True)
    core.publish(REST_CHANNEL, "", "d", b"m", PERSISTENT)
    runtime.pump()
    wal = attach_fake_wal(runtime)
    channel_id, sink = open_channel(runtime)
    core.consume(channel_id, "d", consumer_tag="c")
    runtime.pump()
    [deliver] = sink.of(Deliver)
    before = len(wal.appends)
    core.ack(channel_id, deliver.delivery_tag)
    runtime.pump()
    assert [lazy for _first, _last, lazy in wal.appends[before:]] == [True]


async def test_a_failed_write_nacks_the_publishes_that_waited_on_it(runtime: BrokerRuntime) -> None:
    core = runtime.core
    core.declare_queue("d", durable=True)
    runtime.pump()
    wal = attach_fake_wal(runtime)
    channel_id, sink = open_channel(runtime)
    core.publish(channel_id, "", "d", b"lost", PERSISTENT)
    runtime.pump()
    wal.fail(OSError(5, "Input/output error"))
    [confirm] = sink.of(Confirm)
    assert not confirm.ack and "storage" in (confirm.reason or "")
    assert core.queues["d"].ready_count() == 0
    assert runtime.overview()["storage"]["ok"] is False
    wal.recover()
    assert runtime.overview()["storage"]["ok"] is True


async def test_wait_durable_returns_once_the_log_is_durable_through_what_came_before(
    runtime: BrokerRuntime,
) -> None:
    wal = attach_fake_wal(runtime)
    runtime.core.declare_queue("d", durable=True)
    done = trio.Event()

    async def declare_and_wait() -> None:
        await runtime.wait_durable()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(declare_and_wait)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set() and wal.last_lsn > wal.durable_lsn
        wal.make_durable()
        await done.wait()


async def test_wait_durable_raises_when_the_records_could_not_be_written(runtime: BrokerRuntime) -> None:
    wal = attach_fake_wal(runtime)
    runtime.core.declare_queue("d", durable=True)
    async with trio.open_nursery() as nursery:

        async def fail_soon() -> None:
            await trio.testing.wait_all_tasks_blocked()
            wal.fail()

        nursery.start_soon(fail_soon)
        with pytest.raises(Unavailable) as info:
            await runtime.wait_durable()
    assert info.value.code == "storage_failed"


async def test_wait_durable_without_a_log_returns_at_once(runtime: BrokerRuntime) -> None:
    runtime.core.declare_queue("d", durable=True)
    with trio.fail_after(1):
        await runtime.wait_durable()


async def test_a_rest_publish_is_answered_once_durable(runtime: BrokerRuntime) -> None:
    core = runtime.core
    core.declare_queue("d", durable=True)
    runtime.pump()
    wal = attach_fake_wal(runtime)
    answers: list[PublishOutcome] = []

    async def publish() -> None:
        answers.append(await CommandGateway(runtime).publish_and_confirm("", "d", b"b", PERSISTENT))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == []
        wal.make_durable()
    assert answers == [PublishOutcome(True, None, 1, False)]


async def test_a_rest_publish_returned_and_one_nacked(runtime: BrokerRuntime) -> None:
    gateway = CommandGateway(runtime)
    returned = await gateway.publish_and_confirm("", "nowhere", b"x", None, mandatory=True)
    assert returned == PublishOutcome(True, None, 0, True)
    nacked = await gateway.publish_and_confirm("no-such-exchange", "k", b"x", None)
    assert (nacked.ack, nacked.routed, nacked.returned) == (False, 0, False)
    assert "no-such-exchange" in (nacked.reason or "")


# -- long-polls and timers (virtual time) -----------------------------------------------------


async def test_a_queue_event_fires_when_the_queue_gets_ready_messages(runtime: BrokerRuntime) -> None:
    runtime.core.declare_queue("q", durable=False)
    runtime.core.park_getter("q")  # a long-poll waits on the queue
    event = runtime.queue_event("q")
    assert runtime.queue_event("q") is event  # one event per queue until it fires
    runtime.pump()
    assert not event.is_set()
    runtime.core.publish(REST_CHANNEL, "", "q", b"x", None)
    runtime.pump()
    assert event.is_set()
    assert runtime.queue_event("q") is not event  # a fresh one for the next wait


async def test_wake_getters_wakes_every_parked_long_poll(runtime: BrokerRuntime) -> None:
    events = [runtime.queue_event(name) for name in ("a", "b")]
    runtime.wake_getters()
    assert all(event.is_set() for event in events)


async def test_a_delayed_message_is_delivered_by_the_timer_when_due(
    runtime: BrokerRuntime, autojump_clock: trio.testing.MockClock
) -> None:
    core = runtime.core
    core.declare_queue("q", durable=False)
    channel_id, sink = open_channel(runtime)
    core.consume(channel_id, "q", consumer_tag="c")
    start = trio.current_time()
    core.publish(REST_CHANNEL, "", "q", b"later", None, delay_s=30)
    runtime.pump()
    await trio.sleep(29)  # virtual time: not due yet
    assert sink.of(Deliver) == []
    with trio.fail_after(5):
        while not sink.of(Deliver):
            await trio.sleep(0.1)
    assert 30 <= trio.current_time() - start < 31


async def test_an_expired_lease_returns_its_message_and_wakes_the_long_poll(
    runtime: BrokerRuntime, autojump_clock: trio.testing.MockClock
) -> None:
    core = runtime.core
    core.declare_queue("q", durable=False)
    core.publish(REST_CHANNEL, "", "q", b"x", None)
    runtime.pump()
    [(_lease, _delivery, redelivered)] = core.get("q", 1, lease_s=5)
    assert not redelivered
    runtime.pump()
    start = trio.current_time()
    runtime.core.park_getter("q")
    event = runtime.queue_event("q")
    with trio.fail_after(60):
        await event.wait()
    runtime.core.unpark_getter("q")
    assert trio.current_time() - start >= 5 - 1e-6
    [(_lease, _delivery, redelivered)] = core.get("q", 1)
    assert redelivered


# -- admission, shutdown ------------------------------------------------------------------------


async def test_check_ready_and_channel_room() -> None:
    rt = BrokerRuntime(RuntimeOptions(max_channels=1))
    with pytest.raises(Unavailable) as info:
        rt.check_ready()
    assert info.value.code == "not_ready"
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.serve)
        await rt.ready_event.wait()
        rt.check_ready()
        rt.check_channel_room()
        rt.add_sink(rt.core.open_channel(), RecordingSink())
        with pytest.raises(Unavailable) as info:
            rt.check_channel_room()
        assert info.value.code == "limit_reached"
        nursery.cancel_scope.cancel()


async def test_drain_tells_channels_and_returns_once_they_end_and_the_log_is_durable(
    runtime: BrokerRuntime,
) -> None:
    core = runtime.core
    core.declare_queue("d", durable=True)
    runtime.pump()
    wal = attach_fake_wal(runtime)
    channel_id = core.open_channel()
    sink = RecordingSink(runtime, channel_id)  # ends its channel when told
    runtime.add_sink(channel_id, sink)
    core.publish(channel_id, "", "d", b"m", PERSISTENT)
    runtime.pump()
    result: list[bool] = []

    async def drain() -> None:
        result.append(await runtime.drain(timeout_s=30))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await trio.testing.wait_all_tasks_blocked()
        assert sink.closing_reasons and result == []  # waiting for the disk
        with pytest.raises(Unavailable) as info:
            runtime.check_ready()
        assert info.value.code == "shutting_down"
        wal.make_durable()
    assert result == [True]
    assert core.delivering is False
    assert not sink.shut_down  # it ended on its own


async def test_drain_gives_up_after_its_timeout_and_shuts_the_channels_still_open(
    runtime: BrokerRuntime, autojump_clock: trio.testing.MockClock
) -> None:
    core = runtime.core
    core.declare_queue("d", durable=True)
    runtime.pump()
    attach_fake_wal(runtime)  # never made durable
    channel_id, sink = open_channel(runtime)  # never ends on its own
    core.publish(channel_id, "", "d", b"m", PERSISTENT)
    runtime.pump()
    start = trio.current_time()
    assert await runtime.drain(timeout_s=10) is False
    assert trio.current_time() - start == pytest.approx(10)
    assert sink.closing_reasons and sink.shut_down


async def test_aclose_ends_the_channels_and_closes_the_log(runtime: BrokerRuntime) -> None:
    core = runtime.core
    core.declare_queue("q", durable=False)
    wal = attach_fake_wal(runtime)
    channel_id, _sink = open_channel(runtime)
    core.consume(channel_id, "q", consumer_tag="c")
    await runtime.aclose(checkpoint=False)
    assert channel_id not in core.channels
    assert isinstance(runtime.wal, FakeWAL)
    with pytest.raises(WALClosed):
        wal.append_nowait([(1, b"x")])


@pytest.mark.parametrize("checkpoint", [True, False], ids=["with-checkpoint", "without"])
async def test_aclose_with_a_checkpoint_makes_the_next_start_replay_no_log(
    tmp_path: Path, checkpoint: bool
) -> None:
    """A clean close ends with a checkpoint covering everything, so the next start has
    no log records to replay (and does not take the stop for a crash); without it,
    the records are replayed."""
    options = RuntimeOptions(data_dir=tmp_path, checkpoint_interval_s=3600, checkpoint_wal_bytes=1 << 40)
    first = BrokerRuntime(options)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.serve)
        await first.ready_event.wait()
        first.core.declare_queue("d", durable=True)
        await first.wait_durable()
        outcome = await CommandGateway(first).publish_and_confirm("", "d", b"kept", PERSISTENT)
        assert outcome == PublishOutcome(True, None, 1, False)
        await first.aclose(checkpoint=checkpoint)
        assert first.checkpoints == (1 if checkpoint else 0)
        nursery.cancel_scope.cancel()
    second = BrokerRuntime(options)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.serve)
        await second.ready_event.wait()
        assert second.core.queues["d"].ready_count() == 1
        replayed = second.recovery_info["wal_records"]
        assert (replayed == 0) if checkpoint else (replayed > 0)
        await second.aclose(checkpoint=False)
        nursery.cancel_scope.cancel()


async def test_overview_reports_the_logs_statistics(runtime: BrokerRuntime) -> None:
    assert runtime.overview()["storage"]["enabled"] is False
    runtime.core.declare_queue("d", durable=True)
    runtime.pump()
    wal = attach_fake_wal(runtime)
    runtime.core.publish(REST_CHANNEL, "", "d", b"12345", PERSISTENT)
    runtime.pump()
    wal.make_durable()
    storage = runtime.overview()["storage"]
    assert storage["enabled"] is True
    assert storage["durable_lsn"] == storage["last_lsn"] == wal.last_lsn
    assert storage["wal_bytes_written"] == wal.statistics().bytes_written > 0

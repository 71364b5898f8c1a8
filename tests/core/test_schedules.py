"""Schedules in the sans-IO core: tick computation (cron across daylight-saving
changes, intervals, one time), firing exactly once per tick, the missed-tick policies
at a restart, a crash before a tick's record was written, pause and resume, and bad
definitions."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from broker.core import InvalidArgument, NotFound
from broker.core.records import RecordType
from broker.core.timing import Timing, parse_timing

from .coord_helpers import restart, take_snapshot
from .helpers import Harness


def paris(*args: int) -> float:
    return datetime(*args, tzinfo=ZoneInfo("Europe/Paris")).timestamp()


def test_cron_in_a_time_zone_across_the_spring_forward_gap() -> None:
    t = parse_timing({"cron": "30 2 * * *", "timezone": "Europe/Paris"}, 0)
    first = t.next_after(paris(2026, 3, 28, 12, 0))
    assert first == paris(2026, 3, 29, 3, 0)  # 02:30 does not exist that day: once, at 03:00
    assert t.next_after(first) == paris(2026, 3, 30, 2, 30)


def test_cron_in_a_time_zone_across_the_fall_back_overlap_fires_once() -> None:
    t = parse_timing({"cron": "30 2 * * *", "timezone": "Europe/Paris"}, 0)
    start = paris(2026, 10, 24, 12, 0)
    ticks, total = t.due(start, start + 3 * 86400, 10)
    assert total == 3  # 02:30 happens twice on the 25th: it fires once
    assert [datetime.fromtimestamp(x, ZoneInfo("Europe/Paris")).strftime("%d %H:%M") for x in ticks] == [
        "25 02:30", "26 02:30", "27 02:30"
    ]
    assert ticks[1] - ticks[0] == 25 * 3600


def test_due_keeps_the_newest_ticks_and_counts_them_all() -> None:
    t = Timing("interval", interval_s=10.0, start=100.0)
    assert t.due(100.0, 155.0, 2) == ([140.0, 150.0], 5)
    assert t.due(0.0, 100.0, 5) == ([100.0], 1)
    assert t.next_after(150.0) == 160.0 and t.next_after(0.0) == 100.0
    cron = parse_timing({"cron": "*/15 * * * *"}, 0)
    ticks, total = cron.due(0.0, 3600.0, 2)
    assert ticks == [2700.0, 3600.0] and total == 3  # (counted up to limit + 1)
    assert Timing("at", start=50.0).due(0.0, 60.0, 5) == ([50.0], 1)
    assert Timing("at", start=50.0).next_after(50.0) is None


@pytest.mark.parametrize(
    "timing",
    [
        {},
        {"cron": "* * * *"},
        {"cron": "61 * * * *"},
        {"cron": "0 0 30 2 *"},
        {"cron": "*/5 * * * * *"},
        {"cron": "@daily"},
        {"cron": 5},
        {"cron": "* * * * *", "timezone": "Mars/Olympus"},
        {"cron": "* * * * *", "timezone": "../../etc/passwd"},
        {"cron": "* * * * *", "interval_s": 5},
        {"interval_s": 0},
        {"interval_s": True},
        {"interval_s": 5, "timezone": "UTC"},
        {"at": "tomorrow"},
        {"at": "2026-11-25T10:00:00"},  # no offset
        {"at": 1e20},
    ],
)
def test_bad_timings_are_refused(timing) -> None:
    with pytest.raises(InvalidArgument):
        parse_timing(timing, 1_700_000_000.0)


def setup(h: Harness, **kw):
    h.queue("ticks")
    args = dict(exchange="", routing_key="ticks", body=b"run", properties=None, timing={"interval_s": 10})
    args.update(kw)
    info, changed = h.b.put_schedule("every10", **args)
    h.sync()
    return info


def tick_headers(h: Harness, queue: str = "ticks") -> list[str]:
    from .helpers import ready_entries

    return [e.message.properties["headers"]["x-schedule-tick"] for e in ready_entries(h.b, queue)]


def test_each_tick_publishes_once_with_the_schedule_name_time_and_id() -> None:
    h = Harness()
    info = setup(h)
    assert info["next_tick_s"] == h.wall.now + 10
    h.sleep(9.9)
    assert h.ready_bodies("ticks") == []
    h.sleep(0.1)
    h.sleep(10)
    h.sync()
    (e1, e2) = [e for e in __import__("tests.core.helpers", fromlist=["x"]).ready_entries(h.b, "ticks")]
    p = e1.message.properties
    assert p["headers"]["x-schedule"] == "every10" and e1.message.body == b"run"
    assert p["message_id"] == "every10@" + p["headers"]["x-schedule-tick"]
    assert p["timestamp"] == int(h.wall.now - 10)
    assert e2.message.properties["message_id"] != p["message_id"]
    ticks = [r for r in h.records if r[1] == RecordType.SCHEDULE_TICK]
    assert len(ticks) == 2
    info = h.b.schedule_info("every10")
    assert info["ticks_fired"] == 2 and info["last_lateness_s"] == 0


def run_for(h: Harness, seconds: int) -> None:
    for _ in range(seconds):
        h.sleep(1)
    h.sync()


@pytest.mark.parametrize("policy, expect_missed", [("latest", 1), ("skip", 0), ("all", 5)])
def test_ticks_missed_while_down_follow_the_policy(policy, expect_missed) -> None:
    h = Harness()
    setup(h, missed=policy, max_missed=5)
    run_for(h, 30)
    before = tick_headers(h)
    assert len(before) == 3
    h.wall.now += 95  # down for 95 s: 9 ticks come due
    h.mono.now += 95
    restart(h)
    h.sync()
    after = tick_headers(h)
    assert after[:3] == before  # nothing fired before is fired again
    assert len(after) - 3 == expect_missed
    assert len(set(after)) == len(after)
    run_for(h, 10)
    assert len(tick_headers(h)) == 3 + expect_missed + 1  # then on time again
    assert h.b.schedule_info("every10")["ticks_skipped"] == 9 - expect_missed


def test_a_tick_whose_record_was_lost_in_a_crash_fires_after_the_restart() -> None:
    h = Harness()
    setup(h)
    run_for(h, 20)
    h.sleep(10)  # the third tick: published, its record not yet durable
    tick_lsn = [r[0] for r in h.records if r[1] == RecordType.SCHEDULE_TICK][-1]
    restart(h, keep=tick_lsn - 1)
    h.sync()
    headers = tick_headers(h)
    assert len(headers) == 3 and len(set(headers)) == 3


def test_a_tick_whose_record_was_written_is_not_repeated_by_a_restart() -> None:
    h = Harness()
    setup(h)
    run_for(h, 30)
    restart(h)
    h.sync()
    assert len(tick_headers(h)) == 3
    run_for(h, 10)
    assert len(set(tick_headers(h))) == 4


def test_schedules_and_their_progress_survive_a_checkpoint() -> None:
    h = Harness()
    setup(h)
    h.b.put_schedule("nightly", exchange="", routing_key="ticks", body=b"n", properties=None,
                     timing={"cron": "0 3 * * *", "timezone": "Europe/Paris"})
    run_for(h, 20)
    lsn, snap = take_snapshot(h)
    run_for(h, 10)
    restart(h, snapshot=snap, snapshot_lsn=lsn)
    h.sync()
    assert sorted(s["name"] for s in h.b.schedule_list()) == ["every10", "nightly"]
    assert len(set(tick_headers(h))) == 3
    assert h.b.schedule_info("nightly")["timezone"] == "Europe/Paris"


def test_pause_fires_nothing_and_resume_skips_what_was_missed() -> None:
    h = Harness()
    setup(h)
    h.b.pause_schedule("every10", True)
    run_for(h, 35)
    assert tick_headers(h) == [] and h.b.schedule_info("every10")["next_tick"] is None
    h.b.pause_schedule("every10", False)
    run_for(h, 10)
    assert len(tick_headers(h)) == 1


def test_an_equal_put_changes_nothing_and_another_replaces() -> None:
    h = Harness()
    setup(h)
    run_for(h, 5)
    n = len(h.records)
    _info, changed = h.b.put_schedule("every10", exchange="", routing_key="ticks", body=b"run",
                                      properties=None, timing={"interval_s": 10})
    h.sync()
    assert not changed and len(h.records) == n
    _info, changed = h.b.put_schedule("every10", exchange="", routing_key="ticks", body=b"other",
                                      properties=None, timing={"interval_s": 10})
    assert changed
    run_for(h, 9)
    assert tick_headers(h) == []  # counts from the replacement
    run_for(h, 1)
    assert h.ready_bodies("ticks") == [b"other"]


def test_an_at_schedule_fires_once() -> None:
    h = Harness()
    setup(h, timing={"at": h.wall.now + 3})
    run_for(h, 10)
    assert len(tick_headers(h)) == 1
    assert h.b.schedule_info("every10")["next_tick"] is None
    restart(h)
    run_for(h, 5)
    assert len(tick_headers(h)) == 1


def test_bad_definitions_are_refused_and_change_nothing() -> None:
    h = Harness()
    h.queue("ticks")
    base = dict(exchange="", routing_key="ticks", body=b"x", properties=None, timing={"interval_s": 10})
    for bad in (
        dict(exchange="nope"),
        dict(missed="sometimes"),
        dict(max_missed=0),
        dict(timing={"cron": "0 0 * *"}),
        dict(timing={"at": h.wall.now - 3600}),
        dict(timing={"interval_s": 10, "every": 3}),
    ):
        with pytest.raises((InvalidArgument, NotFound)):
            h.b.put_schedule("s", **{**base, **bad})
    with pytest.raises(InvalidArgument):
        h.b.put_schedule("", **base)
    with pytest.raises(NotFound):
        h.b.delete_schedule("s")
    h.step()
    assert h.b.schedule_list() == [] and not [r for r in h.records if r[1] >= RecordType.LOCK_HELD]


def test_a_tick_that_reaches_no_queue_is_still_logged_once() -> None:
    h = Harness()
    h.b.put_schedule("s", exchange="amq.topic", routing_key="nowhere", body=b"x", properties=None,
                     timing={"interval_s": 1})
    run_for(h, 3)
    info = h.b.schedule_info("s")
    assert info["ticks_fired"] == 3 and "no queue" in info["last_error"]
    restart(h)
    h.sync()
    assert h.b.schedule_info("s")["ticks_fired"] == 0  # (counters are since the start)
    run_for(h, 1)
    assert h.b.schedule_info("s")["ticks_fired"] == 1

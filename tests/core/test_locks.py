"""Named locks in the sans-IO core: grants, FIFO waiters, expiry, refresh and release,
fencing tokens that only grow, and what a restart keeps (fake clocks throughout)."""

from __future__ import annotations

import pytest

from broker.core import (
    REST_CHANNEL,
    InvalidArgument,
    LockBusy,
    LockGranted,
    LockWaitEnded,
    NotLockHolder,
)
from broker.core.records import RecordType

from .coord_helpers import restart, take_snapshot
from .helpers import Harness


def acquire(h: Harness, name: str, owner: str, ttl_s: float = 30, wait_s: float = 0, ch: int = REST_CHANNEL):
    info, waiter = h.b.lock_acquire(ch, name, owner, ttl_s, wait_s, ref=owner)
    h.sync()
    return info, waiter


def granted(h: Harness) -> list[LockGranted]:
    return h.of_type(LockGranted)


def test_a_free_lock_is_granted_with_a_token_and_logged() -> None:
    h = Harness()
    info, waiter = acquire(h, "nightly", "host-7/pid-311", ttl_s=30)
    assert waiter == 0 and info is not None
    assert info["owner"] == "host-7/pid-311" and info["token"] == 1 and info["held"]
    assert info["expires_in_s"] == 30
    assert [r[1] for r in h.records] == [RecordType.LOCK_HELD]


def test_held_by_another_without_wait_is_refused_with_the_holder() -> None:
    h = Harness()
    acquire(h, "nightly", "a", ttl_s=30)
    h.sleep(5)
    with pytest.raises(LockBusy) as exc:
        h.b.lock_acquire(REST_CHANNEL, "nightly", "b", 30, 0)
    assert exc.value.status == 409 and exc.value.code == "lock_held"
    assert exc.value.info["owner"] == "a" and exc.value.info["expires_in_s"] == 25


def test_waiters_are_served_in_arrival_order_each_with_a_larger_token() -> None:
    h = Harness()
    a, _ = acquire(h, "l", "a")
    _, wb = acquire(h, "l", "b", wait_s=60)
    _, wc = acquire(h, "l", "c", wait_s=60)
    assert wb and wc and granted(h) == []
    assert [w["owner"] for w in h.b.lock_info("l")["waiters"]] == ["b", "c"]
    h.b.lock_release("l", "a", a["token"])
    h.sync()
    (g,) = granted(h)
    assert (g.waiter_id, g.ref, g.info["owner"]) == (wb, "b", "b")
    assert g.info["token"] > a["token"]
    h.b.lock_release("l", "b", g.info["token"])
    h.sync()
    g2 = granted(h)[-1]
    assert g2.info["owner"] == "c" and g2.info["token"] > g.info["token"]


def test_a_grant_to_a_waiter_leaves_only_once_its_record_is_durable() -> None:
    h = Harness()
    a, _ = acquire(h, "l", "a")
    acquire(h, "l", "b", wait_s=60)
    h.b.lock_release("l", "a", a["token"])
    h.step()
    assert granted(h) == []
    h.b.durable(h.b.last_lsn)
    h.step()
    assert len(granted(h)) == 1


def test_expiry_frees_the_lock_on_time_and_hands_it_to_the_first_waiter() -> None:
    h = Harness()
    acquire(h, "l", "a", ttl_s=10)
    acquire(h, "l", "b", ttl_s=10, wait_s=60)
    h.sleep(9.9)
    assert h.b.lock_info("l")["owner"] == "a"
    h.sleep(0.1)
    h.sync()
    assert h.b.lock_info("l")["owner"] == "b"
    assert granted(h)[0].info["owner"] == "b"
    h.sleep(10)
    assert h.b.lock_info("l")["held"] is False and h.b.lock_list() == []


def test_a_wait_that_runs_out_ends_with_the_lock_as_it_is() -> None:
    h = Harness()
    acquire(h, "l", "a", ttl_s=100)
    _, w = acquire(h, "l", "b", wait_s=5)
    h.sleep(4.9)
    assert h.of_type(LockWaitEnded) == []
    h.sleep(0.1)
    (ended,) = h.of_type(LockWaitEnded)
    assert ended.waiter_id == w and ended.info["owner"] == "a" and ended.info["waiters"] == []


def test_a_cancelled_wait_is_skipped() -> None:
    h = Harness()
    a, _ = acquire(h, "l", "a")
    _, wb = acquire(h, "l", "b", wait_s=60)
    acquire(h, "l", "c", wait_s=60)
    h.b.lock_cancel_wait(wb)
    h.b.lock_release("l", "a", a["token"])
    h.sync()
    assert [g.info["owner"] for g in granted(h)] == ["c"]


def test_a_waiter_whose_channel_closed_is_skipped() -> None:
    h = Harness()
    ch = h.channel()
    a, _ = acquire(h, "l", "a")
    acquire(h, "l", "b", wait_s=60, ch=ch)
    h.b.close_channel(ch)
    h.b.lock_release("l", "a", a["token"])
    h.sync()
    assert granted(h) == [] and h.b.lock_info("l")["held"] is False


def test_refresh_extends_and_needs_the_right_owner_and_token() -> None:
    h = Harness()
    a, _ = acquire(h, "l", "a", ttl_s=10)
    h.sleep(8)
    with pytest.raises(NotLockHolder):
        h.b.lock_refresh("l", "a", a["token"] + 1)
    with pytest.raises(NotLockHolder):
        h.b.lock_refresh("l", "b", a["token"])
    info = h.b.lock_refresh("l", "a", a["token"], 10)
    assert info["token"] == a["token"] and info["expires_in_s"] == 10
    h.sleep(8)
    assert h.b.lock_info("l")["owner"] == "a"
    h.sleep(2)
    with pytest.raises(NotLockHolder) as exc:
        h.b.lock_refresh("l", "a", a["token"])
    assert exc.value.status == 409 and exc.value.info["held"] is False


def test_release_needs_the_holder_and_reacquire_by_the_holder_keeps_the_token() -> None:
    h = Harness()
    a, _ = acquire(h, "l", "a", ttl_s=10)
    again, _ = acquire(h, "l", "a", ttl_s=20)
    assert again["token"] == a["token"] and again["ttl_s"] == 20
    with pytest.raises(NotLockHolder):
        h.b.lock_release("l", "b", a["token"])
    h.b.lock_release("l", "a", a["token"])
    with pytest.raises(NotLockHolder):
        h.b.lock_release("l", "a", a["token"])
    b, _ = acquire(h, "l", "b")
    assert b["token"] > a["token"]


@pytest.mark.parametrize(
    "name, owner, ttl_s, wait_s",
    [
        ("", "a", 30, 0),
        ("l", "", 30, 0),
        ("l", "a\x00", 30, 0),
        ("l", "a", 0, 0),
        ("l", "a", -1, 0),
        ("l", "a", 10**9, 0),
        ("l", "a", True, 0),
        ("l", "a", 30, -1),
        ("l", "a", 30, 10**6),
        ("l", "a", 30, "5"),
        ("x" * 256, "a", 30, 0),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(name, owner, ttl_s, wait_s) -> None:
    h = Harness()
    with pytest.raises(InvalidArgument):
        h.b.lock_acquire(REST_CHANNEL, name, owner, ttl_s, wait_s)
    h.step()
    assert h.records == [] and h.b.lock_list() == []


def test_tokens_keep_growing_across_restarts() -> None:
    h = Harness()
    tokens = []
    for i in range(3):
        info, _ = acquire(h, f"l{i}", "a")
        tokens.append(info["token"])
        h.b.lock_release(f"l{i}", "a", info["token"])
        h.sync()
    restart(h)
    info, _ = acquire(h, "l0", "a")
    assert info["token"] > max(tokens)
    # and through a checkpoint that holds no lock any more
    h.b.lock_release("l0", "a", info["token"])
    h.sync()
    lsn, snap = take_snapshot(h)
    restart(h, snapshot=snap, snapshot_lsn=lsn)
    info2, _ = acquire(h, "l9", "z")
    assert info2["token"] > info["token"]


def test_a_held_lock_is_still_held_after_a_restart_until_its_wall_clock_expiry() -> None:
    h = Harness()
    a, _ = acquire(h, "held", "a", ttl_s=30)
    acquire(h, "short", "a", ttl_s=2)
    h.b.lock_refresh("held", "a", a["token"], 40)
    h.sync()
    h.wall.now += 5  # down for 5 s
    restart(h)
    h.step()
    info = h.b.lock_info("held")
    assert info["owner"] == "a" and info["token"] == a["token"] and info["expires_in_s"] == 35
    assert h.b.lock_info("short")["held"] is False
    with pytest.raises(LockBusy):
        h.b.lock_acquire(REST_CHANNEL, "held", "b", 30, 0)
    h.b.lock_refresh("held", "a", a["token"])  # the holder goes on with its token
    h.sleep(40)
    assert h.b.lock_info("held")["held"] is False


def test_replay_is_idempotent_over_a_checkpoint_taken_later() -> None:
    h = Harness()
    a, _ = acquire(h, "l", "a", ttl_s=30)
    lsn, _ = take_snapshot(h)
    h.b.lock_release("l", "a", a["token"])
    b, _ = acquire(h, "l", "b", ttl_s=30)
    h.sync()
    # a checkpoint whose LSN is before the release, but whose contents are newer
    _lsn2, snap = take_snapshot(h)
    restart(h, snapshot=snap, snapshot_lsn=lsn)
    h.step()
    info = h.b.lock_info("l")
    assert info["owner"] == "b" and info["token"] == b["token"]


def test_a_channel_that_ends_leaves_every_line_it_waits_in() -> None:
    h = Harness()
    ch = h.channel()
    acquire(h, "x", "a")
    acquire(h, "y", "a")
    acquire(h, "x", "b", wait_s=60, ch=ch)
    acquire(h, "y", "b", wait_s=60, ch=ch)
    acquire(h, "y", "c", wait_s=60)
    h.b.lock_forget_channel(ch)
    assert h.b.lock_info("x")["waiters"] == []
    assert [w["owner"] for w in h.b.lock_info("y")["waiters"]] == ["c"]


def test_a_waiter_that_leaves_before_its_grant_is_sent_releases_the_lock() -> None:
    h = Harness()
    a, _ = acquire(h, "l", "a")
    _, wb = acquire(h, "l", "b", wait_s=60)
    acquire(h, "l", "c", wait_s=60)
    h.b.lock_release("l", "a", a["token"])
    h.step()  # b is granted the lock; the grant waits for the disk
    assert h.b.lock_info("l")["owner"] == "b" and granted(h) == []
    h.b.lock_cancel_wait(wb)  # b's caller left meanwhile
    h.sync()
    assert [g.info["owner"] for g in granted(h)] == ["c"]
    assert h.b.lock_info("l")["owner"] == "c"


def test_a_channel_that_ends_before_its_grant_is_sent_releases_the_lock() -> None:
    h = Harness()
    ch = h.channel()
    a, _ = acquire(h, "l", "a")
    acquire(h, "l", "b", wait_s=60, ch=ch)
    h.b.lock_release("l", "a", a["token"])
    h.step()
    h.b.close_channel(ch)
    h.b.lock_forget_channel(ch)
    h.sync()
    assert granted(h) == [] and h.b.lock_info("l")["held"] is False

"""Backoff: full jitter, cap, give-up deadline, attempts, reset."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.backoff import Backoff, ReconnectPolicy


def test_full_jitter_ceiling_grows_exponentially_up_to_the_cap() -> None:
    policy = ReconnectPolicy(initial_delay_s=0.1, max_delay_s=1.0, multiplier=2.0)
    top = Backoff(policy, random=lambda: 1.0)
    assert [top.next_delay(0.0) for _ in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    bottom = Backoff(policy, random=lambda: 0.0)
    assert [bottom.next_delay(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]


@settings(deadline=None)  # a loaded CI machine must not fail a pure test
@given(st.lists(st.floats(min_value=0, max_value=0.999999), min_size=1, max_size=80))
def test_delays_stay_within_zero_and_the_ceiling(rolls: list[float]) -> None:
    policy = ReconnectPolicy(initial_delay_s=0.05, max_delay_s=5.0, first_connect_give_up_after_s=None)
    it = iter(rolls)
    backoff = Backoff(policy, random=lambda: next(it))
    for attempt in range(len(rolls)):
        delay = backoff.next_delay(float(attempt))
        assert delay is not None
        assert 0 <= delay <= min(5.0, 0.05 * 2**attempt)


def test_gives_up_at_the_deadline_and_never_sleeps_past_it() -> None:
    backoff = Backoff(ReconnectPolicy(initial_delay_s=10, max_delay_s=10, give_up_after_s=15),
                      random=lambda: 1.0)
    assert backoff.next_delay(100.0) == 10.0  # the outage starts at 100
    assert backoff.deadline() == 115.0
    assert backoff.next_delay(110.0) == 5.0  # clamped to the deadline
    assert backoff.next_delay(115.0) is None


def test_gives_up_after_max_attempts() -> None:
    backoff = Backoff(ReconnectPolicy(max_attempts=3), random=lambda: 0.5)
    assert backoff.next_delay(0) is not None
    assert backoff.next_delay(0) is not None
    assert backoff.next_delay(0) is None
    assert backoff.attempts == 3


def test_reset_starts_a_new_outage() -> None:
    backoff = Backoff(ReconnectPolicy(initial_delay_s=1, give_up_after_s=5), random=lambda: 1.0)
    backoff.next_delay(0.0)
    backoff.next_delay(1.0)
    backoff.reset()
    assert backoff.attempts == 0 and backoff.outage_started is None and backoff.deadline() is None
    assert backoff.next_delay(100.0) == 1.0
    assert backoff.deadline() == 105.0


def test_huge_attempt_counts_do_not_overflow() -> None:
    backoff = Backoff(ReconnectPolicy(initial_delay_s=1, max_delay_s=3, multiplier=10), random=lambda: 1.0)
    for _ in range(2000):
        delay = backoff.next_delay(0.0)
    assert delay == 3


@pytest.mark.parametrize(
    "kwargs",
    [{"initial_delay_s": -1}, {"multiplier": 0.5}, {"give_up_after_s": -1}, {"max_attempts": 0}],
)
def test_policy_validation(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ReconnectPolicy(**kwargs)


def test_the_first_connect_gives_up_by_default_a_later_outage_does_not() -> None:
    backoff = Backoff(ReconnectPolicy(), random=lambda: 1.0)
    assert backoff.next_delay(0.0) is not None
    assert backoff.deadline() == 30.0  # first_connect_give_up_after_s
    assert backoff.next_delay(30.0) is None
    backoff.reset()  # a connection was healthy once
    assert backoff.next_delay(100.0) is not None
    assert backoff.deadline() is None  # give_up_after_s=None: retries forever
    assert backoff.next_delay(10_000.0) is not None


def test_jitter_leaves_the_applications_random_state_alone() -> None:
    """The client's reconnect jitter has a generator of its own: a program that seeds
    the global ``random`` (or a test framework that checks it) sees no draw from it."""
    import random

    state = random.getstate()
    backoff = Backoff(ReconnectPolicy(initial_delay_s=0.1, max_delay_s=1.0))
    delays = [backoff.next_delay(float(i)) for i in range(5)]
    assert all(d is not None and 0 <= d <= 1.0 for d in delays)
    assert random.getstate() == state

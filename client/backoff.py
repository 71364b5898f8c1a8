"""Reconnect delays: exponential backoff with full jitter, a cap and a give-up deadline.

Pure: time and randomness come in as arguments, so tests drive it exactly.

"Full jitter" (AWS Architecture Blog, "Exponential Backoff and Jitter", 2015): the n-th
retry waits ``uniform(0, min(max_delay_s, initial_delay_s * multiplier**n))``. Spreading
retries over the whole interval keeps a fleet of clients from reconnecting in lockstep
after a broker restart, which is the failure mode a fixed or merely-jittered exponential
schedule still has.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ReconnectPolicy", "Backoff"]


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How a channel retries after its connection drops (or before it first opens).

    Attributes:
        initial_delay_s: ceiling of the first delay.
        max_delay_s: cap on any single delay.
        multiplier: growth of the ceiling per failed attempt.
        give_up_after_s: stop retrying once this long has passed since the first
            failure of the current outage (``None``: never give up).
        max_attempts: stop after this many failed attempts in one outage (``None``:
            no limit).
        first_connect_give_up_after_s: a bound for the very first connect of a
            channel, before it was ever open (the shorter of it and
            ``give_up_after_s`` applies; ``None``: only ``give_up_after_s``).
            Bounded by default: a program started against a wrong URL or a broker
            that is not running fails with ``ConnectionLost`` (a ``ConnectionError``)
            instead of hanging, while a channel that was open once keeps retrying
            per ``give_up_after_s`` (by default, forever).
    """

    initial_delay_s: float = 0.05
    max_delay_s: float = 5.0
    multiplier: float = 2.0
    give_up_after_s: float | None = None
    max_attempts: int | None = None
    first_connect_give_up_after_s: float | None = 30.0

    def __post_init__(self) -> None:
        if self.initial_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("delays must be >= 0")
        if self.multiplier < 1:
            raise ValueError("multiplier must be >= 1")
        if self.give_up_after_s is not None and self.give_up_after_s < 0:
            raise ValueError("give_up_after_s must be >= 0")
        if self.first_connect_give_up_after_s is not None and self.first_connect_give_up_after_s < 0:
            raise ValueError("first_connect_give_up_after_s must be >= 0")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")


class Backoff:
    """The retry schedule of one outage at a time.

    Call :meth:`next_delay` after each failed attempt; it answers how long to sleep, or
    ``None`` to give up. Call :meth:`reset` once a connection is healthy again.
    """

    def __init__(
        self, policy: ReconnectPolicy, random: Callable[[], float] | None = None
    ) -> None:
        self._policy = policy
        # Jitter from a generator of our own: a library must not draw from (and so
        # perturb) the application's global ``random`` state.
        self._random = random if random is not None else _random.Random().random
        self._attempts = 0
        self._outage_started: float | None = None
        #: No connection was ever healthy yet: the first-connect bound applies.
        self.first_connect = True

    @property
    def attempts(self) -> int:
        """Failed attempts in the current outage."""
        return self._attempts

    @property
    def outage_started(self) -> float | None:
        """When the current outage began (``None`` when healthy)."""
        return self._outage_started

    def reset(self) -> None:
        """The connection is healthy: the next failure starts a new outage."""
        self._attempts = 0
        self._outage_started = None
        self.first_connect = False

    def deadline(self) -> float | None:
        """When the current outage gives up (``None``: never, or no outage)."""
        give_up = self._policy.give_up_after_s
        first = self._policy.first_connect_give_up_after_s
        if self.first_connect and first is not None:
            give_up = first if give_up is None else min(give_up, first)
        if self._outage_started is None or give_up is None:
            return None
        return self._outage_started + give_up

    def next_delay(self, now: float) -> float | None:
        """Record a failed attempt at time ``now``; return the delay before the next
        one, or ``None`` when the policy says to give up.

        The delay never runs past the give-up deadline: the last attempt happens at the
        deadline, not after it.
        """
        policy = self._policy
        if self._outage_started is None:
            self._outage_started = now
        self._attempts += 1
        if policy.max_attempts is not None and self._attempts >= policy.max_attempts:
            return None
        deadline = self.deadline()
        if deadline is not None and now >= deadline:
            return None
        exponent = self._attempts - 1
        ceiling = policy.max_delay_s
        # Avoid float overflow on long outages: stop growing once past the cap.
        if exponent < 64:
            ceiling = min(ceiling, policy.initial_delay_s * policy.multiplier**exponent)
        delay = self._random() * ceiling
        if deadline is not None:
            delay = min(delay, deadline - now)
        return delay

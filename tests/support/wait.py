"""Waiting on a condition with a deadline, instead of sleeping and hoping.

A test that needs the system under test to reach some state (a file synced, a
subprocess answering, a message delivered) polls for that state with these helpers
and fails with a clear message when it does not come within the deadline; it never
sleeps a fixed time betting that the state has come by then. A sleep that is itself
the thing tested (a lease expiring, a pause between a load's steps) stays a sleep.

``wait_until`` is the async form (trio or asyncio, through anyio); it polls on real
time, so under ``autojump_clock`` it still gives threads and subprocesses real time
to act. ``wait_until_sync`` is the blocking form for tests that drive subprocesses.
Both return the predicate's (truthy) value, so a test can wait for and take a result
in one step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anyio

__all__ = ["ConditionTimeout", "wait_until", "wait_until_sync"]

T = TypeVar("T")

#: How long a condition may take by default: generous, since the machine running the
#: tests may be loaded; a condition that holds returns at once.
DEFAULT_TIMEOUT_S = 15.0


class ConditionTimeout(AssertionError):
    """The condition did not hold within the deadline."""


def _describe(predicate: Callable[[], object], what: str | None) -> str:
    return what or getattr(predicate, "__name__", "condition")


def wait_until_sync(
    predicate: Callable[[], T],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    interval_s: float = 0.02,
    what: str | None = None,
) -> T:
    """Call ``predicate`` until it returns something truthy (returned), at most
    ``timeout_s`` seconds; raise :class:`ConditionTimeout` naming ``what`` after."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise ConditionTimeout(f"{_describe(predicate, what)}: not true after {timeout_s} s")
        time.sleep(interval_s)


async def wait_until(
    predicate: Callable[[], T],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    interval_s: float = 0.01,
    what: str | None = None,
) -> T:
    """The async form of :func:`wait_until_sync`: other tasks run between polls. The
    deadline is in real (monotonic) time, whatever clock the event loop runs on."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise ConditionTimeout(f"{_describe(predicate, what)}: not true after {timeout_s} s")
        await anyio.sleep(interval_s)

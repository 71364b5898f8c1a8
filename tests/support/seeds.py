"""Reproducible randomness for randomized tests.

A randomized test takes its seed from :func:`test_seed`: ``ACKBUS_TEST_SEED`` when it is
set, a fresh random seed otherwise. The seed is printed (pytest shows it with a
failure's captured output), so a failing run is replayed with
``ACKBUS_TEST_SEED=<seed> scripts/test <the test>``. The ``seeded_random`` fixture of
``tests/conftest.py`` hands a test a ``random.Random`` seeded this way.
"""

from __future__ import annotations

import os
import random

__all__ = ["SEED_ENV", "test_seed"]

SEED_ENV = "ACKBUS_TEST_SEED"


def test_seed(name: str) -> int:
    """The seed for the randomized test ``name``, printed with how to replay it."""
    text = os.environ.get(SEED_ENV, "").strip()
    seed = int(text) if text else random.SystemRandom().randrange(1 << 32)
    print(f"{name}: seed={seed} (replay: {SEED_ENV}={seed})")
    return seed


test_seed.__test__ = False  # type: ignore[attr-defined]  # (not a test itself)

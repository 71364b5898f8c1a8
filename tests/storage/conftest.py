"""Shared fixtures for the storage tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.storage import Recovery, faults, recover
from broker.storage.fs import FileSystem
from broker.storage.testing import SimulatedCrash


@pytest.fixture(autouse=True)
def _clean_faults() -> Iterator[None]:
    faults.reset()
    yield
    faults.reset()


@pytest.fixture
def crash_at_kill_points() -> Iterator[None]:
    """Make armed kill points raise SimulatedCrash instead of killing pytest."""

    def handler(name: str) -> None:
        raise SimulatedCrash(name)

    faults.set_kill_handler(handler)
    yield
    faults.set_kill_handler(None)


RecoverAll = Callable[..., tuple[Recovery, list[tuple[int, int, bytes]]]]


@pytest.fixture
def recover_all() -> RecoverAll:
    """Run a whole recovery: returns (recovery, [(lsn, rtype, payload), ...])."""

    def run(
        data_dir: Path | str, *, repair: bool = False, fs: FileSystem | None = None
    ) -> tuple[Recovery, list[tuple[int, int, bytes]]]:
        recovery = recover(data_dir, repair=repair, fs=fs)
        checkpoint = list(recovery.checkpoint_records)
        assert recovery.checkpoint is not None or not checkpoint
        records = list(recovery.wal_records)
        assert recovery.finished
        assert recovery.next_lsn == recovery.last_lsn + 1
        return recovery, records

    return run

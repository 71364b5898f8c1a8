"""What the runtime relies on from its log, checked on the real write-ahead log and on
the tests' stand-in (``tests/support/fakewal.py``) alike, in the manner of trio's
``testing/_check_streams.py``: a fake earns trust by passing the real thing's tests.

The rules (``broker.runtime.LogPort.append_nowait``): each batch is numbered right
after the previous one, the call returns the LSN of the batch's last record, and a
lazy batch (acks) is numbered like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest

from broker.storage import open_wal, recover
from tests.support.fakewal import FakeWAL


class _Log(Protocol):
    def append_nowait(self, records: Any, *, lazy: bool = False, together: bool = False) -> int: ...


@asynccontextmanager
async def _real(tmp_path: Path) -> AsyncIterator[_Log]:
    recovery = recover(tmp_path / "data")
    for _record in recovery.wal_records:  # the read phase comes first (empty here)
        pass
    async with open_wal(recovery, fsync_policy="never") as wal:
        yield wal


@asynccontextmanager
async def _fake(tmp_path: Path) -> AsyncIterator[_Log]:
    yield FakeWAL()


@pytest.fixture(params=[_real, _fake], ids=["WriteAheadLog", "FakeWAL"])
def open_log(request: pytest.FixtureRequest) -> Any:
    return request.param


async def test_batches_are_numbered_one_after_another(open_log: Any, tmp_path: Path) -> None:
    async with open_log(tmp_path) as log:
        assert log.append_nowait([(1, b"a")]) == 1
        assert log.append_nowait([(1, b"b"), (2, b"c"), (3, b"d")]) == 4
        assert log.append_nowait([(9, b"")]) == 5


async def test_lazy_batches_are_numbered_like_any_other(open_log: Any, tmp_path: Path) -> None:
    async with open_log(tmp_path) as log:
        assert log.append_nowait([(1, b"a")]) == 1
        assert log.append_nowait([(2, b"ack"), (2, b"ack")], lazy=True) == 3
        assert log.append_nowait([(1, b"b")]) == 4


async def test_numbering_counts_records_not_bytes(open_log: Any, tmp_path: Path) -> None:
    async with open_log(tmp_path) as log:
        assert log.append_nowait([(1, b"x" * 100_000)]) == 1
        assert log.append_nowait([(1, b"")] * 1000) == 1001

"""Fixtures of the system tests (a real broker subprocess)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from tests.support.broker import BrokerProcess


@pytest.fixture
async def async_broker(tmp_path: Path) -> AsyncIterator[BrokerProcess]:
    """A broker subprocess for a trio test (started and stopped off the event loop)."""
    proc = BrokerProcess(tmp_path / "data")
    await trio.to_thread.run_sync(proc.start)
    try:
        yield proc
    finally:
        await trio.to_thread.run_sync(proc.stop)

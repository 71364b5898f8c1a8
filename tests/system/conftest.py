"""Fixtures of the system tests (a real broker subprocess)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from tests.support.broker import BrokerProcess

if TYPE_CHECKING:
    from bench.servers import RabbitServer


@pytest.fixture
async def async_broker(tmp_path: Path) -> AsyncIterator[BrokerProcess]:
    """A broker subprocess for a trio test (started and stopped off the event loop)."""
    proc = BrokerProcess(tmp_path / "data")
    await trio.to_thread.run_sync(proc.start)
    try:
        yield proc
    finally:
        await trio.to_thread.run_sync(proc.stop)


# The differential tests' servers, once per worker (not per module): a RabbitMQ start
# costs 5-9 s, and four modules compare against it. The modules declare names of their
# own (tests/system/amqp_diff_support.py), so a module never sees another's queues as
# its own; conftest.py runs the four modules one after another on one worker.


@pytest.fixture(scope="session")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitServer]:
    """A private RabbitMQ node, shared by the differential modules (skipped where it is
    not installed)."""
    from tests.system.amqp_diff_support import private_rabbit

    with private_rabbit(tmp_path_factory.mktemp("rabbit")) as server:
        yield server


@pytest.fixture(scope="session")
def ackbus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """An ackbus broker subprocess with its AMQP port (``amqp_port``), shared by the
    differential modules."""
    from tests.system.amqp_diff_support import private_ackbus

    with private_ackbus(tmp_path_factory.mktemp("ackbus")) as proc:
        yield proc

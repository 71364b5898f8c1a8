"""Fixtures for API tests over an in-process broker on ``trio.testing`` memory
streams: ``broker`` (a default :class:`MemoryBroker`), ``clients`` (channel
clients connected to whatever ``broker`` the module has) and ``api`` (an HTTP client
of that broker). A module imports them by
name (``from tests.support.memory_fixtures import broker, clients``), in place of the
root conftest's ``clients``, which serve a :class:`BrokerApp`; it may define its own
``broker`` to configure one and import ``clients`` alone."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from tests.support.app import MemoryBroker, open_memory_broker
from tests.support.channel import Clients
from tests.support.http import HTTPClient

__all__ = ["api", "broker", "clients"]


@pytest.fixture
async def broker() -> AsyncIterator[MemoryBroker]:
    async with open_memory_broker() as broker:
        yield broker


@pytest.fixture
async def clients(broker: MemoryBroker) -> AsyncIterator[Clients]:
    async def connect() -> trio.abc.Stream:
        return broker.connect()

    async with Clients(connect_fn=connect) as c:
        yield c


@pytest.fixture
async def api(broker: MemoryBroker) -> AsyncIterator[HTTPClient]:
    async def connect() -> trio.abc.Stream:
        return broker.connect()

    client = HTTPClient(connect)
    yield client
    await client.aclose()

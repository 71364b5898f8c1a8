"""Fixtures for the client tests: an in-process fake broker and a connection to it.

Every client test is marked ``anyio`` and runs twice, under trio and under asyncio
(``anyio_backend``). A test that asks for ``autojump_clock`` gets trio's virtual clock
under trio; asyncio has no virtual clock, so it runs under asyncio only when marked
``real_time`` (its waits are short enough for real time: the crash and reconnect
tests). Tests of trio's scheduling itself (and of direct writes, a trio-only path) pin
``anyio_backend`` to trio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import client
from tests.client.fakebroker import FakeBroker, open_fake_broker


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the asyncio runs of virtual-time tests not marked ``real_time``."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        virtual = "autojump_clock" in getattr(item, "fixturenames", ())
        if (
            virtual
            and callspec is not None
            and callspec.params.get("anyio_backend") == "asyncio"
            and item.get_closest_marker("real_time") is None
        ):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    if request.param == "trio" and "autojump_clock" in request.fixturenames:
        return ("trio", {"clock": request.getfixturevalue("autojump_clock")})
    return request.param


@pytest.fixture
async def fake() -> AsyncIterator[FakeBroker]:
    async with open_fake_broker() as broker:
        yield broker


@pytest.fixture
async def conn(fake: FakeBroker) -> AsyncIterator[client.Connection]:
    async with client.connect("http://fake.invalid:8080", open_stream=fake.open_stream) as c:
        yield c

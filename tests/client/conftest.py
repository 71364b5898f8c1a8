"""Fixtures for the client tests: an in-process fake broker and a connection to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import client
from tests.client.fakebroker import FakeBroker, open_fake_broker


@pytest.fixture
async def fake() -> AsyncIterator[FakeBroker]:
    async with open_fake_broker() as broker:
        yield broker


@pytest.fixture
async def conn(fake: FakeBroker) -> AsyncIterator[client.Connection]:
    async with client.connect("http://fake.invalid:8080", open_stream=fake.open_stream) as c:
        yield c

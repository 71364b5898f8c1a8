"""Which placement a queue's declare asks for (``broker.cluster.writes.placement``):
RabbitMQ's quorum and classic placement arguments and their older spellings."""

from __future__ import annotations

from typing import Any

import pytest

from broker.cluster.writes import placement
from broker.core import InvalidArgument


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "balanced"),
        ({"x-max-length": 3}, "balanced"),
        ({"x-queue-leader-locator": "client-local"}, "client-local"),
        ({"x-queue-leader-locator": "balanced"}, "balanced"),
        ({"x-queue-leader-locator": "random"}, "balanced"),
        ({"x-queue-leader-locator": "least-leaders"}, "balanced"),
        ({"x-queue-master-locator": "client-local"}, "client-local"),
        ({"x-queue-master-locator": "min-masters"}, "balanced"),
        ({"x-queue-master-locator": "random"}, "balanced"),
        ({"x-queue-leader-locator": "balanced", "x-queue-master-locator": "client-local"}, "balanced"),
        ({"x-queue-leader-locator": "client-local", "x-queue-master-locator": "random"}, "client-local"),
    ],
)
def test_placement(arguments: dict[str, Any], expected: str) -> None:
    assert placement(arguments) == expected


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-queue-leader-locator": "min-masters"},
        {"x-queue-master-locator": "balanced"},
        {"x-queue-master-locator": 1},
        {"x-queue-leader-locator": "client-local", "x-queue-master-locator": "bogus"},
    ],
)
def test_a_placement_value_neither_knows_is_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        placement(arguments)

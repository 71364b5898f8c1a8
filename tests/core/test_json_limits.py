"""Bounds on the JSON values the broker keeps (message headers, and the like): nothing
accepted may fail to encode later in the log, a checkpoint or a delivery."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broker.core import (
    MAX_EXPIRATION_MS,
    MAX_JSON_DEPTH,
    MAX_JSON_ITEMS,
    InvalidArgument,
    check_json_value,
    check_properties,
)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


def test_values_up_to_the_depth_limit_pass_and_encode() -> None:
    value = nested(MAX_JSON_DEPTH)
    check_json_value(value, "v")
    orjson.dumps(value)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 253, 300, 900])
def test_deeper_values_are_refused_naming_the_limit(depth: int) -> None:
    with pytest.raises(InvalidArgument, match=f"more than {MAX_JSON_DEPTH} levels"):
        check_json_value(nested(depth), "property headers")


def test_too_many_items_and_oversized_integers_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="items"):
        check_json_value({"a": list(range(MAX_JSON_ITEMS + 1))}, "v")
    with pytest.raises(InvalidArgument, match="64 bits"):
        check_json_value({"a": [1 << 64]}, "v")
    check_json_value({"a": [(1 << 63) - 1, -(1 << 63)]}, "v")


def test_message_headers_nested_253_deep_are_refused() -> None:
    # before: accepted, and the broker died encoding the record (orjson's limit is 254)
    with pytest.raises(InvalidArgument, match="headers"):
        check_properties({"headers": {"h": nested(253)}})


@pytest.mark.parametrize(
    "props",
    [
        {"timestamp": 1 << 64},
        {"timestamp": -1},
        {"expiration": int("1" + "0" * 400)},
        {"expiration": MAX_EXPIRATION_MS + 1},
    ],
)
def test_out_of_range_numeric_properties_are_refused(props: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        check_properties(props)


def test_numeric_properties_at_their_bounds_pass() -> None:
    assert check_properties({"timestamp": (1 << 63) - 1, "expiration": MAX_EXPIRATION_MS})

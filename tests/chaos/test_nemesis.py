"""The nemesis's choice of fault kinds: ``scripts/chaos --faults`` (no cluster)."""

from __future__ import annotations

import pytest

from tests.chaos.nemesis import ALL_KINDS, available_kinds, parse_kinds, select_kinds


def test_faults_are_named_kinds_and_an_unknown_one_is_refused_naming_the_choices() -> None:
    assert parse_kinds("split, kill") == ["split", "kill"]
    with pytest.raises(ValueError, match="unknown fault kind.*splitt.*one-way"):
        parse_kinds("splitt")
    with pytest.raises(ValueError):
        parse_kinds(",")


def test_a_run_makes_only_the_kinds_asked_for_and_refuses_those_it_cannot_make() -> None:
    assert select_kinds(available_kinds(network=True, clock=True), None) == list(ALL_KINDS)
    assert select_kinds(available_kinds(network=True, clock=False), ["split"]) == ["split"]
    assert "clock-jump" not in available_kinds(network=False, clock=False)
    with pytest.raises(ValueError, match="split cannot be made here"):
        select_kinds(available_kinds(network=False, clock=True), ["kill", "split"])

"""A short run of the fault test (scripts/chaos): one minute of kills, pauses and a
wiped follower against a 3-node cluster; nothing confirmed may be lost, a message
delivered twice only as a marked redelivery, and each publisher's messages first
delivered in publish order."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import run
from tests.support.etcd import require_etcd

pytestmark = pytest.mark.slow


def test_a_minute_of_faults_loses_nothing_confirmed(tmp_path: Path) -> None:
    require_etcd()
    result = run(tmp_path, minutes=1.0, nodes=3, publishers=2, seed=7, ttl_s=3)
    assert result["faults_total"] >= 3, result
    assert result["confirmed"] > 100, result
    print(result)
    assert result["lost"] == 0, result
    assert result["duplicates_unmarked"] == 0, result
    assert result["order_violations"] == 0, result

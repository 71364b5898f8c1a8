"""A short run of the fault test (scripts/chaos) against a 3-node cluster with three
etcd members: in network namespaces when they can be made here (partitions too),
else on loopback (kills, pauses, a wiped follower, clock jumps, etcd members
stopped). Nothing confirmed may be lost, a message delivered twice only as a marked
redelivery, each publisher's messages first delivered in publish order, fencing
tokens only grow, and no node confirms in an epoch once a later one was led."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import run
from tests.chaos.netns import netns_unavailable_reason
from tests.support.etcd import require_etcd

pytestmark = pytest.mark.slow

def test_a_run_of_faults_loses_nothing_confirmed(tmp_path: Path) -> None:
    require_etcd()
    reason = netns_unavailable_reason()
    result = run(tmp_path, minutes=1.0, nodes=3, publishers=2, seed=7, ttl_s=3, netns=reason is None)
    print(result)
    assert result["faults_total"] >= 4, result
    assert result["confirmed"] > 100, result
    assert result["lost"] == 0, result
    assert result["duplicates_unmarked"] == 0, result
    assert result["order_violations"] == 0, result
    assert result["lock_grants"] > 20, result
    assert result["fencing_violations"] == 0, result
    assert result["epochs_led"] >= 2, result
    assert result["epoch_violations"] == 0, result
    # a publish refused (returned, or nacked and dropped at a step-down) and then resent
    # must land, not be answered as a duplicate of what no node keeps
    assert result["lost_refused_then_deduplicated"] == 0, result

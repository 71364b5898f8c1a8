"""The quorum part of the cluster benchmark (``bench/cluster_quorum.py``): its
percentiles and table from made-up figures (no broker), the peer check, and one
``--quick`` run for real (a private etcd, 3 nodes, 3 kills of the leader, and with
rabbitmq-server installed one private RabbitMQ node; a minute or two on two cores),
which checks that every figure came out, not how big it is."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

import pytest

from bench.cli import parse_args
from bench.cluster_nodes import QUICK
from bench.cluster_quorum import percentile, quorum_tables, run_quorum_part
from tests.support.etcd import etcd_binary


def test_percentile_is_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0
    assert percentile([5.0], 99) == 5.0


def test_quorum_tables_show_each_row_and_the_failover() -> None:
    rows = [{"side": "ackbus", "queue": "quorum, 3 replicas", "publish_msgs_per_s": 1234.4, "consume_msgs_per_s": 800},
            {"side": "rabbitmq", "queue": "quorum, 3 replica(s)", "nodes": 3, "publish_msgs_per_s": 5000,
             "consume_msgs_per_s": 4000}]
    failover = {"kills": 3, "p50_s": 3.5, "p99_s": 4.25, "max_s": 4.25}
    text = "\n".join(quorum_tables(rows, failover, QUICK))
    assert "| ackbus (3 nodes, via the leader) | quorum, 3 replicas | 1,234 | 800 |" in text
    assert "| RabbitMQ (3 nodes, via the leader) | quorum, 3 replica(s) | 5,000 | 4,000 |" in text
    assert "ONE node" not in text
    assert "| 3 | 3.50 | 4.25 | 4.25 |" in text


def test_quorum_tables_say_when_rabbitmq_ran_as_one_node() -> None:
    rows = [{"side": "rabbitmq", "queue": "quorum, 1 replica(s)", "nodes": 1, "publish_msgs_per_s": 5000,
             "consume_msgs_per_s": 4000}]
    text = "\n".join(quorum_tables(rows, {"kills": 0, "p50_s": 0, "p99_s": 0, "max_s": 0}, QUICK))
    assert "| RabbitMQ (one node) | quorum, 1 replica(s) | 5,000 | 4,000 |" in text
    assert "ONE node" in text


def test_cluster_allows_rabbitmq_as_peer_from_three_nodes() -> None:
    assert parse_args(["--cluster", "3", "--peer", "rabbitmq,redis"]).peers == ["rabbitmq", "redis"]
    with pytest.raises(SystemExit):
        parse_args(["--cluster", "2", "--peer", "rabbitmq"])


@pytest.mark.slow
# bench.procs.run_workers leaves its workers' stdout pipes to the garbage collector
# (the other bench tests run the benchmark in a subprocess, where nobody looks)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_quick_quorum_part_for_real(tmp_path: Path) -> None:
    if etcd_binary() is None:
        pytest.skip("needs etcd")
    with_rabbit = shutil.which("rabbitmq-server") is not None and importlib.util.find_spec("pika") is not None
    temp = Path(tempfile.gettempdir())
    before = set(temp.glob("ackbus-bench-cluster-*"))
    said: list[str] = []
    lines, results = run_quorum_part(QUICK, quick=True, peers=["rabbitmq"] if with_rabbit else [],
                                     log_dir=tmp_path, say=said.append)
    assert set(temp.glob("ackbus-bench-cluster-*")) <= before  # the cluster's and RabbitMQ's directories removed
    expected = [("ackbus", "quorum, 3 replicas"), ("ackbus", "classic")]
    if with_rabbit:
        expected += [("rabbitmq", "quorum, 3 replica(s)"), ("rabbitmq", "classic")]
    assert [(r["side"], r["queue"]) for r in results["rows"]] == expected
    for row in results["rows"]:
        assert row["count"] == QUICK.forward_count, row
        assert row["publish_msgs_per_s"] > 0 and row["consume_msgs_per_s"] > 0, row
    failover = results["failover"]
    assert failover["kills"] == 3 and len(failover["failover_s"]) == 3
    assert all(t > 0 for t in failover["failover_s"])
    assert 0 < failover["p50_s"] <= failover["p99_s"] <= failover["max_s"]
    assert failover["held"] >= failover["confirmed"] > 0
    assert sum("kill -9" in line for line in said) == 3
    text = "\n".join(lines)
    assert "| ackbus (3 nodes, via the leader) | quorum, 3 replicas |" in text and "| kills | p50 s |" in text

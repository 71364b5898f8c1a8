"""The cluster benchmark (``scripts/bench --cluster N [--peer redis]``): its node counts
and its table from made-up rows (no broker), and one ``--quick`` run for real against
one Redis (a private etcd, up to 2 nodes, 8 publisher processes; about a minute on two
cores), which checks that every figure came out, not how big it is."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.cli import parse_args
from bench.cluster import _scale_table, node_counts, scale_row
from bench.procs import ROOT
from tests.support.etcd import etcd_binary


def test_node_counts_double_up_to_n_and_include_n() -> None:
    assert node_counts(1) == [1]
    assert node_counts(2) == [1, 2]
    assert node_counts(3) == [1, 2, 3]
    assert node_counts(8) == [1, 2, 4, 8]
    assert node_counts(6) == [1, 2, 4, 6]


def test_scale_row_and_table_give_totals_cpu_and_ratios() -> None:
    publishers = [{"count": 1000, "elapsed_s": 0.5, "cpu_s": 0.01}, {"count": 3000, "elapsed_s": 1.0, "cpu_s": 0.03}]
    row = scale_row("ackbus", 2, publishers, server_cpu_s=0.08)
    assert row["msgs_per_s"] == pytest.approx(4000)  # all messages over the longest publisher's time
    assert row["server_cpu_us_per_msg"] == pytest.approx(20)
    assert row["client_cpu_us_per_msg"] == pytest.approx(10)
    assert row["cores_busy"] == pytest.approx(0.12)
    redis = scale_row("redis", 1, [{"count": 8000, "elapsed_s": 1.0, "cpu_s": 0.01}], server_cpu_s=0.02)
    text = "\n".join(_scale_table([redis, row]))
    assert "| Redis (one server) | 1 | 8,000 | 2.5 | 1.2 | 0.03 |" in text
    assert "| ackbus | 2 | 4,000 | 20.0 | 10.0 | 0.12 |" in text
    assert "| 2 | 0.50 |" in text  # ackbus / Redis


def test_cluster_accepts_redis_and_refuses_rabbitmq_below_three_nodes() -> None:
    assert parse_args(["--cluster", "4", "--peer", "redis"]).peers == ["redis"]
    with pytest.raises(SystemExit):
        parse_args(["--cluster", "2", "--peer", "rabbitmq"])


@pytest.mark.slow
def test_quick_cluster_run_against_redis(tmp_path: Path) -> None:
    missing = [what for what, there in (
        ("etcd", etcd_binary() is not None),
        ("redis-server", shutil.which("redis-server") is not None),
        ("redis-py", importlib.util.find_spec("redis") is not None),
        ("hiredis", importlib.util.find_spec("hiredis") is not None),
    ) if not there]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (scripts/bench installs redis-py and hiredis)")
    temp = Path(tempfile.gettempdir())
    before = set(temp.glob("ackbus-bench-cluster-*"))
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--cluster", "2", "--peer", "redis", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert set(temp.glob("ackbus-bench-cluster-*")) <= before  # every cluster's and Redis's directory removed
    (saved,) = tmp_path.glob("cluster-*.json")
    results = json.loads(saved.read_text())
    assert [(r["side"], r["nodes"]) for r in results["scale"]] == [("redis", 1), ("ackbus", 1), ("ackbus", 2)]
    for row in results["scale"]:
        assert row["count"] > 0 and row["msgs_per_s"] > 0, row
        assert row["server_cpu_us_per_msg"] > 0 and row["client_cpu_us_per_msg"] > 0, row
    # the 8 queues were balanced over both nodes
    assert sorted(results["scale"][2]["queues_per_node"].values()) == [4, 4]
    assert set(results["forwarding"]) == {f"{what} via {path}" for what in ("publish", "consume + ack")
                                          for path in ("owner", "other node")}
    assert all(rate > 0 for rate in results["forwarding"].values())
    assert "| Redis (one server) | 1 |" in done.stdout and "| nodes | ackbus / Redis |" in done.stdout


def test_the_nodes_run_on_the_benchmarks_own_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """``scripts/cluster`` is told which Python to start the nodes with (``PYTHON``):
    this one, from this tree. From a compiled build's tree, which has no ``.venv`` of
    its own, it would otherwise fall back to a bare ``python3``."""
    import bench.cluster_nodes as cluster_nodes

    calls: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        env = kwargs.get("env")
        assert isinstance(env, dict)
        calls.append((argv, env))
        return subprocess.CompletedProcess(argv, 1, "", "refused by the test")

    monkeypatch.setattr(cluster_nodes.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="refused by the test"):
        cluster_nodes.Cluster(1).__enter__()
    assert [argv[1] for argv, _ in calls] == ["up", "down"]
    assert all(env["PYTHON"] == sys.executable for _, env in calls)

"""The growth-with-work workloads (``bench/growth.py``) and their chart
(``bench/plot_growth.py``).

The quick run covers fan-out to 1 and 10 queues and 1 and 10 publisher channels on
ackbus alone (a few seconds); ``growth_memory`` (kill -9 and restart twice) is left to
``scripts/bench --quick --only growth_memory``. No timing is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.growth import data_dir_bytes, spread
from bench.params import QUICK
from bench.plot_growth import (
    growth_chart_path,
    growth_series,
    plot_growth,
    without_growth,
)
from bench.procs import ROOT
from bench.stats import Figure, Summary
from bench.workloads import WORKLOADS, all_figures

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def test_channels_are_spread_evenly_over_at_most_procs_processes() -> None:
    assert spread(1, 4) == [1]
    assert spread(3, 4) == [1, 1, 1]
    assert spread(10, 4) == [3, 3, 2, 2]
    assert spread(100, 4) == [25, 25, 25, 25]


def test_growth_workloads_are_registered_with_their_figures() -> None:
    assert {"growth_fanout", "growth_publishers", "growth_memory"} <= set(WORKLOADS)
    assert WORKLOADS["growth_memory"].ackbus_only and not WORKLOADS["growth_fanout"].ackbus_only
    keys = [f.key for f in all_figures(QUICK, ["growth_fanout", "growth_publishers"])]
    assert keys == [
        "growth_fanout/1/msgs_per_s", "growth_fanout/1/deliveries_per_s",
        "growth_fanout/10/msgs_per_s", "growth_fanout/10/deliveries_per_s",
        "growth_publishers/1/msgs_per_s", "growth_publishers/10/msgs_per_s",
    ]


def test_data_dir_bytes_counts_allocated_blocks(tmp_path: Path) -> None:
    assert data_dir_bytes(tmp_path) == 0
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a").write_bytes(b"x" * 10_000)
    assert data_dir_bytes(tmp_path) >= 10_000


def _summary(key: str, values: list[float], side: str = "ackbus") -> Summary:
    workload = key.split("/")[0]
    return Summary(Figure(key, workload, key, "x", True), {side: values})


def test_series_come_from_the_keys_in_order_of_work(tmp_path: Path) -> None:
    summaries = [
        _summary("growth_fanout/10/msgs_per_s", [900.0, 1000.0, 1100.0]),
        _summary("growth_fanout/1/msgs_per_s", [5000.0]),
        _summary("growth_fanout/1/deliveries_per_s", [5000.0]),
        _summary("growth_fanout/1/msgs_per_s", [4000.0], side="rabbitmq"),
        _summary("publish_seq/100/msgs_per_s", [1500.0]),
    ]
    assert growth_series(summaries, "growth_fanout", "msgs_per_s", "ackbus") == [
        (1.0, 5000.0, 5000.0, 5000.0), (10.0, 1000.0, 900.0, 1100.0)]
    assert growth_series(summaries, "growth_fanout", "msgs_per_s", "rabbitmq") == [(1.0, 4000.0, 4000.0, 4000.0)]
    assert growth_series(summaries, "growth_memory", "disk_mib", "ackbus") == []
    assert [s.figure.key for s in without_growth(summaries)] == ["publish_seq/100/msgs_per_s"]
    assert growth_chart_path(Path("docs/benchmarks.png")) == Path("docs/benchmarks-growth.png")

    png = tmp_path / "growth.png"
    assert not plot_growth(without_growth(summaries), {}, png)  # nothing to draw
    if HAVE_MATPLOTLIB:
        assert plot_growth(summaries, {}, png)
        assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_quick_growth_run(tmp_path: Path) -> None:
    names = ["growth_fanout", "growth_publishers"]
    main_png = tmp_path / "chart.png"
    cmd = [sys.executable, "-m", "bench", "--quick", "--rounds", "1", "--only", ",".join(names),
           "--out", str(tmp_path)]
    if HAVE_MATPLOTLIB:
        cmd += ["--plot", "--plot-file", str(main_png)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr

    results = json.loads((tmp_path / "latest.json").read_text())
    assert not [r for r in results["runs"] if r.get("error")]
    measured = {key: value for run in results["runs"] for key, value in run["figures"].items()}
    assert set(measured) == {f.key for f in all_figures(QUICK, names)}
    assert all(math.isfinite(v) and v > 0 for v in measured.values()), measured
    assert measured["growth_fanout/10/deliveries_per_s"] == pytest.approx(10 * measured["growth_fanout/10/msgs_per_s"])
    # ten channels spread over four processes, each reporting its channels
    (publishers,) = [r for r in results["runs"] if r["workload"] == "growth_publishers"]
    assert [w["channels"] for w in publishers["extra"]["10"]] == [3, 3, 2, 2]
    if HAVE_MATPLOTLIB:
        # only growth workloads ran: no main chart, the growth chart beside where it would be
        assert not main_png.exists()
        assert (tmp_path / "chart-growth.png").read_bytes().startswith(b"\x89PNG")

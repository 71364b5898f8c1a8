"""Smoke test of the benchmark harness (``scripts/bench``), cheap enough for the suite.

It runs ``python -m bench --quick --rounds 1`` on ackbus alone with two workloads
(pipelined publish, which also yields the WAL bytes per message, and the 1/8/64
in-flight publish): about 10–15 s on two cores. It checks that every figure of those
workloads came out as a positive number and that the JSON and markdown results were
written, and draws the chart when matplotlib is installed (``scripts/test`` does not
install it). It needs neither RabbitMQ nor pika; the whole harness with the peer is
run by hand: ``scripts/bench --peer rabbitmq --quick --rounds 1``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import main
from bench.params import FULL, QUICK
from bench.procs import ROOT
from bench.workloads import WORKLOADS, all_figures

pytestmark = pytest.mark.slow

SMOKE = ["publish_pipelined", "inflight"]


def test_quick_run_yields_positive_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = importlib.util.find_spec("matplotlib") is not None
    png = tmp_path / "chart.png"
    cmd = [sys.executable, "-m", "bench", "--quick", "--rounds", "1", "--only", ",".join(SMOKE),
           "--out", str(tmp_path)]
    if plot:
        cmd += ["--plot", "--plot-file", str(png)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

    results = json.loads((tmp_path / "latest.json").read_text())
    assert [(r["workload"], r["side"]) for r in results["runs"]] == [(name, "ackbus") for name in SMOKE]
    assert not [r for r in results["runs"] if r.get("error")]
    keys = {f.key for f in all_figures(QUICK, SMOKE)}
    measured = {key: value for run in results["runs"] for key, value in run["figures"].items()}
    assert set(measured) == keys
    assert all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in measured.values()), measured
    # a persistent 100-byte message cannot take fewer WAL bytes than its body
    assert measured["publish_pipelined/100/wal_bytes_per_msg"] >= 100
    for figure in results["summary"]:
        assert figure["ackbus"]["min"] <= figure["ackbus"]["median"] <= figure["ackbus"]["max"]
    assert results["machine"]["nproc"] and results["versions"]["ackbus"]

    markdown = [p for p in tmp_path.glob("*.md")]
    assert len(markdown) == 1
    text = markdown[0].read_text()
    assert text.startswith("| figure |") and "64 in flight per channel" in text and "WAL bytes/msg" in text
    assert "broker CPU µs/msg" in text
    assert "pipelined publish (window 1000), 1 publisher, 100 B" in done.stdout
    if plot:
        assert png.read_bytes().startswith(b"\x89PNG")

    # --results re-renders saved results without running anything
    capsys.readouterr()
    assert main(["--results", str(tmp_path / "latest.json")]) == 0
    assert "1 in flight per channel" in capsys.readouterr().out


def test_every_workload_has_figures_and_a_finite_budget() -> None:
    for params in (QUICK, FULL):
        for workload in WORKLOADS.values():
            assert workload.figures(params)
            assert 0 < workload.budget_s(params) < 4 * 3600
    assert "inflight" in WORKLOADS
    assert [f.key for f in all_figures(FULL, ["inflight"])] == [
        "inflight/1/msgs_per_s", "inflight/8/msgs_per_s", "inflight/64/msgs_per_s"]

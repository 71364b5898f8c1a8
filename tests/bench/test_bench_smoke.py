"""Smoke test of the benchmark harness: ``python -m bench --quick`` on ackbus alone.

Not in ``tests/`` (the lead decides whether the suite runs it):
``.venv/bin/python -m pytest bench/test_smoke.py``. It runs every workload once with
tiny counts (about 20 s) and checks that each figure came out as a positive number;
it needs neither RabbitMQ nor pika. The chart is drawn too when matplotlib is there.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.params import QUICK
from bench.procs import ROOT
from bench.workloads import WORKLOADS, all_figures


@pytest.mark.slow
def test_quick_run_yields_every_figure(tmp_path: Path) -> None:
    plot = importlib.util.find_spec("matplotlib") is not None
    png = tmp_path / "chart.png"
    cmd = [sys.executable, "-m", "bench", "--quick", "--rounds", "1", "--out", str(tmp_path)]
    if plot:
        cmd += ["--plot", "--plot-file", str(png)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    results = json.loads((tmp_path / "latest.json").read_text())
    assert [r["side"] for r in results["runs"]] == ["ackbus"] * len(WORKLOADS)
    assert not [r for r in results["runs"] if r.get("error")]
    keys = {f.key for f in all_figures(QUICK, list(WORKLOADS))}
    measured = {key: value for run in results["runs"] for key, value in run["figures"].items()}
    assert set(measured) == keys
    assert all(math.isfinite(v) and v > 0 for v in measured.values()), measured
    for figure in results["summary"]:
        assert figure["ackbus"]["min"] <= figure["ackbus"]["median"] <= figure["ackbus"]["max"]
    assert "one-at-a-time confirmed publish, 100 B" in done.stdout
    if plot:
        assert png.read_bytes().startswith(b"\x89PNG")

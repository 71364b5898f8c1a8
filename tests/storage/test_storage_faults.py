"""Fault points are for tests only: the environment cannot arm them in a broker that
was not told it is under test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.storage import FaultsNotAllowed, check_fault_environment, faults

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACKBUS_FAULTS", raising=False)
    monkeypatch.delenv("ACKBUS_FAULTS_ALLOWED", raising=False)
    monkeypatch.setattr(faults, "_env_loaded", False)
    monkeypatch.setattr(faults, "_active", {})


def test_the_variable_alone_arms_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKBUS_FAULTS", "wal.fsync_error")
    assert faults.active() == {}
    faults.hit("wal.fsync_error")  # no OSError: not armed


def test_the_variable_arms_points_when_tests_allow_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKBUS_FAULTS", "wal.fsync_error:1")
    monkeypatch.setenv("ACKBUS_FAULTS_ALLOWED", "1")
    assert faults.active() == {"wal.fsync_error": (0, 1)}
    with pytest.raises(OSError):
        faults.hit("wal.fsync_error")


def test_check_environment_refuses_the_variable_without_permission() -> None:
    check_fault_environment({})  # nothing set: fine
    with pytest.raises(FaultsNotAllowed, match="ACKBUS_FAULTS_ALLOWED=1"):
        check_fault_environment({"ACKBUS_FAULTS": "wal.after_write"})
    check_fault_environment({"ACKBUS_FAULTS": "wal.after_write", "ACKBUS_FAULTS_ALLOWED": "1"})
    with pytest.raises(ValueError, match="unknown fault point"):
        check_fault_environment({"ACKBUS_FAULTS": "wal.typo", "ACKBUS_FAULTS_ALLOWED": "1"})


def test_a_broker_started_with_fault_points_but_no_permission_refuses_to_start(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("ACKBUS_FAULTS_ALLOWED", None)
    env["ACKBUS_FAULTS"] = "wal.after_write"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-m", "broker", "--port", "0", "--data-dir", str(tmp_path / "data")],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "ACKBUS_FAULTS" in result.stderr and "test-only" in result.stderr
    assert not (tmp_path / "data").exists()  # refused before touching anything

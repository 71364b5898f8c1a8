"""Crash tests with real processes: SIGKILL at each fault point, then recover."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.storage import read_latest_checkpoint

RecoverAll = Callable[..., Any]

SCRIPT = Path(__file__).with_name("crash_writer.py")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_writer(*args: object, faults: str | None = None) -> tuple[int, list[list[str]]]:
    env = dict(os.environ)
    env.pop("ACKBUS_FAULTS", None)
    if faults:
        env["ACKBUS_FAULTS"] = faults
        env["ACKBUS_FAULTS_ALLOWED"] = "1"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard, not a performance assertion
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"writer failed ({proc.returncode}):\n{proc.stderr}")
    return proc.returncode, [line.split() for line in proc.stdout.splitlines()]


def payload_for(lsn: int) -> bytes:
    return b"crash-test-%d" % lsn


def max_durable(lines: list[list[str]]) -> int:
    return max((int(words[1]) for words in lines if words[0] == "durable"), default=0)


def check_log(recover_all: RecoverAll, data_dir: Path, durable: int) -> int:
    recovery, records = recover_all(data_dir)
    lsns = [lsn for lsn, _, _ in records]
    assert lsns == list(range(1, len(lsns) + 1))
    assert len(lsns) >= durable, "a record reported durable is missing"
    for lsn, rtype, payload in records:
        assert (rtype, payload) == (lsn % 256, payload_for(lsn))
    return int(recovery.next_lsn)


@pytest.mark.parametrize(
    "fault",
    [
        "wal.after_write@3",
        "wal.before_fsync@3",
        "wal.after_fsync@3",
        "wal.after_segment_create@1",
        "wal.after_write",
    ],
)
def test_sigkill_at_a_wal_fault_point(tmp_path: Path, fault: str, recover_all: RecoverAll) -> None:
    code, lines = run_writer("wal", tmp_path, 30, 20, faults=fault)
    assert code == -signal.SIGKILL, lines
    assert ["done"] not in lines
    durable = max_durable(lines)
    next_lsn = check_log(recover_all, tmp_path, durable)

    # A restarted writer continues the log where recovery left it.
    code, lines = run_writer("wal", tmp_path, 5, 20)
    assert code == 0 and lines[-1] == ["done"]
    assert lines[0] == ["start", str(next_lsn)]
    check_log(recover_all, tmp_path, max_durable(lines))


def test_fsync_errors_from_the_environment_take_the_failure_path(
    tmp_path: Path, recover_all: RecoverAll
) -> None:
    code, lines = run_writer("wal", tmp_path, 10, 5, faults="wal.fsync_error@2:1")
    assert code == 0 and lines[-1] == ["done"]
    failed = [words for words in lines if words[0] == "failed"]
    assert failed == [["failed", "11", "15"]]
    assert ["recovered"] in lines
    durable = [int(words[1]) for words in lines if words[0] == "durable"]
    assert not any(11 <= lsn <= 15 for lsn in durable)
    recovery, records = recover_all(tmp_path)
    lsns = [lsn for lsn, _, _ in records]
    assert lsns == [n for n in range(1, 51) if not 11 <= n <= 15]


@pytest.mark.parametrize(
    ("fault", "survivor"),
    [
        ("checkpoint.after_tmp_write", "old"),
        ("checkpoint.before_rename", "old"),
        # renamed but the directory not fsynced: after kill -9 (not power loss) the new
        # name is visible, and the new file is whole because it was fsynced first
        ("checkpoint.after_rename", "new"),
    ],
)
def test_sigkill_while_writing_a_checkpoint(tmp_path: Path, fault: str, survivor: str) -> None:
    code, _ = run_writer("checkpoint", tmp_path, 10, "old")
    assert code == 0
    code, _ = run_writer("checkpoint", tmp_path, 20, "new", faults=fault)
    assert code == -signal.SIGKILL
    loaded = read_latest_checkpoint(tmp_path)
    assert loaded is not None
    lsn, records = loaded
    expected_lsn = 10 if survivor == "old" else 20
    assert lsn == expected_lsn
    assert list(records) == [(1, survivor.encode() + b"-%d" % n) for n in range(100)]
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path / "checkpoint"))

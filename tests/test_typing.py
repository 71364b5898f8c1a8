"""The packages type-check under ``mypy --strict`` (the style guide's aim), so an
annotation that lies fails the suite instead of misleading the next reader."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_broker_and_client_pass_mypy_strict(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path), "broker", "client"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr

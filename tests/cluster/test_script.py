"""``scripts/cluster up N`` / ``down``: a private etcd and N nodes on loopback, stopped
by the PIDs it wrote."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.broker import ROOT, request
from tests.support.etcd import require_etcd

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (not yet reaped by its parent, which has exited) counts as ended
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_up_starts_etcd_and_nodes_and_down_stops_them(tmp_path: Path) -> None:
    require_etcd()
    script = str(ROOT / "scripts" / "cluster")
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    up = subprocess.run([script, "up", "2", "--dir", str(tmp_path), "--ttl", "3"], capture_output=True, text=True, timeout=120, env=env)
    pids: list[int] = [int(p) for p in re.findall(r"pid (\d+)", up.stdout)]
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        nodes = re.findall(r"^(node-\d) http://127\.0\.0\.1:(\d+) pid (\d+)$", up.stdout, re.M)
        assert [n for n, _port, _pid in nodes] == ["node-1", "node-2"] and len(pids) == 3
        port = int(nodes[0][1])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            status, body = request(port, "GET", "/cluster")
            if status == 200 and [n["alive"] for n in body["nodes"]] == [True, True]:
                break
            time.sleep(0.1)
        assert [n["name"] for n in body["nodes"]] == ["node-1", "node-2"], body
    finally:
        down = subprocess.run([script, "down", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120, env=env)
        assert down.returncode == 0, down.stderr
    assert not list(tmp_path.glob("*.pid"))
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)

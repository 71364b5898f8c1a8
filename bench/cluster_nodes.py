"""The pieces every part of the cluster benchmark shares (``bench.cluster``,
``bench.cluster_quorum``): its sizes, a private cluster started with ``scripts/cluster
up`` and stopped by PID, HTTP calls to a node, and the check that a step ran clean."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["FULL", "QUICK", "ROOT", "BenchFailed", "Cluster", "ClusterParams"]

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class ClusterParams:
    """Sizes of one cluster benchmark (full, or ``--quick``)."""

    duration_s: float = 5.0  # each scale step's publishing time
    window: int = 500  # unconfirmed publishes per publisher
    forward_count: int = 20_000  # messages published, then consumed, per forwarding path
    prefetch: int = 500
    ready_timeout_s: float = 60.0
    slack_s: float = 120.0


FULL = ClusterParams()
QUICK = ClusterParams(duration_s=0.5, window=100, forward_count=500, prefetch=100)



def _request(url: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


class Cluster:
    """``scripts/cluster up N`` in a temporary directory; stopped by ``down``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.dir = Path(tempfile.mkdtemp(prefix="ackbus-bench-cluster-"))
        self.urls: list[str] = []
        self.pids: list[int] = []

    def __enter__(self) -> Cluster:
        # The nodes run on this interpreter, from this tree: from a compiled build's tree
        # (.build/compiled/<key>, which has no .venv of its own) they are compiled too.
        done = subprocess.run(
            [str(ROOT / "scripts" / "cluster"), "up", str(self.count), "--dir", str(self.dir)],
            capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHON": sys.executable},
        )
        for line in done.stdout.splitlines():  # "node-1 http://127.0.0.1:PORT pid PID"
            parts = line.split()
            if len(parts) == 4 and parts[0].startswith("node-"):
                self.urls.append(parts[1])
                self.pids.append(int(parts[3]))
        if done.returncode != 0 or len(self.urls) != self.count:
            self.__exit__()
            raise RuntimeError(f"scripts/cluster up {self.count} failed: {done.stderr.strip()[-500:]}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every node sees every other alive
            views = [_request(url, "GET", "/cluster") for url in self.urls]
            if all(sum(n["alive"] for n in v["nodes"]) == self.count for v in views):
                return self
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("the nodes did not all see one another within 30 s")

    def __exit__(self, *exc: object) -> None:
        """Stop the nodes and etcd (by the PIDs in the directory), then remove it."""
        subprocess.run([str(ROOT / "scripts" / "cluster"), "down", "--dir", str(self.dir)],
                       capture_output=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
        shutil.rmtree(self.dir, ignore_errors=True)


class BenchFailed(Exception):
    """A step's figures cannot be trusted: a client reconnected, resent or failed, or a
    queue does not hold what was confirmed into it."""


def _check_clean(results: Sequence[dict[str, Any]]) -> None:
    bad = [r for r in results if r.get("reconnects") or r.get("resent") or r.get("failed")]
    if bad:
        raise BenchFailed(f"a client reconnected, resent or failed: {bad}")



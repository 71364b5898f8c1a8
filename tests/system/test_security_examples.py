"""docs/security.md's permission example for a worker does what its comment says: the
``users add worker`` line, run as written, makes a user that consumes the queue
``jobs`` and publishes to the exchange ``results`` (and may not publish through the
default exchange, nor declare anything)."""

from __future__ import annotations

import base64
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import ROOT, BrokerProcess

pytestmark = pytest.mark.slow

SECURITY_MD = ROOT / "docs" / "security.md"


def worker_example() -> tuple[str, list[str]]:
    """The comment above the ``users add worker`` line, and the line's words."""
    text = SECURITY_MD.read_text()
    match = re.search(r"((?:^# .*\n)+)(python -m broker users add worker .*)$", text, flags=re.M)
    assert match, "no 'users add worker' example in docs/security.md"
    comment = " ".join(line[2:] for line in match[1].splitlines())
    return comment, shlex.split(match[2])


def users(data: Path, *argv: str, password: str) -> None:
    """``python -m broker users ARGV...`` on ``data`` (the password on stdin)."""
    done = subprocess.run([sys.executable, "-m", "broker", "users", "--data-dir", str(data), *argv,
                           "--password-stdin"],
                          input=password + "\n", capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_the_worker_example_does_what_it_says(tmp_path: Path) -> None:
    comment, argv = worker_example()
    assert "publishes to the exchange results" in comment and "consumes the queue jobs" in comment, comment
    assert argv[:5] == ["python", "-m", "broker", "users", "add"]
    data = tmp_path / "data"
    users(data, "add", "admin", "--tags", "administrator",
          "--configure", ".*", "--write", ".*", "--read", ".*", password="admin-pw")
    users(data, *argv[4:], password="worker-pw")  # (the line as written, after "users")
    admin, worker = basic("admin", "admin-pw"), basic("worker", "worker-pw")
    with BrokerProcess(data) as broker:
        # what the comment says an administrator declared
        for path in ("/queues/jobs", "/queues/results.store", "/exchanges/results"):
            assert broker.request("PUT", path, {}, headers=admin)[0] == 201, path
        assert broker.request("POST", "/bindings", {"exchange": "results", "queue": "results.store"},
                              headers=admin)[0] == 201
        assert broker.request("POST", "/exchanges/amq.default/publish?routing_key=jobs", b"job 1",
                              headers=admin)[0] == 200
        # the worker consumes jobs...
        status, got = broker.request("POST", "/queues/jobs/get", headers=worker)
        assert status == 200 and [m["body"] for m in got["messages"]] == ["job 1"]
        lease = got["messages"][0]["lease_id"]
        # ...publishes its result to the exchange results...
        status, body = broker.request("POST", "/exchanges/results/publish", b"result 1", headers=worker)
        assert (status, body) == (200, {"confirm": "ack", "routed": 1})
        assert broker.request("POST", "/queues/jobs/ack", {"lease_ids": [lease]}, headers=worker)[0] == 200
        # ...and nothing else: not through the default exchange, no declarations
        assert broker.request("POST", "/exchanges/amq.default/publish?routing_key=results.store", b"x",
                              headers=worker)[0] == 403
        assert broker.request("PUT", "/queues/mine", {}, headers=worker)[0] == 403
        status, queue = broker.request("GET", "/queues/results.store", headers=admin)
        assert queue["messages_ready"] == 1

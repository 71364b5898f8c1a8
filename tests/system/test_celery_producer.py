"""A producer process ends once its messages are sent: a Celery one, and a script of
the blocking client that leaves its blocks open. Both used to hang at interpreter exit
(the blocks closed by the garbage collector after the client's loop thread, a daemon,
was frozen)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.broker import ROOT, BrokerProcess

pytestmark = pytest.mark.slow

EXIT_WITHIN_S = 5.0


# Opens a connection and a channel, publishes, and never leaves either block.
BLOCKING_SCRIPT = """
import contextlib, sys, time
import client
stack = contextlib.ExitStack()
conn = stack.enter_context(client.connect_blocking(sys.argv[1]))
conn.declare_queue("left-open")
ch = stack.enter_context(conn.channel())
ch.publish("", "left-open", b"hello")
print(f"sent {time.time()}", flush=True)
"""


def run_producer(argv: list[str], environ: dict[str, str]) -> str:
    """Run a producer; check it ended cleanly within EXIT_WITHIN_S of its ``sent``
    line; return its stderr."""
    proc = subprocess.Popen(argv, env=environ, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    ended = time.time()
    stderr = err.decode(errors="replace")[-2000:]
    sent = [line for line in out.decode().splitlines() if line.startswith("sent ")]
    assert sent, (out, stderr)
    took = ended - float(sent[0].split()[1])
    assert took < EXIT_WITHIN_S, f"exited {took:.1f} s after sending; stderr: {stderr}"
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    return stderr


@pytest.mark.parametrize("count", [1, 50])
def test_celery_producer_exits_after_sending(tmp_path: Path, count: int) -> None:
    pytest.importorskip("celery")
    with BrokerProcess(tmp_path / "data") as broker:
        environ = dict(os.environ, PYTHONPATH=str(ROOT), ACKBUS_URL=broker.url,
                       CELERY_JOURNAL=str(tmp_path / "journal.txt"))
        run_producer([sys.executable, "-m", "tests.system.celery_producer", str(count)], environ)
        status, queue = broker.request("GET", "/queues/ackbus-celery-test")
        assert status == 200
        assert queue["messages_ready"] == count


def test_blocking_script_with_open_blocks_exits(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data") as broker:
        environ = dict(os.environ, PYTHONPATH=str(ROOT))
        run_producer([sys.executable, "-c", BLOCKING_SCRIPT, broker.url], environ)
        status, queue = broker.request("GET", "/queues/left-open")
        assert status == 200
        assert queue["messages_ready"] == 1

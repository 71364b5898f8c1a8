"""Ctrl-C in a blocking-client script ends it at once with one clean
``KeyboardInterrupt``: while a consumer waits for messages, and while the client's
loop thread is still starting (which used to leave the script joining that thread
forever, so that only a second Ctrl-C ended it, with two chained tracebacks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import ROOT, BrokerProcess

pytestmark = pytest.mark.slow

# Waits for messages on an empty queue, forever.
CONSUMER = """
import sys
import client
with client.connect_blocking(sys.argv[1], backend=sys.argv[2]) as conn:
    with conn.channel() as ch:
        ch.declare_queue("idle")
        with ch.consume("idle", prefetch=10) as messages:
            print("consuming", flush=True)
            for msg in messages:
                msg.ack()
"""

# Interrupted while the loop thread starts: the loop is made slow to start, and the
# script sends itself SIGINT meanwhile.
STARTING = """
import os, signal, sys, threading, time
import anyio._core._eventloop as eventloop
import client

backend_of = eventloop.get_async_backend

def slow_backend(*args, **kwargs):
    time.sleep(0.5)
    return backend_of(*args, **kwargs)

eventloop.get_async_backend = slow_backend
threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
print("starting", flush=True)
with client.connect_blocking(sys.argv[1], backend=sys.argv[2]) as conn:
    print("connected", flush=True)
"""


def interrupt(script: str, url: str, backend: str, *, ready: str, signal_it: bool) -> tuple[str, str]:
    """Run ``script``, wait for its ``ready`` line, SIGINT it (unless it does so
    itself); return its stdout and stderr, checked: ended within 10 s, by the
    interrupt, with exactly one KeyboardInterrupt traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, url, backend], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        assert first.strip() == ready, first
        if signal_it:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running 10 s after the interrupt: {err.decode()[-2000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = err.decode(errors="replace")
    assert proc.returncode in (-signal.SIGINT, 130), (proc.returncode, stderr[-2000:])
    assert stderr.count("KeyboardInterrupt") == 1, stderr[-3000:]
    assert "During handling" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    return out.decode(), stderr


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_ctrl_c_while_consuming(tmp_path: Path, backend: str) -> None:
    with BrokerProcess(tmp_path / "data") as broker:
        interrupt(CONSUMER, broker.url, backend, ready="consuming", signal_it=True)
        status, queue = broker.request("GET", "/queues/idle")
        assert status == 200 and queue["consumers"] == 0


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_ctrl_c_while_the_loop_starts(backend: str) -> None:
    out, _ = interrupt(STARTING, "http://127.0.0.1:1", backend, ready="starting", signal_it=False)
    assert "connected" not in out

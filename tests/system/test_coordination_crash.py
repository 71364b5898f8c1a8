"""Locks and schedules across kill -9 of the broker and of lock holders (real
subprocesses): held locks stay held until their expiry and tokens only grow across
restarts; a killed holder's lock frees at its expiry; two processes racing for a lock
never overlap; a schedule firing every second neither loses nor repeats a tick when the
broker is killed around its ticks."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.broker import ROOT, STRESS_ARGS, BrokerProcess

pytestmark = pytest.mark.slow


def cli(broker: BrokerProcess, *args: str) -> subprocess.Popen[bytes]:
    """``ackbus ARGS`` in a new session (so that killpg reaches its command too); its
    stderr goes to a file beside the broker's log."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(broker.data_dir.parent / "cli-stderr.log", "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "client", "--url", broker.url, *args],
            env=env, cwd=str(ROOT), start_new_session=True, stdout=subprocess.DEVNULL, stderr=err,
        )


def wait_for(condition, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError("condition not met")


def test_held_locks_and_tokens_survive_kill9(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", args=STRESS_ARGS)
    broker.start()
    try:
        tokens = []
        for i in range(20):
            status, lock = broker.request("POST", f"/locks/l{i % 3}/acquire", {"owner": "w", "ttl_s": 600})
            assert status == 200, lock
            tokens.append(lock["token"])
            if i % 3:
                assert broker.request("POST", f"/locks/l{i % 3}/release", {"owner": "w", "token": lock["token"]})[0] == 200
        held = broker.request("GET", "/locks/l0")[1]
        assert held["owner"] == "w"
        for n in range(2):
            broker.kill()
            broker.start()
            after = broker.request("GET", "/locks/l0")[1]
            assert (after["owner"], after["token"], after["expires_at"]) == (held["owner"], held["token"], held["expires_at"])
            status, body = broker.request("POST", "/locks/l0/acquire", {"owner": "other"})
            assert status == 409 and body["lock"]["owner"] == "w"
            assert broker.request("GET", "/locks/l1")[1]["held"] is False
            status, lock = broker.request("POST", f"/locks/fresh{n}/acquire", {"owner": "x", "ttl_s": 1})
            assert status == 200 and lock["token"] > max(tokens)
            tokens.append(lock["token"])
        # the holder goes on with its token after the restarts
        status, _ = broker.request("POST", "/locks/l0/refresh", {"owner": "w", "token": held["token"]})
        assert status == 200
    finally:
        broker.stop()


def test_a_killed_holder_loses_its_lock_at_expiry(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    holder = None
    try:
        holder = cli(broker, "lock", "job", "--ttl", "3", "--owner", "holder", "--", "sleep", "60")
        wait_for(lambda: broker.request("GET", "/locks/job")[1]["owner"] == "holder")
        os.killpg(holder.pid, signal.SIGKILL)  # the CLI and its command, at once
        holder.wait(timeout=30)
        status, body = broker.request("POST", "/locks/job/acquire", {"owner": "next"})
        assert status == 409 and body["lock"]["owner"] == "holder"  # still held: no refresh, no release
        status, lock = broker.request("POST", "/locks/job/acquire", {"owner": "next", "wait_s": 30})
        assert status == 200 and lock["owner"] == "next"
    finally:
        if holder is not None and holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
        broker.stop()


def test_two_processes_racing_for_a_lock_never_overlap(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    trace = tmp_path / "trace"
    script = (
        "import os, sys, time\n"
        f"p = {str(trace)!r}\n"
        "me = sys.argv[1] + ':' + os.environ['ACKBUS_LOCK_TOKEN']\n"
        "open(p, 'a').write('in ' + me + '\\n')\n"
        "time.sleep(0.1)\n"  # the lock holder's work: a window for an overlap to show
        "open(p, 'a').write('out ' + me + '\\n')\n"
    )
    try:
        procs = []
        for worker in ("a", "b"):
            for _ in range(4):
                procs.append(cli(broker, "lock", "race", "--wait", "60", "--ttl", "5", "--", sys.executable, "-c", script, worker))
        for proc in procs:
            assert proc.wait(timeout=120) == 0, (tmp_path / "cli-stderr.log").read_text()
        lines = trace.read_text().splitlines()
        assert len(lines) == 16
        tokens = []
        for enter, leave in zip(lines[::2], lines[1::2]):
            assert enter.startswith("in ") and leave == "out " + enter[3:], lines  # never two inside
            tokens.append(int(enter.rsplit(":", 1)[1]))
        assert tokens == sorted(tokens) and len(set(tokens)) == 8
    finally:
        broker.stop()


def tick_times(broker: BrokerProcess) -> list[float]:
    ticks = [m["properties"]["headers"]["x-schedule-tick"] for m in broker.drain("ticks")]
    return [datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() for t in ticks]


@pytest.mark.parametrize("policy", ["all", "latest"])
def test_a_schedule_firing_every_second_across_kill9(tmp_path: Path, seeded_random: random.Random, policy: str) -> None:
    broker = BrokerProcess(tmp_path / "data", args=STRESS_ARGS)
    broker.start()
    try:
        assert broker.request("PUT", "/queues/ticks", {})[0] == 201
        status, info = broker.request(
            "PUT", "/schedules/beat",
            {"routing_key": "ticks", "body": "beat", "interval_s": 1, "missed": policy, "max_missed": 1000},
        )
        assert status == 200, info
        downs = []
        for _ in range(4):
            time.sleep(seeded_random.uniform(1.0, 2.5))  # kill -9 just before, at or after a tick
            broker.kill()
            down_at = time.time()
            broker.start()
            downs.append((down_at, time.time()))
        time.sleep(2.5)  # pacing: a few ticks after the last restart
        broker.kill()  # (the drain must not race the next tick)
        down_at = time.time()
        broker.start(timeout_s=60)
        # A tick due while it was down collapses too (under "latest"): when the start
        # takes over a second, two were due then, and the one fired is the later.
        downs.append((down_at, time.time()))
        status, _ = broker.request("POST", "/schedules/beat/pause")
        assert status == 200
        ticks = tick_times(broker)
    finally:
        broker.stop()
    assert len(ticks) == len(set(ticks)), "a tick fired twice"
    ticks.sort()
    start = ticks[0]
    steps = [round(b - a, 3) for a, b in zip(ticks, ticks[1:])]
    assert all(step >= 1 and step == int(step) for step in steps), steps
    if policy == "all":
        assert all(step == 1 for step in steps), f"a tick was lost: {steps}"
    else:
        # a gap only where the broker was down: the ticks due then collapse into one
        for a, b in zip(ticks, ticks[1:]):
            if b - a > 1:
                assert any(a < up and down - 1 < b for down, up in downs), (a - start, b - start)
    assert len(ticks) >= 8


def test_metrics_count_locks_and_ticks(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        broker.request("PUT", "/queues/m", {})
        broker.request("PUT", "/schedules/m", {"routing_key": "m", "interval_s": 0.5})
        broker.request("POST", "/locks/l/acquire", {"owner": "a"})
        wait_for(lambda: broker.request("GET", "/schedules/m")[1]["ticks_fired"] >= 3)
        status, text = broker.request("GET", "/metrics")
        assert status == 200
        lines = dict(line.rsplit(" ", 1) for line in text.decode().splitlines() if line and not line.startswith("#"))
        assert float(lines['ackbus_schedule_ticks_total{schedule="m"}']) >= 3
        assert float(lines["ackbus_schedule_tick_lateness_seconds_count"]) >= 3
        assert float(lines["ackbus_locks_held"]) == 1 and float(lines["ackbus_lock_acquisitions_total"]) == 1
    finally:
        broker.stop()


def test_sigterm_to_ackbus_lock_reaches_the_command_and_releases(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    started = tmp_path / "started"
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        f"open({str(started)!r}, 'w').close()\n"
        "time.sleep(60)\n"  # a command that outlives the test unless stopped
    )
    proc = None
    try:
        proc = cli(broker, "lock", "job", "--owner", "me", "--", sys.executable, "-c", code)
        wait_for(started.exists)
        proc.send_signal(signal.SIGTERM)  # to ackbus only, as systemd's stop would
        assert proc.wait(timeout=30) == 7  # the command's own status
        assert broker.request("GET", "/locks/job")[1]["held"] is False
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        broker.stop()

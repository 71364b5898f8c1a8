"""Celery on ackbus: a real worker subprocess against a real broker subprocess, the
broker killed with SIGKILL in the middle and restarted; every task runs (at least
once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.support.broker import ROOT, BrokerProcess
from tests.support.wait import ConditionTimeout, wait_until_sync

pytest.importorskip("celery")
from celery import Celery  # noqa: E402

import client.kombu_transport  # noqa: E402,F401  (registers ackbus://)

pytestmark = pytest.mark.slow

N_BEFORE = 150
N_AFTER = 50


def _journal(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _wait_for(predicate, timeout_s: float, what) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.05)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[BrokerProcess, dict[str, str], Path]]:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    journal = tmp_path / "journal.txt"
    environ = dict(os.environ, PYTHONPATH=str(ROOT), ACKBUS_URL=broker.url, CELERY_JOURNAL=str(journal))
    try:
        yield broker, environ, journal
    finally:
        broker.stop()


def _producer(broker: BrokerProcess) -> Celery:
    """A Celery client of ``broker`` (the tasks are named, not imported)."""
    app = Celery("producer", broker=f"ackbus://127.0.0.1:{broker.port}//")
    app.conf.task_default_queue = "ackbus-celery-test"
    return app


def _close_producer(app: Celery) -> None:
    """Close what ``app`` opened: its producers and its connections, each an ackbus
    channel with its loop thread (``Celery.close`` only drops the pool, leaving
    them, and their reconnecting, running after the test)."""
    try:
        app.amqp.producer_pool.force_close_all()
        app.pool.force_close_all()
    finally:
        app.close()


def _threads_left(before: set[int]) -> list[str]:
    return [t.name for t in threading.enumerate() if t.ident not in before]


def _start_worker(environ: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # (the child keeps its own descriptor)
        return _popen(environ, out)


def _popen(environ: dict[str, str], out: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.system.celery_app", "worker", "--pool", "threads",
         "--concurrency", "4", "--without-mingle", "--without-gossip", "--without-heartbeat",
         "--loglevel", "INFO"],
        env=environ, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
    )


def _stop_worker(worker: subprocess.Popen[bytes]) -> int:
    worker.send_signal(signal.SIGTERM)  # warm shutdown: finish running tasks, ack them
    try:
        return worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        raise


def test_every_task_runs_across_a_broker_kill(
    env: tuple[BrokerProcess, dict[str, str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, environ, journal = env
    monkeypatch.setenv("CELERY_JOURNAL", str(journal))
    threads_before = {t.ident for t in threading.enumerate()}
    app = _producer(broker)
    for i in range(N_BEFORE):
        app.send_task("record", (i,))  # returns once the broker confirmed it
    app.send_task("flaky", (1,))

    worker = _start_worker(environ, tmp_path / "worker.log")
    try:
        _wait_for(lambda: len(_journal(journal)) >= 40, 60, "the first tasks to run")
        broker.kill()  # kill -9 with tasks queued, running and unacked
        broker.start()
        for i in range(N_BEFORE, N_BEFORE + N_AFTER):
            app.send_task("record", (i,))
        expected = {str(i) for i in range(N_BEFORE + N_AFTER)} | {"retried-1"}
        _wait_for(lambda: expected <= set(_journal(journal)), 120,
                  lambda: f"every task to run; missing {sorted(expected - set(_journal(journal)))[:20]}, "
                  f"queue {broker.request('GET', '/queues/ackbus-celery-test')[1]}; worker log: "
                  + (tmp_path / "worker.log").read_text()[-3000:])
        # Nothing is left behind in the broker once the worker is idle.
        _wait_for(lambda: broker.request("GET", "/queues/ackbus-celery-test")[1]["messages"] == 0, 30,
                  "the queue to drain")
    finally:
        code = _stop_worker(worker)
        _close_producer(app)
    assert code == 0, (tmp_path / "worker.log").read_text()[-3000:]
    # nothing the test started outlives it (the client's loop threads, kombu's reconnects)
    try:
        wait_until_sync(lambda: not _threads_left(threads_before), 10)
    except ConditionTimeout:
        pytest.fail(f"threads still running after the test: {_threads_left(threads_before)}")
    ran = _journal(journal)
    # at-least-once: every task ran; a task whose ack the crash lost may run twice
    assert set(ran) == expected
    assert len(ran) <= len(expected) + 60


def test_warm_shutdown_loses_no_task(
    env: tuple[BrokerProcess, dict[str, str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, environ, journal = env
    monkeypatch.setenv("CELERY_JOURNAL", str(journal))
    app = _producer(broker)
    for i in range(100):
        app.send_task("record", (i,))
    _close_producer(app)
    worker = _start_worker(environ, tmp_path / "worker1.log")
    _wait_for(lambda: len(_journal(journal)) >= 20, 60, "the first tasks to run")
    assert _stop_worker(worker) == 0
    ran_first = set(_journal(journal))
    status, queue = broker.request("GET", "/queues/ackbus-celery-test")
    # what the first worker did not run is back in the queue, ready (nothing held unacked)
    assert queue["messages_unacked"] == 0
    assert queue["messages_ready"] + len(ran_first) >= 100
    worker = _start_worker(environ, tmp_path / "worker2.log")
    try:
        _wait_for(lambda: set(_journal(journal)) == {str(i) for i in range(100)}, 60, "the rest to run")
    finally:
        assert _stop_worker(worker) == 0

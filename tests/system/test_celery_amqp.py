"""Celery on ackbus through its default transport, ``amqp://`` (kombu on py-amqp), with
no ackbus code in the worker: tasks, a retry, and every task run (at least once) across
a ``kill -9`` of the broker and its restart on the same ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.broker import ROOT, BrokerProcess, free_port

pytest.importorskip("celery")
from celery import Celery  # noqa: E402

pytestmark = pytest.mark.slow

N_BEFORE = 100
N_AFTER = 30
QUEUE = "ackbus-celery-amqp-test"


def _journal(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _wait_for(predicate, timeout_s: float, what) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.05)


def _stop_worker(worker: subprocess.Popen[bytes]) -> int:
    worker.send_signal(signal.SIGTERM)  # warm shutdown
    try:
        return worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        raise


def _producer(url: str) -> Celery:
    app = Celery("producer", broker=url)
    app.conf.task_default_queue = QUEUE
    app.conf.broker_transport_options = {"confirm_publish": True}
    return app


def test_every_task_runs_across_a_broker_kill(tmp_path: Path) -> None:
    amqp_port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{amqp_port}//"
    broker = BrokerProcess(tmp_path / "data", env={"ACKBUS_AMQP_PORT": str(amqp_port)})
    broker.start()
    journal = tmp_path / "journal.txt"
    environ = dict(os.environ, PYTHONPATH=str(ROOT), ACKBUS_AMQP_URL=url, CELERY_JOURNAL=str(journal))
    log = tmp_path / "worker.log"
    app = _producer(url)
    worker = None
    try:
        for i in range(N_BEFORE):
            app.send_task("record", (i,))
        app.send_task("flaky", (1,))
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.system.celery_amqp_app", "worker", "--pool", "threads",
                 "--concurrency", "4", "--without-mingle", "--without-gossip", "--without-heartbeat",
                 "--loglevel", "INFO"],
                env=environ, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            )
        _wait_for(lambda: len(_journal(journal)) >= 30, 60, lambda: "the first tasks to run; " + log.read_text()[-2000:])
        broker.kill()  # kill -9 with tasks queued, running and unacked
        broker.start()
        app.close()
        app = _producer(url)
        for i in range(N_BEFORE, N_BEFORE + N_AFTER):
            app.send_task("record", (i,))
        expected = {str(i) for i in range(N_BEFORE + N_AFTER)} | {"retried-1"}
        _wait_for(lambda: expected <= set(_journal(journal)), 120,
                  lambda: f"every task to run; missing {sorted(expected - set(_journal(journal)))[:20]}; worker log: "
                  + log.read_text()[-3000:])
        _wait_for(lambda: broker.request("GET", f"/queues/{QUEUE}")[1]["messages"] == 0, 30, "the queue to drain")
    finally:
        code = _stop_worker(worker) if worker is not None else 0
        app.close()
        broker.stop()
    assert code == 0, log.read_text()[-3000:]
    ran = _journal(journal)
    assert set(ran) == expected
    assert len(ran) <= len(expected) + 60


def test_a_worker_with_celerys_defaults_answers_control_and_runs_tasks(tmp_path: Path) -> None:
    """Mingle, gossip, heartbeats and remote control on (Celery's defaults): their
    fanout and topic exchanges, auto-delete and expiring queues all work."""
    amqp_port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{amqp_port}//"
    broker = BrokerProcess(tmp_path / "data", env={"ACKBUS_AMQP_PORT": str(amqp_port)})
    broker.start()
    journal = tmp_path / "journal.txt"
    environ = dict(os.environ, PYTHONPATH=str(ROOT), ACKBUS_AMQP_URL=url, CELERY_JOURNAL=str(journal))
    log = tmp_path / "worker.log"
    app = _producer(url)
    worker = None
    try:
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.system.celery_amqp_app", "worker", "--pool", "threads",
                 "--concurrency", "2", "--loglevel", "INFO"],
                env=environ, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            )
        replies: list[object] = []
        _wait_for(lambda: bool(replies.extend(app.control.ping(timeout=1)) or replies), 60,
                  lambda: "a ping answer; " + log.read_text()[-2000:])
        assert "pong" in str(replies)
        for i in range(10):
            app.send_task("record", (i,))
        _wait_for(lambda: len(_journal(journal)) >= 10, 60, lambda: "the tasks to run; " + log.read_text()[-2000:])
    finally:
        code = _stop_worker(worker) if worker is not None else 0
        app.close()
        broker.stop()
    assert code == 0, log.read_text()[-3000:]
    assert sorted(_journal(journal), key=int) == [str(i) for i in range(10)]
    assert "Traceback" not in broker.log_path.read_text()

"""docs/celery.md as a user follows it: its ``tasks.py`` written out, the worker
started with its command line, and its caller snippet run; the result comes back
through the ``rpc://`` result backend, and the reply queue keeps no message behind
(kombu never acks a result it consumed with ``no_ack``; the transport does), and goes
away once its reader is gone (an auto-delete queue read with REST gets)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.broker import ROOT, BrokerProcess

pytest.importorskip("celery")

pytestmark = pytest.mark.slow

CELERY_MD = ROOT / "docs" / "celery.md"


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block of ``text``, in order."""
    return re.findall(r"^```([a-z]*)\n(.*?)^```", text, flags=re.S | re.M)


def celery_doc_parts(port: int) -> tuple[str, list[str], str]:
    """docs/celery.md's tasks.py, worker command line and caller snippet, with the
    broker's port in place of 8080."""
    blocks = [(lang, code.replace(":8080", f":{port}")) for lang, code in fenced_blocks(CELERY_MD.read_text())]
    (tasks,) = [code for lang, code in blocks if lang == "python" and code.startswith("# tasks.py")]
    (worker,) = [code for lang, code in blocks if lang == "sh" and code.startswith("celery -A tasks worker")]
    (caller,) = [code for lang, code in blocks if lang == "python" and code.startswith("from tasks import")]
    argv = shlex.split(worker.strip())
    assert argv[0] == "celery"
    return tasks, [sys.executable, "-m", *argv], caller


def test_result_backend_as_documented(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data") as broker:
        tasks, worker_argv, caller = celery_doc_parts(broker.port)
        assert 'backend="rpc://"' in tasks
        (tmp_path / "tasks.py").write_text(tasks)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
        log = tmp_path / "worker.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(worker_argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            done = subprocess.run([sys.executable, "-c", caller], cwd=tmp_path, env=env,
                                  capture_output=True, timeout=60, check=False)
            assert done.returncode == 0, (done.stderr.decode()[-3000:], log.read_text()[-3000:])
            assert done.stdout.decode().split() == ["5"]
            # the result was taken and settled: the reply queue holds nothing, and goes
            # once its reader has been silent for auto_delete_grace_s (5 s by default)
            status, listing = broker.request("GET", "/queues")
            assert status == 200
            replies = [q for q in listing["queues"] if q["auto_delete"]]
            assert len(replies) <= 1, listing
            for reply in replies:
                assert (reply["messages_ready"], reply["messages_unacked"]) == (0, 0), reply
            deadline = time.monotonic() + 30
            while replies:
                assert time.monotonic() < deadline, f"the reply queue stayed: {replies}"
                time.sleep(0.2)
                listing = broker.request("GET", "/queues")[1]
                replies = [q for q in listing["queues"] if q["auto_delete"]]
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

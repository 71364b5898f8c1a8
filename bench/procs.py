"""Run client workers as separate processes, together, each under a timeout.

:func:`run_workers` starts every worker, waits until all of them printed ``READY``
(connected and declared), sends ``GO`` to all at once, and collects the ``RESULT``
line of each. A worker that is not ready, or not finished, in time is killed (by its
PID) and the whole step fails with :class:`WorkerFailed`, carrying the tail of its
stderr. Nothing is left running either way.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["ROOT", "WorkerFailed", "abort_workers", "code_root", "run_workers", "snapshot_code"]

ROOT = Path(__file__).resolve().parents[1]
_PACKAGES = ("broker", "client", "bench")
_code_root = ROOT


def code_root() -> Path:
    """Where broker and worker processes import ackbus from: the checkout, or the
    snapshot taken by :func:`snapshot_code`."""
    return _code_root


def snapshot_code(dest: Path) -> str:
    """Copy the packages into ``dest`` and run every later broker and worker from
    there, so that all runs of one invocation measure the same code even while the
    checkout is being edited. Returns a SHA-256 of the copied sources."""
    global _code_root
    digest = hashlib.sha256()
    for package in _PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for path in sorted((dest / package).rglob("*.py")):
            digest.update(str(path.relative_to(dest)).encode() + b"\0" + path.read_bytes())
    # Run from the compiled build's tree (docs/benchmarks.md, "The builds"): its
    # modules share one library mypyc puts beside the packages.
    for library in ROOT.glob("*__mypyc*"):
        shutil.copy2(library, dest / library.name)
    _code_root = dest
    return digest.hexdigest()

_MODULES = {"ackbus": "bench.worker_ackbus", "rabbitmq": "bench.worker_rabbitmq", "redis": "bench.worker_redis"}


class WorkerFailed(Exception):
    """A worker exited, failed or timed out; the message says which and why."""


# Workers running now, so that the run's watchdog (another thread) can end them.
_live: set[subprocess.Popen[str]] = set()
_live_lock = threading.Lock()


def abort_workers() -> None:
    """SIGKILL every worker running now (safe from another thread: a worker leaves
    ``_live`` before it is reaped, so its PID cannot have been reused)."""
    with _live_lock:
        for proc in _live:
            if proc.returncode is None:
                try:
                    proc.kill()
                except OSError:
                    pass


def _reader(name: int, stream: IO[str], lines: queue.Queue[tuple[int, str | None]]) -> None:
    for line in stream:
        lines.put((name, line.rstrip("\n")))
    lines.put((name, None))


def run_workers(
    side: str,
    specs: Sequence[dict[str, Any]],
    *,
    log_dir: Path,
    ready_timeout_s: float,
    run_timeout_s: float,
    go_order: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Run one worker per spec on ``side`` ("ackbus", "rabbitmq" or "redis"); return their results
    in spec order. ``go_order`` is the order GO is sent in (default: spec order), e.g.
    a consumer before its publisher.

    Raises:
        WorkerFailed: a worker did not get ready or finish in time, or exited without
            a result.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code_root()) + os.pathsep + env.get("PYTHONPATH", "")
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[str]] = []
    err_paths: list[Path] = []
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    try:
        for i, spec in enumerate(specs):
            err_path = log_dir / f"worker-{side}-{spec['op']}-{i}-{time.monotonic_ns()}.err"
            err_paths.append(err_path)
            with open(err_path, "w") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", _MODULES[side], json.dumps(spec)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    cwd=str(code_root()),
                    env=env,
                )
            procs.append(proc)
            with _live_lock:
                _live.add(proc)
            assert proc.stdout is not None
            threading.Thread(target=_reader, args=(i, proc.stdout, lines), daemon=True).start()

        results: dict[int, dict[str, Any]] = {}
        ready: set[int] = set()
        finished: set[int] = set()

        def pump(deadline: float, until: Any, what: str) -> None:
            while not until():
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    missing = [i for i in range(len(procs)) if i not in (ready if what == "ready" else results)]
                    raise WorkerFailed(
                        f"{side} worker(s) {missing} not {what} within the time limit"
                        + _tails(err_paths, missing)
                    )
                try:
                    i, line = lines.get(timeout=min(timeout, 0.5))
                except queue.Empty:
                    continue
                if line is None:
                    finished.add(i)
                    if i not in results:
                        procs[i].wait(timeout=10)
                        raise WorkerFailed(
                            f"{side} worker {i} ({specs[i]['op']}) exited with {procs[i].returncode} "
                            f"without a result" + _tails(err_paths, [i])
                        )
                elif line == "READY":
                    ready.add(i)
                elif line.startswith("RESULT "):
                    results[i] = json.loads(line[len("RESULT "):])

        pump(time.monotonic() + ready_timeout_s, lambda: len(ready) == len(procs), "ready")
        for i in go_order if go_order is not None else range(len(procs)):
            stdin = procs[i].stdin
            assert stdin is not None
            try:
                stdin.write("GO\n")
                stdin.flush()
            except OSError as exc:
                raise WorkerFailed(f"{side} worker {i} went away before GO: {exc}" + _tails(err_paths, [i])) from exc
        pump(time.monotonic() + run_timeout_s, lambda: len(results) == len(procs), "finished")
        for proc in procs:
            proc.wait(timeout=30)
        return [results[i] for i in range(len(procs))]
    finally:
        with _live_lock:
            _live.difference_update(procs)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            # stdout belongs to its reader thread, which ends at EOF now.
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass


def _tails(paths: Sequence[Path], which: Sequence[int], n: int = 15) -> str:
    out = []
    for i in which:
        try:
            text = paths[i].read_text(errors="replace").splitlines()[-n:]
        except OSError:
            continue
        if text:
            out.append(f"\n--- stderr of worker {i} ({paths[i].name}):\n" + "\n".join(text))
    return "".join(out)

"""``scripts/bench`` / ``python -m bench``: run the workloads, print and save the results.

Order of runs: for each workload, for each round, ackbus then (with ``--peer``)
RabbitMQ, Redis and/or the null AMQP peer — A B C A B C … — each run on a freshly started server that is stopped (by PID)
afterwards. Every step of a run has its own time limit, and a watchdog kills the
broker of a run that goes over the sum of them (the run then fails, the next goes on). Results go to ``bench-results/<timestamp>.json`` after every run, so an
interrupted benchmark keeps what it measured; the table goes to stdout (and to
``bench-results/<timestamp>.md``), the chart to ``docs/benchmarks.png`` with ``--plot``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from bench.cluster import run_cluster_bench
from bench.params import FULL, QUICK, Params
from bench.procs import ROOT, abort_workers, snapshot_code
from bench.server_nullamqp import NullAMQPServer
from bench.server_redis import RedisServer, ensure_redis
from bench.servers import AckbusServer, RabbitServer, cpu_seconds, ensure_rabbitmq
from bench.stats import (
    PEERS,
    SIDE_NAMES,
    markdown_table,
    parse_peers,
    peers_of,
    summarize,
    text_table,
)
from bench.workloads import WORKLOADS, Context, all_figures

__all__ = ["main"]


def _nothing_to_install(say: Any) -> None:
    """The null AMQP peer is part of the harness (pamqp is a dependency of ackbus)."""


# per peer: how to install it if missing, and its server
ENSURE = {"rabbitmq": ensure_rabbitmq, "redis": ensure_redis, "null": _nothing_to_install}
PEER_SERVERS: dict[str, type[RabbitServer] | type[RedisServer] | type[NullAMQPServer]] = {
    "rabbitmq": RabbitServer, "redis": RedisServer, "null": NullAMQPServer}


class Progress:
    """One status line on stderr: rewritten in place on a terminal (with a ticking
    clock), one line per change otherwise."""

    def __init__(self, total_runs: int, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.total = total_runs
        self.done = 0
        self.where = ""
        self.what = ""
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._width = 0
        if self.tty:
            threading.Thread(target=self._tick, daemon=True).start()

    def _line(self) -> str:
        elapsed = int(time.monotonic() - self.t0)
        return f"[{self.done}/{self.total} runs, {elapsed // 60}m{elapsed % 60:02d}s] {self.where}: {self.what}"

    def _render(self) -> None:
        line = self._line()
        if self.tty:
            cols = shutil.get_terminal_size((120, 20)).columns - 1
            line = line[:cols]
            self.stream.write("\r" + line.ljust(self._width) + "\r" + line)
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self.where:
                    self._render()

    def run(self, where: str) -> None:
        with self._lock:
            self.where, self.what = where, "starting the broker"
            self._render()

    def status(self, what: str) -> None:
        with self._lock:
            self.what = what
            self._render()

    def finished_run(self) -> None:
        with self._lock:
            self.done += 1

    def say(self, text: str) -> None:
        """Print a line of its own above the status line."""
        with self._lock:
            if self.tty and self._width:
                self.stream.write("\r" + " " * self._width + "\r")
                self._width = 0
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self.tty and self._width:
                self.stream.write("\r" + " " * self._width + "\r")
                self._width = 0
            self.where = ""
            self.stream.flush()


def machine_info(workdir: Path) -> dict[str, Any]:
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
        best = ""
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            if str(workdir).startswith(mount) and len(mount) > len(best):
                best = mount
                info["data_fs"] = f"{fstype} on {device} (mounted at {mount})"
    except OSError:
        pass
    return info


def git_state() -> dict[str, Any]:
    """The commit benchmarked and whether the checkout had local changes (read-only git)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "local_changes": bool(dirty)}


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Benchmark ackbus, and with --peer also RabbitMQ, Redis and/or (with --amqp) the null AMQP peer "
        "on this machine (runs interleaved).",
    )
    parser.add_argument("--peer", metavar="NAME[,NAME]",
                        help=f"also benchmark these (comma-separated: {', '.join(PEERS)}; installed if missing). "
                        "null (with --amqp only): a do-nothing AMQP server for the pika worker, whose figures are "
                        "pika's ceiling, the most any broker could reach with that client workload")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every workload per broker (default 3)")
    parser.add_argument("--quick", action="store_true", help="tiny counts and durations: a smoke run")
    parser.add_argument("--only", default="", metavar="NAME,...",
                        help="run only these workloads: " + ", ".join(WORKLOADS))
    parser.add_argument("--tls", action="store_true",
                        help="ackbus serves HTTPS (a certificate made for each run) and its clients "
                        "verify it: compare with a run without --tls for the cost of TLS")
    parser.add_argument("--amqp", action="store_true",
                        help="ackbus's side runs the pika workers (bench/worker_rabbitmq.py) against its AMQP "
                        "0-9-1 port instead of the HTTP client; only the workloads RabbitMQ runs")
    parser.add_argument("--plot", action="store_true", help="draw the chart (PNG) from the results")
    parser.add_argument("--plot-file", type=Path, default=ROOT / "docs" / "benchmarks.png", metavar="PNG",
                        help="where --plot writes the chart (default docs/benchmarks.png)")
    parser.add_argument("--results", type=Path, metavar="JSON",
                        help="do not run: print (and with --plot, chart) these saved results")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results", metavar="DIR",
                        help="results directory (default bench-results/)")
    parser.add_argument("--cluster", type=int, default=0, metavar="N",
                        help="instead: the cluster benchmark on up to N nodes (forwarding cost; total throughput over "
                        "8 queues on 1, 2, 4, ... N nodes; with --peer redis also on one Redis; with N >= 3 a quorum queue "
                        "against a classic one and the failover time, with --peer rabbitmq also on one RabbitMQ node)")
    parser.add_argument("--client-backend", choices=["trio", "asyncio"], default="trio",
                        help="event loop of ackbus's client in the workers (asyncio: uvloop when installed)")
    args = parser.parse_args(argv)
    os.environ["ACKBUS_BENCH_CLIENT_BACKEND"] = args.client_backend
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        args.peers = parse_peers(args.peer)
    except ValueError as exc:
        parser.error(f"--peer: {exc}")
    if "null" in args.peers and (not args.amqp or args.cluster):
        parser.error("--peer null needs --amqp (and no --cluster): the null peer is an AMQP server for the pika "
                     "worker, so it is compared with ackbus's AMQP port")
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.amqp:
        names = [n for n in names if WORKLOADS[n].runs_on("rabbitmq")]
    if args.cluster and "rabbitmq" in args.peers and args.cluster < 3:
        parser.error("--cluster compares with RabbitMQ in its quorum-queue part only, which needs N >= 3")
    if args.cluster < 0:
        parser.error("--cluster N needs N >= 1")
    args.names = names
    return args


def report(results: dict[str, Any], args: argparse.Namespace, out: TextIO | None = None) -> tuple[str, Any]:
    out = sys.stdout if out is None else out  # at call time: sys.stdout may have been replaced
    params = Params(**{k: tuple(v) if isinstance(v, list) else v for k, v in results["params"].items()})
    peers = peers_of(results["options"])
    summaries = summarize(all_figures(params, results["options"]["workloads"]), results["runs"])
    out.write("\n" + text_table(summaries, peers) + "\n")
    if peers:
        names = " or ".join(SIDE_NAMES[peer] for peer in peers)
        out.write(f"ratio = ackbus median / {names} median, then (with 2+ rounds) the min–max of the per-round "
                  "ratios; 'better' says which direction is better; '–': not measured on that side (WAL "
                  "bytes/msg: ackbus only; a workload the peer has no equivalent for) or every round failed.\n")
        if "null" in peers:
            out.write("null: the null AMQP peer, a server that does no broker work, driven by the same pika "
                      "workers: its figures are pika's ceiling on this machine, an upper bound for any broker "
                      "with that client workload; ackbus/null is the share of that ceiling ackbus reaches.\n")
    failed = [r for r in results["runs"] if r.get("error")]
    for run in failed:
        out.write(f"FAILED: {run['workload']} round {run['round']} {run['side']}: {run['error'].splitlines()[0]}\n")
    return markdown_table(summaries, peers), summaries


def _say(text: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.results:
        results = json.loads(args.results.read_text())
        _, summaries = report(results, args)
        if args.plot:
            _draw(summaries, results, args.plot_file)
        return 0

    if args.cluster:
        for peer in args.peers:
            ENSURE[peer](_say)
        text, _results = run_cluster_bench(args.cluster, quick=args.quick, peers=args.peers, out_dir=args.out,
                                           say=_say)
        sys.stdout.write(text)
        return 0
    params = QUICK if args.quick else FULL
    sides = ["ackbus", *args.peers]
    progress = Progress(
        sum(WORKLOADS[name].runs_on(side) for name in args.names for side in sides) * args.rounds
    )
    for peer in args.peers:
        ENSURE[peer](progress.say)

    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    results_path = args.out / f"{stamp}.json"
    log_dir = args.out / f"{stamp}-logs"
    tmp_root = Path(tempfile.mkdtemp(prefix="ackbus-bench-"))
    source_digest = snapshot_code(tmp_root / "code")
    results: dict[str, Any] = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(tmp_root),
        "git": git_state() | {"source_sha256": source_digest},
        "versions": {},
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in params.__dict__.items()},
        "options": {"peer": ",".join(args.peers) or None, "peers": args.peers, "rounds": args.rounds, "quick": args.quick,
                    "client_backend": args.client_backend, "workloads": args.names,
                    "ackbus_client": "pika on the AMQP port" if args.amqp else "client library (client/)",
                    "fsync": "always", "tls": args.tls, "amqp": args.amqp},
        "runs": [],
    }
    progress.say(f"results: {results_path}")
    try:
        for name in args.names:
            workload = WORKLOADS[name]
            for round_no in range(1, args.rounds + 1):
                for side in sides:
                    if not workload.runs_on(side):
                        continue
                    progress.run(f"{workload.title} · round {round_no}/{args.rounds} · {side}")
                    run = _one_run(workload, side, round_no, params, tmp_root, log_dir, progress, results, args.tls,
                                   args.amqp)
                    results["runs"].append(run)
                    _write_json(results_path, results)
                    progress.finished_run()
                    if run.get("error"):
                        progress.say(f"run failed: {name} round {round_no} {side}: {run['error'].splitlines()[0]}"
                                     f" (details in {results_path})")
    except KeyboardInterrupt:
        progress.say("interrupted: reporting what was measured so far")
    finally:
        progress.close()
        shutil.rmtree(tmp_root, ignore_errors=True)
    results["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    markdown, summaries = report(results, args)
    results["summary"] = [s.as_json() for s in summaries]
    _write_json(results_path, results)
    shutil.copyfile(results_path, args.out / "latest.json")
    (args.out / f"{stamp}.md").write_text(markdown + "\n")
    print(f"results: {results_path}")
    if args.plot:
        _draw(summaries, results, args.plot_file)
    return 1 if any(r.get("error") for r in results["runs"]) else 0


def _draw(summaries: Any, results: dict[str, Any], plot_file: Path) -> None:
    """The main chart (unless only growth workloads ran) and the growth chart beside it
    (if any ran): ``docs/benchmarks.png``, ``docs/benchmarks-growth.png``."""
    from bench.plot import plot
    from bench.plot_growth import growth_chart_path, plot_growth, without_growth

    if without_growth(summaries):
        plot(without_growth(summaries), results, plot_file)
        print(f"chart: {plot_file}")
    if plot_growth(summaries, results, growth_chart_path(plot_file)):
        print(f"growth chart: {growth_chart_path(plot_file)}")


def _one_run(
    workload: Any, side: str, round_no: int, params: Params, tmp_root: Path, log_dir: Path,
    progress: Progress, results: dict[str, Any], tls: bool = False, amqp: bool = False,
) -> dict[str, Any]:
    workdir = tmp_root / f"{workload.name}-{round_no}-{side}"
    server: AckbusServer | RabbitServer | RedisServer | NullAMQPServer = (
        AckbusServer(workdir, tls=tls, amqp=amqp) if side == "ackbus" else PEER_SERVERS[side](workdir))
    run: dict[str, Any] = {"workload": workload.name, "round": round_no, "side": side, "figures": {},
                           "loadavg_before": os.getloadavg()}
    # Every step has its own time limit; the watchdog is the backstop for a call that
    # has none (a broker that accepts a connection and then never answers): past the
    # run's budget it kills the broker and the client workers, which makes whatever
    # waits on them fail.
    budget_s = params.slack_s * 2 + workload.budget_s(params) + 60

    def abort() -> None:
        server.abort()
        abort_workers()

    watchdog = threading.Timer(budget_s, abort)
    watchdog.daemon = True
    run["budget_s"] = budget_s
    t0 = time.perf_counter()
    watchdog.start()
    try:
        start_s = server.start(timeout_s=params.slack_s * 2)
        for key, value in server.versions().items():
            results["versions"].setdefault(key, value)
        pid0, cpu0 = server.pid, cpu_seconds(server.pid)
        ctx = Context(params, log_dir, progress.status)
        figures, extra = workload.run(ctx, server, start_s)
        run["figures"], run["extra"] = figures, extra
        if server.pid == pid0:  # not across a kill -9 and restart
            run["broker_cpu_s"] = cpu_seconds(server.pid) - cpu0
    except Exception as exc:
        run["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        if server.aborted:
            run["error"] = f"over the run's time budget of {budget_s:.0f} s (broker killed): " + run["error"]
        log_dir.mkdir(parents=True, exist_ok=True)
        for path in workdir.glob("*.log"):
            shutil.copyfile(path, log_dir / f"{workdir.name}-{path.name}")
    finally:
        watchdog.cancel()
        progress.status("stopping the broker")
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    run["wall_s"] = time.perf_counter() - t0
    run["loadavg_after"] = os.getloadavg()
    return run

"""A Jepsen-style fault test of quorum queues on one machine (``scripts/chaos``).

It starts three etcd members and N broker nodes (:mod:`tests.chaos.cluster`),
declares a 3-replica quorum queue, and for the given time runs the clients of
:mod:`tests.chaos.workload` (publishers, a consumer, a locker, a watcher) and the
nemesis of :mod:`tests.chaos.nemesis`. Then it heals (every member running, every
partition gone, clocks true), drains the queue, and checks the whole history
(:mod:`tests.chaos.checker`).

Two placements: on loopback (kills, pauses, wiped directories, clock jumps, etcd
members stopped), or with ``netns`` each member in a network namespace the run makes
(:mod:`tests.chaos.netns`), which adds partitions: the harness then runs its clients
from the hub namespace, in a child process (``python -m tests.chaos.inside``), while
this process makes the namespaces before and removes them after, whatever happens.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.chaos.checker import check
from tests.chaos.cluster import LIBFAKETIME, QUEUE, Cluster
from tests.chaos.nemesis import available_kinds, kinds_for, nemesis, select_kinds
from tests.chaos.netns import (
    NetnsUnavailable,
    Topology,
    netns_unavailable_reason,
    remove_leftovers,
)
from tests.chaos.workload import History, consumer, drain, locker, publisher, watcher
from tests.support.broker import ROOT

__all__ = ["exit_on_sigterm", "run", "run_here"]


def run(directory: Path, minutes: float, nodes: int = 3, publishers: int = 2, seed: int = 1, ttl_s: int = 3,
        netns: bool | None = None, faults: list[str] | None = None) -> dict[str, Any]:
    """Run the fault test and return the checker's findings, with ``placement`` saying
    where it ran. ``netns``: True demands namespaces (raises :class:`NetnsUnavailable`
    with the reason when they cannot be made), False stays on loopback, None (the
    default) uses them when they can be made. ``faults``: only these kinds (None:
    every kind the placement can make); ValueError when one cannot be made there."""
    reason = netns_unavailable_reason() if netns is not False else "not asked for"
    if netns and reason:
        raise NetnsUnavailable(reason)
    select_kinds(available_kinds(not reason, os.path.exists(LIBFAKETIME)), faults)  # fail before starting anything
    if reason:
        result = run_here(directory, minutes, nodes, publishers, seed, ttl_s, None, faults)
        return {"placement": f"loopback (no partitions: {reason})", **result}
    return {"placement": "network namespaces",
            **_run_in_namespaces(directory, minutes, nodes, publishers, seed, ttl_s, faults)}


def _run_in_namespaces(directory: Path, minutes: float, nodes: int, publishers: int, seed: int, ttl_s: int,
                       faults: list[str] | None) -> dict[str, Any]:
    removed = remove_leftovers()
    if removed:
        print(f"chaos: removed namespaces left by an earlier run: {', '.join(removed)}", file=sys.stderr)
    topology = Topology([*(f"n{i + 1}" for i in range(nodes)), *Cluster.ETCD_MEMBERS])
    spec = directory / "spec.json"
    out = directory / "result.json"
    out.unlink(missing_ok=True)
    child: subprocess.Popen[bytes] | None = None
    try:
        topology.create()
        spec.write_text(json.dumps({
            "directory": str(directory), "minutes": minutes, "nodes": nodes, "publishers": publishers, "seed": seed,
            "ttl_s": ttl_s, "faults": faults, "out": str(out), "addresses": topology.addresses,
            "topology": {"members": topology.members, "prefix": topology.prefix},
        }))
        child = subprocess.Popen([*topology.exec_prefix(None), sys.executable, "-m", "tests.chaos.inside", str(spec)], cwd=str(ROOT))
        child.wait(timeout=minutes * 60 + 900)
        if child.returncode != 0 or not out.exists():
            raise RuntimeError(f"the run in the hub namespace failed (exit {child.returncode}); logs in {directory}")
        return dict(json.loads(out.read_text()))
    finally:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # it stops its cluster in its finally
            try:
                child.wait(timeout=90)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=30)
        topology.remove()


def exit_on_sigterm() -> None:
    """SIGTERM ends this process through its ``finally`` blocks (as Ctrl-C does), so
    that the cluster is stopped and the namespaces removed."""

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)


def run_here(directory: Path, minutes: float, nodes: int, publishers: int, seed: int, ttl_s: int,
             topology: Topology | None, faults: list[str] | None = None) -> dict[str, Any]:
    """Start the cluster (in ``topology``'s namespaces, this process in its hub; or
    on loopback), run the workload and the nemesis (``faults``: only these kinds) for
    ``minutes``, heal, drain, check."""
    rng = random.Random(seed)
    random.seed(seed)
    cluster = Cluster(directory, nodes, ttl_s, topology)
    kinds_for(cluster, faults)  # ValueError before anything starts
    history = History()
    stop = threading.Event()
    chaos_stop = threading.Event()
    chaos = threading.Thread(target=nemesis, args=(cluster, history, chaos_stop, max(5.0, ttl_s * 3.0), rng, faults),
                             daemon=True)
    try:
        cluster.start()
        first = next(iter(cluster.nodes.values()))
        status, body = first.request("PUT", f"/queues/{QUEUE}", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
        assert status == 201, body
        deadline = time.monotonic() + 30
        while cluster.leader() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = [threading.Thread(target=publisher, args=(cluster, history, k, stop, 30.0), daemon=True) for k in range(publishers)]
        workers += [threading.Thread(target=f, args=(cluster, history, stop), daemon=True) for f in (consumer, locker, watcher)]
        for t in workers:
            t.start()
        chaos.start()
        time.sleep(minutes * 60)
        chaos_stop.set()
        chaos.join(timeout=180)
        cluster.heal()
        time.sleep(ttl_s)
        stop.set()
        for t in workers:
            t.join(timeout=60)
        drain(cluster, history)
        (directory / "history.json").write_text(json.dumps(history.as_json()))
        return check(history)
    finally:
        chaos_stop.set()
        stop.set()
        if chaos.is_alive():  # interrupted: let it finish the fault it is in (it may start a node)
            chaos.join(timeout=90)
        cluster.stop()

"""The nemesis of the fault test: one fault at a time, each healed before the next.

Kinds (every one on loopback, the network ones only in namespaces):

- ``kill``: kill -9 the queue's leader, restarted once its lease lapsed;
  ``kill-follower``: the same for a follower;
- ``pause``: SIGSTOP the leader for the lease TTL + 2 s, then SIGCONT;
- ``wipe``: kill -9 a follower, delete its data directory, restart it empty;
- ``clock-jump``: jump the clock node's wall clock forward or back (libfaketime),
  hold, then set it true again;
- ``etcd-pause`` (SIGSTOP one etcd member, then SIGCONT) and ``etcd-kill`` (kill -9
  one member, restart it on its data);
- ``isolate`` (network): the leader cut off both ways from the other nodes and every
  etcd member (the clients still reach it: what it must not do is confirm);
- ``split`` (network): a minority (the leader, on 5 nodes one more node, and one etcd
  member) cut off both ways from the majority;
- ``one-way`` (network): packets from the leader to every other member dropped, or to
  the leader from every other member, the other direction untouched.

The kinds are taken in a shuffled round (each once before any twice), so a short run
sees each; ``only`` (``scripts/chaos --faults split,kill``) restricts them.
"""

from __future__ import annotations

import random
import sys
import threading
import time

from tests.chaos.cluster import Cluster
from tests.chaos.workload import History

__all__ = ["ALL_KINDS", "LEADER_FAULTS", "available_kinds", "kinds_for", "nemesis", "parse_kinds", "select_kinds"]

LOCAL_KINDS = ("kill", "kill-follower", "pause", "wipe", "clock-jump", "etcd-pause", "etcd-kill")
NETWORK_KINDS = ("isolate", "split", "one-way")
ALL_KINDS = (*LOCAL_KINDS, *NETWORK_KINDS)
#: faults after which the queue needs a new leader (failover times are theirs)
LEADER_FAULTS = ("kill", "pause", "isolate", "split", "one-way")


def parse_kinds(text: str) -> list[str]:
    """``"split,kill"`` as a list of fault kinds. Raises ValueError naming an unknown
    one."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ALL_KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown) or '(none given)'}: choose from {', '.join(ALL_KINDS)}")
    return kinds


def available_kinds(network: bool, clock: bool) -> list[str]:
    """The kinds a run can make: the network ones in namespaces only, ``clock-jump``
    only with a clock node (libfaketime)."""
    kinds = [k for k in LOCAL_KINDS if clock or k != "clock-jump"]
    return kinds + list(NETWORK_KINDS) if network else kinds


def kinds_for(cluster: Cluster, only: list[str] | None = None) -> list[str]:
    """The kinds this cluster can be given (``only`` those, when given). Raises
    ValueError when one of ``only`` cannot be made here."""
    return select_kinds(available_kinds(cluster.topology is not None, cluster.clock_node is not None), only)


def select_kinds(kinds: list[str], only: list[str] | None) -> list[str]:
    """``kinds`` restricted to ``only`` (None: all). Raises ValueError when one of
    ``only`` is not among ``kinds``."""
    if only is None:
        return kinds
    missing = [k for k in only if k not in kinds]
    if missing:
        raise ValueError(f"fault kind(s) {', '.join(missing)} cannot be made here (network faults need namespaces, "
                         "clock-jump needs libfaketime)")
    return [k for k in kinds if k in only]


def nemesis(cluster: Cluster, history: History, stop: threading.Event, every_s: float, rng: random.Random,
            only: list[str] | None = None) -> None:
    kinds = kinds_for(cluster, only)
    round_: list[str] = []
    while not stop.wait(every_s):
        if not round_:
            round_ = rng.sample(kinds, len(kinds))
        kind = round_.pop()
        info = cluster.status() or {}
        leader = info.get("leader")
        if leader not in cluster.nodes or not cluster.nodes[leader].alive():
            continue  # no leader to fault now: this kind waits for the next round
        followers = [n for n in info.get("replicas", []) if n != leader and cluster.nodes[n].alive()]
        try:
            inject(cluster, history, kind, leader, followers, stop, rng)
        except Exception as exc:  # a fault that could not be made or healed: said, and the run goes on
            print(f"chaos: nemesis {kind}: {exc!r}", file=sys.stderr)
            if cluster.topology is not None:
                cluster.topology.heal()


def _record(history: History, kind: str, target: str) -> None:
    with history.lock:
        history.faults.append((time.time(), kind, target))


def inject(cluster: Cluster, history: History, kind: str, leader: str, followers: list[str],
           stop: threading.Event, rng: random.Random) -> None:
    """One fault, healed before returning."""
    hold_s = cluster.ttl_s + 2
    if kind in ("kill-follower", "wipe") and not followers:
        kind = "kill"
    if kind in ("kill", "kill-follower", "wipe"):
        target = leader if kind == "kill" else rng.choice(followers)
        _record(history, kind, target)
        cluster.nodes[target].kill()
        cluster.restart_when_free(target, wipe=kind == "wipe")
    elif kind == "pause":
        _record(history, kind, leader)
        cluster.nodes[leader].pause()
        stop.wait(hold_s)
        cluster.nodes[leader].resume()
    elif kind == "clock-jump":
        assert cluster.clock_node is not None
        offset = rng.choice((-1, 1)) * rng.randint(30, 600)
        _record(history, kind, f"{cluster.clock_node} {offset:+d}s")
        cluster.jump_clock(offset)
        stop.wait(hold_s)
        cluster.jump_clock(0)
    elif kind in ("etcd-pause", "etcd-kill"):
        name = rng.choice(list(cluster.etcd))
        member = cluster.etcd[name]
        _record(history, kind, name)
        if kind == "etcd-pause":
            member.pause()
            stop.wait(hold_s)
            member.resume()
        else:
            member.kill()
            stop.wait(1.0)
            cluster.restart_etcd(name)
    else:
        _partition(cluster, history, kind, leader, rng)
        stop.wait(hold_s + cluster.ttl_s)
        assert cluster.topology is not None
        cluster.topology.heal()


def _partition(cluster: Cluster, history: History, kind: str, leader: str, rng: random.Random) -> None:
    topology = cluster.topology
    assert topology is not None
    everyone = [*cluster.nodes, *cluster.etcd]
    others = [m for m in everyone if m != leader]
    if kind == "isolate":
        _record(history, kind, leader)
        topology.isolate([leader], others)
    elif kind == "split":
        nodes = [n for n in cluster.nodes if n != leader]
        minority = [leader, *rng.sample(nodes, (len(cluster.nodes) - 1) // 2 - 1), rng.choice(list(cluster.etcd))]
        majority = [m for m in everyone if m not in minority]
        _record(history, kind, "+".join(minority))
        topology.isolate(minority, majority)
    else:  # one-way
        if rng.random() < 0.5:
            _record(history, kind, f"{leader}->all")
            topology.cut(leader, others)
        else:
            _record(history, kind, f"all->{leader}")
            for m in others:
                topology.cut(m, [leader])

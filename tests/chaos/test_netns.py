"""The namespaces of ``scripts/chaos --netns``: made, reachable from the hub, cut one
way and both ways by nftables, healed, and removed without a trace (skipped with the
reason where namespaces cannot be made)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.chaos.netns import Topology, netns_unavailable_reason, remove_leftovers

SERVER = "import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 7000)); s.listen(); print('up', flush=True); [s.accept()[0].close() for _ in iter(int, 1)]"
CLIENT = "import socket,sys; socket.create_connection((sys.argv[1], 7000), timeout=0.7).close()"


@pytest.fixture
def topology() -> Iterator[Topology]:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    topo = Topology(["a", "b"])
    servers: list[subprocess.Popen[str]] = []
    try:
        topo.create()
        for member in topo.members:
            proc = subprocess.Popen([*topo.exec_prefix(member), sys.executable, "-c", SERVER, topo.addresses[member]],
                                    stdout=subprocess.PIPE, text=True)
            servers.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        yield topo
    finally:
        for proc in servers:
            proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        topo.remove()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert topo.prefix not in listed, listed


def reaches(topo: Topology, source: str | None, target: str) -> bool:
    done = subprocess.run([*topo.exec_prefix(source), sys.executable, "-c", CLIENT, topo.addresses[target]],
                          capture_output=True, timeout=30, check=False)
    return done.returncode == 0


def test_one_way_and_two_way_cuts_and_heal(topology: Topology) -> None:
    assert reaches(topology, None, "a") and reaches(topology, "a", "b") and reaches(topology, "b", "a")
    root_links = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert "10.213.0." not in root_links  # no address of the topology in the root namespace
    topology.cut("a", ["b"])  # a -> b dropped: no TCP either way (the SYN-ACK is a -> b too)
    assert not reaches(topology, "a", "b")
    assert reaches(topology, None, "a") and reaches(topology, None, "b")  # the hub still reaches both
    topology.heal()
    assert reaches(topology, "a", "b") and reaches(topology, "b", "a")
    topology.isolate(["a"], ["b"])
    assert not reaches(topology, "a", "b") and not reaches(topology, "b", "a")
    topology.heal()
    assert reaches(topology, "b", "a")


def test_leftovers_of_a_dead_run_are_removed_and_a_live_runs_kept() -> None:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    dead, live = f"ab{gone.pid}-n1", f"ab{os.getppid()}-n1"  # our parent lives on
    try:
        for name in (dead, live):
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        removed = remove_leftovers()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert dead in removed and dead not in listed
        assert live not in removed and live in listed
    finally:
        for name in (dead, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)

"""Network namespaces for the fault test (``scripts/chaos --netns``), and partitions
in them with nftables.

The topology is made by the test and removed by it: a *hub* namespace holding a
bridge, and one namespace per broker node and per etcd member, each joined to the
bridge by a veth pair created straight inside the two namespaces (no link and no
address ever exists in the root namespace, so no traffic leaves the topology). Every
namespace name carries the run's prefix ``ab<pid>-``; a run that finds namespaces of
that scheme whose process is gone (a crashed earlier run) removes them first, with the
processes still inside them.

Partitions are nftables rules in the namespaces (a table ``chaos``, dropped whole to
heal): :meth:`Topology.cut` drops what one member sends to others, in that member's
namespace, so a two-way cut is two one-way cuts.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["NetnsUnavailable", "Topology", "netns_unavailable_reason", "remove_leftovers"]

#: ``ab<pid>-<member>``: the run's prefix scheme (short: Linux link names are at most
#: 15 bytes, and link names are ``<member>`` inside the namespaces, so only the
#: namespace names carry it).
PREFIX_PATTERN = re.compile(r"^ab(\d+)-")
SUBNET = "10.213.0"
HUB_ADDRESS = f"{SUBNET}.1"
TABLE = "chaos"


class NetnsUnavailable(RuntimeError):
    """The namespaces could not be made here (the message says why)."""


def netns_unavailable_reason() -> str | None:
    """Why network namespaces cannot be made on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or without --netns for loopback faults)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 and nftables are needed for namespaces and partitions)"
    probe = f"ab{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        _run(["ip", "netns", "exec", probe, "nft", "list", "ruleset"])
    except NetnsUnavailable as exc:
        return f"cannot make a network namespace with nftables: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _run(argv: list[str], timeout_s: float = 15.0) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsUnavailable(f"{' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise NetnsUnavailable(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(namespace: str) -> None:
    """SIGKILL the processes left inside a namespace of a crashed run (the brokers and
    etcd members it started), then wait (bounded) until they are gone."""
    pids = [int(p) for p in _run(["ip", "netns", "pids", namespace]).split() if p.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.05)


def remove_leftovers() -> list[str]:
    """Remove the namespaces of our scheme whose run's process is gone (and what runs
    in them); returns their names. Namespaces of a live run are left alone."""
    removed = []
    for name in _namespaces():
        match = PREFIX_PATTERN.match(name)
        if match is None or (int(match.group(1)) != os.getpid() and _pid_alive(int(match.group(1)))):
            continue
        try:
            _kill_inside(name)
        except NetnsUnavailable:
            pass
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        removed.append(name)
    # a crash between "link add" and the move into a namespace cannot leave a link in
    # the root namespace: links are created inside the namespaces
    return removed


@dataclass
class Topology:
    """The hub and one namespace per member (``n1``.., ``e1``..), with addresses."""

    members: list[str]
    prefix: str = field(default_factory=lambda: f"ab{os.getpid()}-")
    addresses: dict[str, str] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return self.prefix + "hub"

    def namespace(self, member: str) -> str:
        return self.prefix + member

    def exec_prefix(self, member: str | None) -> list[str]:
        """The argv prefix running a command in ``member``'s namespace (None: the hub)."""
        return ["ip", "netns", "exec", self.hub if member is None else self.namespace(member)]

    def create(self) -> None:
        """Make the hub, its bridge and a namespace per member; on failure, remove what
        was made and raise :class:`NetnsUnavailable`."""
        try:
            self._create()
        except BaseException:
            self.remove()
            raise

    def _create(self) -> None:
        _ip("netns", "add", self.hub)
        self.created.append(self.hub)
        _ip("-n", self.hub, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for index, member in enumerate(self.members):
            ns = self.namespace(member)
            address = f"{SUBNET}.{10 + index}"
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # both ends born in their namespaces: "v-<member>" on the hub, "eth0" inside
            _ip("-n", self.hub, "link", "add", f"v-{member}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.hub, "link", "set", f"v-{member}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            self.addresses[member] = address

    def remove(self) -> None:
        """Delete every namespace this topology made (their veths go with them).
        Processes must be stopped first (a namespace outlives ``ip netns del`` while a
        process is in it: any still there, started by this run, is killed first)."""
        for ns in reversed(self.created):
            try:
                _kill_inside(ns)
            except NetnsUnavailable:
                pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self.created.clear()

    # ------------------------------------------------------------- partitions

    def cut(self, source: str, targets: Iterable[str]) -> None:
        """Drop every packet ``source`` sends to ``targets`` (in ``source``'s namespace;
        what they send to it still arrives)."""
        addresses = ", ".join(self.addresses[t] for t in targets)
        if not addresses:
            return
        ns = self.namespace(source)
        script = (
            f"add table inet {TABLE}\n"
            f"add chain inet {TABLE} out {{ type filter hook output priority 0 ; }}\n"
            f"add rule inet {TABLE} out ip daddr {{ {addresses} }} drop\n"
        )
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script, text=True, capture_output=True, check=True, timeout=15)

    def isolate(self, side: Iterable[str], other: Iterable[str]) -> None:
        """Cut both ways between two groups of members."""
        a, b = list(side), list(other)
        for m in a:
            self.cut(m, b)
        for m in b:
            self.cut(m, a)

    def heal(self) -> None:
        """Remove every partition rule."""
        for member in self.members:
            subprocess.run(
                ["ip", "netns", "exec", self.namespace(member), "nft", "delete", "table", "inet", TABLE],
                capture_output=True, check=False, timeout=15,
            )

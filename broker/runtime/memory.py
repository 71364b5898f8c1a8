"""The memory alarm: the broker's resident memory against its high watermark.

:class:`MemoryMonitor` samples the process's resident set size on a timer (twice a
second; never per message: one read of ``/proc/self/statm``) and raises the memory
alarm of the :class:`~broker.runtime.flow.FlowControl` while it is at or above the
watermark, clearing it once it is below again (RabbitMQ's
``vm_memory_high_watermark``).

The watermark (``memory_high_watermark``, docs/operations.md) is a fraction of the
memory the broker may use (``0.4``: 40 %), or an absolute size in bytes (any value
above 1), or 0 (no alarm). The memory it may use is its cgroup's limit when one is set
(cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``: a container's limit), else the
machine's (``MemTotal`` of ``/proc/meminfo``). The readings are functions of their
own, so a test hands the monitor a fake probe instead of allocating memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import trio

from broker.runtime.flow import ALARM_MEMORY, FlowControl

__all__ = [
    "MemoryMonitor",
    "memory_limit_bytes",
    "process_rss_bytes",
    "resolve_watermark",
]

log = logging.getLogger("ackbus.memory")

#: How often the resident size is read.
SAMPLE_INTERVAL_S = 0.5
#: A cgroup "limit" at or above this is no limit (v1 writes 2**63 rounded to pages).
_NO_LIMIT = 1 << 60


def process_rss_bytes(statm: Path = Path("/proc/self/statm")) -> int:
    """This process's resident set size in bytes (0 where ``/proc`` is missing)."""
    try:
        fields = statm.read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _cgroup_limit(root: Path, proc_cgroup: Path) -> int | None:
    """The memory limit of this process's cgroup (v2, then v1), None when unlimited
    or unknown."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    candidates: list[Path] = []
    for line in lines:
        _id, _sep, rest = line.partition(":")
        controllers, _sep, path = rest.partition(":")
        relative = path.lstrip("/")
        if controllers == "":  # v2: "0::/path"
            candidates += [root / relative / "memory.max", root / "memory.max"]
        elif "memory" in controllers.split(","):  # v1: "4:memory:/path"
            candidates += [
                root / "memory" / relative / "memory.limit_in_bytes",
                root / "memory" / "memory.limit_in_bytes",
            ]
    for candidate in candidates:
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        return value if 0 < value < _NO_LIMIT else None
    return None


def _meminfo_total(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return None


def memory_limit_bytes(
    *,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    meminfo: Path = Path("/proc/meminfo"),
) -> tuple[int | None, str]:
    """The memory the broker may use and where that number comes from (``cgroup`` or
    ``meminfo``): the cgroup's limit when it is set and below the machine's memory,
    else the machine's. ``(None, "unknown")`` when neither can be read."""
    total = _meminfo_total(meminfo)
    limit = _cgroup_limit(cgroup_root, proc_cgroup)
    if limit is not None and (total is None or limit < total):
        return limit, "cgroup"
    if total is not None:
        return total, "meminfo"
    return None, "unknown"


def resolve_watermark(setting: float, limit: int | None) -> int | None:
    """The watermark in bytes: ``setting`` above 1 is a size in bytes, in (0, 1] a
    fraction of ``limit``; None (no alarm) for 0 or a fraction of an unknown limit."""
    if setting > 1:
        return int(setting)
    if setting <= 0 or limit is None:
        return None
    return int(setting * limit)


class MemoryMonitor:
    """Samples the resident size and keeps the memory alarm of ``flow`` true."""

    def __init__(
        self,
        flow: FlowControl,
        setting: float,
        *,
        probe: Callable[[], int] = process_rss_bytes,
        limit: tuple[int | None, str] | None = None,
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        """``probe``: reads the resident size in bytes (a test passes a fake);
        ``limit``: the memory the broker may use and its source (read from the
        system when None)."""
        self.flow = flow
        self.setting = setting
        self.limit, self.limit_source = limit if limit is not None else memory_limit_bytes()
        #: The alarm's threshold in bytes (None: no alarm).
        self.watermark = resolve_watermark(setting, self.limit)
        self.probe = probe
        self.interval_s = interval_s
        #: The latest reading (bytes), and how many times the alarm was raised.
        self.used = probe()
        self.alarms_raised = 0

    @property
    def alarm(self) -> bool:
        return ALARM_MEMORY in self.flow.alarms

    def sample(self) -> None:
        """Read the resident size once and raise or clear the alarm."""
        self.used = used = self.probe()
        watermark = self.watermark
        if watermark is None:
            return
        if used >= watermark:
            if not self.alarm:
                self.alarms_raised += 1
            self.flow.raise_alarm(
                ALARM_MEMORY,
                f"memory alarm: the broker uses {used >> 20} MiB, at or above its high watermark of "
                f"{watermark >> 20} MiB",
            )
        elif self.alarm:
            self.flow.clear_alarm(ALARM_MEMORY)

    async def serve(self) -> None:
        """Sample every ``interval_s`` until cancelled."""
        if self.watermark is not None:
            log.info(
                "memory high watermark set",
                extra={"fields": {"watermark_bytes": self.watermark, "limit_bytes": self.limit, "limit_from": self.limit_source}},
            )
        while True:
            self.sample()
            await trio.sleep(self.interval_s)

    def info(self) -> dict[str, object]:
        """For ``/overview``: use, watermark, limit and the alarm."""
        return {
            "used_bytes": self.used,
            "high_watermark_bytes": self.watermark,
            "limit_bytes": self.limit,
            "limit_from": self.limit_source,
            "alarm": self.alarm,
        }

"""The runtime's publishing signal (``broker/runtime/flow.py``), the memory monitor
and its readings (``memory.py``, with fake ``/proc`` and cgroup files), and the disk
alarm's share of the signal (``space.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from broker.core import Broker
from broker.runtime import (
    ALARM_DISK,
    ALARM_MEMORY,
    FlowControl,
    MemoryMonitor,
    memory_limit_bytes,
    resolve_watermark,
)
from broker.runtime.memory import process_rss_bytes
from broker.runtime.space import DiskSpaceAlarm

GiB = 1 << 30


def test_the_watermark_is_a_fraction_of_the_limit_or_bytes_or_off() -> None:
    assert resolve_watermark(0.4, 10 * GiB) == 4 * GiB
    assert resolve_watermark(1.0, 10 * GiB) == 10 * GiB
    assert resolve_watermark(float(GiB), 10 * GiB) == GiB  # absolute
    assert resolve_watermark(float(GiB), None) == GiB
    assert resolve_watermark(0.0, 10 * GiB) is None  # off
    assert resolve_watermark(0.4, None) is None  # a fraction of nothing known


def _files(tmp_path: Path, cgroup: str, files: dict[str, str], total_kib: int = 8 * 1024 * 1024) -> dict[str, Path]:
    root = tmp_path / "cg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "cgroup").write_text(cgroup)
    (tmp_path / "meminfo").write_text(f"MemTotal:       {total_kib} kB\nMemFree:   1 kB\n")
    return {"cgroup_root": root, "proc_cgroup": tmp_path / "cgroup", "meminfo": tmp_path / "meminfo"}


def test_the_limit_is_the_cgroups_when_set_else_the_machines(tmp_path: Path) -> None:
    v2 = _files(tmp_path / "a", "0::/docker/abc\n", {"docker/abc/memory.max": f"{GiB}\n"})
    assert memory_limit_bytes(**v2) == (GiB, "cgroup")
    unlimited = _files(tmp_path / "b", "0::/\n", {"memory.max": "max\n"})
    assert memory_limit_bytes(**unlimited) == (8 * GiB, "meminfo")
    v1 = _files(tmp_path / "c", "5:cpu:/x\n4:memory:/x\n", {"memory/x/memory.limit_in_bytes": str(2 * GiB)})
    assert memory_limit_bytes(**v1) == (2 * GiB, "cgroup")
    v1_none = _files(tmp_path / "d", "4:memory:/\n", {"memory/memory.limit_in_bytes": str(9223372036854771712)})
    assert memory_limit_bytes(**v1_none) == (8 * GiB, "meminfo")
    # A cgroup limit above the machine's memory limits nothing.
    big = _files(tmp_path / "e", "0::/\n", {"memory.max": str(64 * GiB)})
    assert memory_limit_bytes(**big) == (8 * GiB, "meminfo")
    missing = tmp_path / "nowhere"
    assert memory_limit_bytes(cgroup_root=missing, proc_cgroup=missing, meminfo=missing) == (None, "unknown")


def test_the_resident_size_is_read_from_statm(tmp_path: Path) -> None:
    assert process_rss_bytes() > 0
    statm = tmp_path / "statm"
    statm.write_text("1000 25 3 1 0 20 0\n")
    import os

    assert process_rss_bytes(statm) == 25 * os.sysconf("SC_PAGE_SIZE")
    assert process_rss_bytes(tmp_path / "missing") == 0


async def test_the_monitor_raises_and_clears_the_alarm_and_subscribers_hear_each_change(autojump_clock: Any) -> None:
    flow = FlowControl()
    reading = [100]
    monitor = MemoryMonitor(flow, 0.5, probe=lambda: reading[0], limit=(1000, "meminfo"))
    assert monitor.watermark == 500
    heard: list[tuple[bool, str | None]] = []
    unsubscribe = flow.subscribe(lambda f: heard.append((f.blocked, f.reason)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.serve)
        await trio.sleep(1)
        assert not flow.blocked
        reading[0] = 600
        changed = flow.changed
        with trio.fail_after(1):
            await changed.wait()
        assert flow.blocked and monitor.alarm and ALARM_MEMORY in flow.alarms
        await trio.sleep(2)  # sampled again, still above: no second change
        assert len(heard) == 1
        reading[0] = 499
        assert await flow.wait_unblocked(trio.current_time() + 1)
        nursery.cancel_scope.cancel()
    assert [blocked for blocked, _ in heard] == [True, False]
    assert heard[0][1] is not None and "memory alarm" in heard[0][1]
    assert monitor.alarms_raised == 1
    unsubscribe()
    flow.raise_alarm(ALARM_MEMORY, "again")
    assert len(heard) == 2


async def test_wait_unblocked_times_out_while_blocked(autojump_clock: Any) -> None:
    flow = FlowControl()
    assert await flow.wait_unblocked(trio.current_time())  # not blocked: at once
    flow.raise_alarm(ALARM_DISK, "disk full")
    start = trio.current_time()
    assert not await flow.wait_unblocked(start + 3)
    assert trio.current_time() - start == pytest.approx(3)
    assert flow.retry_after_s == 5
    flow.raise_alarm(ALARM_MEMORY, "memory")
    assert flow.reason == "disk full; memory"
    flow.clear_alarm(ALARM_DISK)
    assert flow.blocked and flow.retry_after_s == 1


async def test_the_disk_reserve_raises_the_same_signal() -> None:
    core = Broker(clock=lambda: 0.0, wall_clock=lambda: 0.0)
    flow = FlowControl()
    space = DiskSpaceAlarm(core, flow, lambda: None, lambda: None)
    space.on_reserve_used()
    assert core.publish_refusal is not None and flow.blocked and ALARM_DISK in flow.alarms
    assert space.space_wanted()
    space.on_reserve(True)
    assert core.publish_refusal is None and not flow.blocked

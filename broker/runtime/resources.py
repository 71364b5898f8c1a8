"""The host resources an operator watches besides memory: file descriptors and disk.

Read when asked (``GET /overview``, a metrics scrape: each a few system calls), never
on the message path. Memory has its own monitor (``memory.py``), since it is sampled
on a timer to raise its alarm.
"""

from __future__ import annotations

import os
import resource
import shutil
from pathlib import Path
from typing import Any

__all__ = ["disk_info", "fd_info", "open_fds"]


def open_fds(fd_dir: Path = Path("/proc/self/fd")) -> int | None:
    """File descriptors this process has open (None where ``/proc`` is missing)."""
    try:
        return len(os.listdir(fd_dir))
    except OSError:
        return None


def fd_info() -> dict[str, Any]:
    """Open file descriptors and the soft limit (``ulimit -n``) on them."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"open": open_fds(), "limit": soft if soft != resource.RLIM_INFINITY else None}


def disk_info(data_dir: Path | None) -> dict[str, Any]:
    """Free and total bytes of the file system holding ``data_dir`` (None values
    without a data directory: a memory-only broker)."""
    if data_dir is None:
        return {"free_bytes": None, "total_bytes": None}
    try:
        usage = shutil.disk_usage(data_dir)
    except OSError:
        return {"free_bytes": None, "total_bytes": None}
    return {"free_bytes": usage.free, "total_bytes": usage.total}

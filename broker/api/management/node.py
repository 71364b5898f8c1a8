"""This broker as a RabbitMQ node: its name and ``/api/nodes``' fields.

A single node's name is ``ackbus@<host name>``, in RabbitMQ's ``name@host`` form, so
tools that split it find a host. In a cluster (``--etcd``) several nodes may share a
host, so a node's name is ``ackbus@<its --node-name>``, which every member can
compute for every other (``cluster.py`` lists them all). The numbers are the ones ackbus's ``/overview`` shows: memory
in use and the watermark, free disk, file descriptors, uptime, and the alarms.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from broker.runtime import disk_info, fd_info

__all__ = ["member_node_name", "node_json", "node_name"]


def member_node_name(member: str) -> str:
    """The RabbitMQ node name of cluster member ``member``: ``ackbus@<member>``."""
    return f"ackbus@{member}"


def node_name(runtime: Any = None) -> str:
    """This broker's node name: ``ackbus@<host name>``, in a cluster (``runtime``'s
    cluster port set) ``ackbus@<node name>``."""
    port = getattr(runtime, "cluster", None)
    if port is not None:
        return member_node_name(port.node_name)
    return f"ackbus@{socket.gethostname()}"


def node_json(ctx: Any) -> dict[str, Any]:
    """``/api/nodes/{name}``'s answer (``ctx``: a ``ManagementContext``)."""
    runtime = ctx.runtime
    memory = runtime.memory
    alarms = runtime.flow.alarms
    disk = disk_info(ctx.options.data_dir)
    fds = fd_info()
    out: dict[str, Any] = {
        "name": node_name(runtime),
        "type": "disc" if ctx.options.data_dir is not None else "ram",
        "running": runtime.ready and not runtime.shutting_down,
        "os_pid": str(os.getpid()),
        "processors": os.cpu_count() or 1,
        "uptime": int((time.time() - runtime.started_at) * 1000),
        "mem_used": memory.used,
        "mem_limit": memory.watermark,
        "mem_alarm": memory.alarm,
        "disk_free_alarm": "disk" in alarms,
        "fd_used": fds["open"],
        "partitions": [],
        "rates_mode": "basic",
    }
    if disk["free_bytes"] is not None:
        out["disk_free"] = disk["free_bytes"]
    if fds["limit"] is not None:
        out["fd_total"] = fds["limit"]
    return out

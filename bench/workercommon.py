"""What both client workers share: the ready/go handshake, bodies, percentiles.

A worker is one process running one operation of one workload. It reads its spec (a
JSON object) from ``argv[1]``, sets up (connects, declares), prints ``READY``, waits for
a ``GO`` line on stdin (so that several publishers start together), runs, and prints
``RESULT <json>`` as its last stdout line. Timing uses ``time.perf_counter()`` inside a
process and ``time.monotonic_ns()`` (CLOCK_MONOTONIC, shared by every process on Linux)
for stamps that cross processes.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "body_of",
    "emit_result",
    "latency_summary",
    "percentile",
    "read_spec",
    "signal_ready",
    "stamped_body",
    "stamp_of",
    "wait_go",
]


def read_spec() -> dict[str, Any]:
    spec = json.loads(sys.argv[1])
    assert isinstance(spec, dict)
    return spec


def signal_ready() -> None:
    sys.stdout.write("READY\n")
    sys.stdout.flush()


def wait_go() -> None:
    """Block until the harness says GO (or exit if it went away)."""
    line = sys.stdin.readline()
    if line.strip() != "GO":
        sys.exit(3)


def emit_result(result: dict[str, Any]) -> None:
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def body_of(size: int) -> bytes:
    """An ASCII body of ``size`` bytes (ASCII so that ackbus sends it as JSON text,
    as a real application sending text or JSON would)."""
    return (b"ackbus-bench-" * (size // 13 + 1))[:size]


# A stamped body starts with the monotonic send time in ns (20 digits) and a sequence
# number (10 digits), then padding up to the body size.
_STAMP_BYTES = 30


def stamped_body(size: int, seq: int, now_ns: int | None = None) -> bytes:
    head = b"%020d%010d" % (time.monotonic_ns() if now_ns is None else now_ns, seq)
    return head + body_of(max(0, size - _STAMP_BYTES))


def stamp_of(body: bytes) -> tuple[int, int]:
    """(send time in monotonic ns, sequence number) of a stamped body."""
    return int(body[:20]), int(body[20:_STAMP_BYTES])


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values (p in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def latency_summary(latencies_s: list[float]) -> dict[str, float]:
    """p50/p99/max in milliseconds and the sample count."""
    values = sorted(latencies_s)
    return {
        "samples": len(values),
        "p50_ms": percentile(values, 50) * 1e3,
        "p99_ms": percentile(values, 99) * 1e3,
        "max_ms": (values[-1] * 1e3) if values else math.nan,
    }

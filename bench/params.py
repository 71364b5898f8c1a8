"""Workload sizes: the full benchmark and the ``--quick`` smoke run.

Publishing workloads are bounded by duration rather than by count, so that a slow
broker costs the same wall time as a fast one; consuming and recovery workloads are
bounded by count (the issue fixes the counts) and by a timeout.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Params", "FULL", "QUICK"]


@dataclasses.dataclass(frozen=True)
class Params:
    body_sizes: tuple[int, ...] = (100, 1024)
    # 1. one-at-a-time confirmed publish
    seq_duration_s: float = 4.0
    seq_warmup_s: float = 0.5
    # 2. pipelined confirmed publish
    pipelined_duration_s: float = 5.0
    pipelined_window: int = 1000
    pipelined_procs: tuple[int, ...] = (1, 4)
    # 2b. confirmed publish with a fixed number in flight per channel (issue 4's figures)
    inflight_windows: tuple[int, ...] = (1, 8, 64)
    inflight_size: int = 100
    inflight_duration_s: float = 5.0
    # 3. consume with manual ack from a pre-filled queue
    consume_count: int = 100_000
    consume_prefetch: tuple[int, ...] = (100, 1000)
    # 4. end-to-end latency at a fixed rate
    e2e_rate: int = 1000
    e2e_duration_s: float = 5.0
    e2e_warmup_s: float = 1.0
    e2e_prefetch: int = 100
    # 5. recovery after kill -9
    recovery_count: int = 1_000_000
    recovery_body_size: int = 100
    recovery_fill_procs: int = 2
    # 6. fan-out to N queues
    fanout_queues: int = 10
    fanout_duration_s: float = 5.0
    # 7. failures: consume with a nack-and-retry every Nth message; dead-lettering
    failures_count: int = 100_000
    failures_prefetch: int = 100
    failures_nack_every: int = 10
    # 8. delayed messages (ackbus only): memory and recovery with this many delayed
    delayed_count: int = 1_000_000
    delayed_body_size: int = 100
    delayed_delay_s: float = 3600.0
    # 10. one long poll over several queues (ackbus only): only the last listed has work
    get_any_queues: int = 3
    get_any_rate: int = 200
    get_any_duration_s: float = 5.0
    # 11. transactions of 1 and 100 publishes
    tx_sizes: tuple[int, ...] = (1, 100)
    tx_duration_s: float = 5.0
    # 12. priority queues: publish and consume+ack, a plain queue beside one with
    # x-max-priority; messages carry priorities 0..priority_levels-1 in turn
    priority_levels: int = 10
    priority_duration_s: float = 5.0
    priority_count: int = 100_000
    priority_prefetch: int = 100
    # 13. priority queue memory (ackbus only): this many queued over priority_levels
    priority_memory_count: int = 1_000_000
    # 14. lock acquire/release round trips (ackbus only)
    locks_duration_s: float = 5.0
    # fills (untimed set-up) use pipelined publishing with this window
    fill_window: int = 1000
    # timeouts: readiness of a worker, and slack added to every expected duration
    ready_timeout_s: float = 60.0
    slack_s: float = 60.0
    # the slowest fill rate we wait for before calling a fill stuck (msgs/s)
    min_fill_rate: float = 1500.0

    # growth with work (bench/growth.py): the same work made 10×, 100×, 1,000× bigger
    growth_fanout_queues: tuple[int, ...] = (1, 10, 100, 1000)
    growth_fanout_duration_s: float = 5.0
    growth_publisher_channels: tuple[int, ...] = (1, 10, 100)
    growth_publisher_window: int = 100  # per channel: 100 channels keep 10,000 in flight
    growth_publisher_procs: int = 4  # the channels are spread over at most this many processes
    growth_publishers_duration_s: float = 5.0
    growth_memory_counts: tuple[int, ...] = (1_000_000, 10_000_000)  # queued 100 B messages, cumulative
    growth_memory_fill_procs: int = 4
    growth_memory_min_recovery_rate: float = 10_000.0  # msgs/s: slower is a stuck recovery

    def fill_timeout_s(self, count: int) -> float:
        return self.slack_s + count / self.min_fill_rate

    def step_timeout_s(self, duration_s: float) -> float:
        """The most one timed step of ``duration_s`` may take, workers' set-up included."""
        return self.ready_timeout_s + duration_s + self.slack_s


FULL = Params()

QUICK = Params(
    seq_duration_s=0.5,
    seq_warmup_s=0.1,
    pipelined_duration_s=0.5,
    inflight_duration_s=0.5,
    consume_count=2_000,
    e2e_rate=500,
    e2e_duration_s=0.5,
    e2e_warmup_s=0.2,
    recovery_count=5_000,
    fanout_duration_s=0.5,
    failures_count=2_000,
    delayed_count=5_000,
    get_any_duration_s=0.5,
    tx_duration_s=0.5,
    priority_duration_s=0.5,
    priority_count=2_000,
    priority_memory_count=5_000,
    locks_duration_s=0.5,
    slack_s=60.0,
    growth_fanout_queues=(1, 10),
    growth_fanout_duration_s=0.5,
    growth_publisher_channels=(1, 10),
    growth_publishers_duration_s=0.5,
    growth_memory_counts=(2_000, 10_000),
)

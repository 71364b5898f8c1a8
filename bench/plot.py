"""The chart of ``docs/benchmarks.png`` (``scripts/bench --plot``), with matplotlib.

Five panels, because the figures live on very different scales: throughput (msgs/s),
latency (ms), recovery time (s), memory (MiB) and WAL bytes per message (ackbus only). Each figure is a group of horizontal
bars, one per side present (ackbus, RabbitMQ, Redis, the null AMQP peer; a colour each) at the median,
with a whisker from min to max over the rounds, and the ackbus/peer ratio written at
the right edge, level with that peer's bar. Throughput and latency use a log
scale so that a 10× gap and a 1.1× gap are both readable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.stats import SIDE_NAMES, SIDES, Summary, fmt

__all__ = ["plot"]

COLORS = {"ackbus": "#2b6cb0", "rabbitmq": "#f08c00", "redis": "#c53030", "null": "#718096"}
LEGEND = {"null": "null (no broker: pika's ceiling)"}

PANELS = (
    ("throughput (msgs/s, log scale) — higher is better", lambda s: "msgs/s" in s.figure.metric, True),
    ("latency (ms, log scale) — lower is better", lambda s: "ms" in s.figure.metric.split(), True),
    ("time (s) — lower is better", lambda s: s.figure.metric == "s", False),
    ("broker memory (MiB) — lower is better", lambda s: s.figure.metric == "MiB", False),
    ("WAL bytes written per message — lower is better", lambda s: s.figure.metric == "WAL bytes/msg", False),
)


def _short(summary: Summary) -> str:
    label = summary.figure.label
    for long, short in (
        ("one-at-a-time confirmed publish", "one-at-a-time"),
        ("pipelined publish (window 1000)", "pipelined"),
        ("consume + ack from ", "consume "),
        ("fan-out publish to 10 queues (window 1000)", "fan-out ×10"),
        ("confirmed publish, ", ""),
        (" per channel", ""),
        ("WAL bytes written per confirmed message (pipelined publish)", "WAL bytes/msg"),
        ("publish→deliver latency at ", "e2e @ "),
        (" persistent", ""),
        ("restart after kill -9 with ", "recovery, "),
        ("broker RSS after that recovery", "RSS after recovery"),
        ("broker RSS after publishing ", "RSS after fill, "),
        (" (before kill -9)", ""),
    ):
        label = label.replace(long, short)
    metric = summary.figure.metric
    if metric not in ("msgs/s", "confirmed msgs/s", "s", "MiB", "WAL bytes/msg"):
        label += f" — {metric.replace(' ms', '')}"
    return label


def plot(summaries: Sequence[Summary], results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = [side for side in SIDES if any(s.n(side) for s in summaries)]
    panels = [(title, [s for s in summaries if pick(s)], log) for title, pick, log in PANELS]
    panels = [p for p in panels if p[1]]
    heights = [max(1.2, 0.42 * len(items) * len(sides) + 0.6) for _, items, _ in panels]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(11, sum(heights) + 1.4), gridspec_kw={"height_ratios": heights}, squeeze=False
    )
    bar = 0.8 / len(sides)

    def bar_y(i: int, k: int) -> float:
        """The y of side number ``k``'s bar in figure number ``i``'s group."""
        return i + (len(sides) - 1 - k) * bar - 0.4 + bar / 2

    for ax, (title, items, log) in zip(axes[:, 0], panels):
        items = list(reversed(items))  # first figure at the top
        for k, side in enumerate(sides):
            ys, medians, lows, highs = [], [], [], []
            for i, s in enumerate(items):
                if not s.n(side):
                    continue
                median = s.stat(side, "median")
                ys.append(bar_y(i, k))
                medians.append(median)
                lows.append(median - s.stat(side, "min"))
                highs.append(s.stat(side, "max") - median)
            ax.barh(ys, medians, height=bar * 0.92, color=COLORS[side], label=LEGEND.get(side, SIDE_NAMES[side]),
                    xerr=[lows, highs], error_kw={"elinewidth": 0.8, "capsize": 2, "ecolor": "#333"})
            for y, m in zip(ys, medians):
                ax.text(m, y, " " + fmt(m), va="center", ha="left", fontsize=7, color="#222")
        ax.set_yticks(range(len(items)))
        ax.set_yticklabels([_short(s) for s in items], fontsize=8)
        if log:
            ax.set_xscale("log")
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3, which="both")
        xmax = max(s.stat(side, "max") for s in items for side in sides if s.n(side))
        ax.set_xlim(right=xmax * (8 if log else 1.35))
        for k, peer in enumerate(sides):
            if peer == "ackbus":
                continue
            for i, s in enumerate(items):
                ratio = s.ratio_to(peer)
                if not math.isnan(ratio):
                    ax.text(1.0, bar_y(i, k), f"×{ratio:.2f} ", transform=ax.get_yaxis_transform(), va="center",
                            ha="right", fontsize=7 if len(sides) > 2 else 8, color=COLORS[peer], fontweight="bold")
    axes[0, 0].legend(loc="lower right", fontsize=8)
    machine, versions = results.get("machine", {}), results.get("versions", {})
    rounds = results.get("options", {}).get("rounds")
    caption = (
        f"medians of {rounds} round(s), whiskers min–max; bold, level with a peer's bar: ackbus/peer ratio of "
        "medians. "
        f"{machine.get('nproc')} × {machine.get('cpu', '?')}, {machine.get('ram_gib')} GiB RAM. "
        f"ackbus {versions.get('ackbus', '?')} (Python {machine.get('python')}, fsync always)"
    )
    if "rabbitmq" in versions:
        caption += f", RabbitMQ {versions['rabbitmq']} ({versions.get('erlang')}, pika {versions.get('pika')})"
    if "redis" in versions:
        caption += (f", Redis {versions['redis']} (appendfsync always; redis-py {versions.get('redis-py')}, "
                    f"hiredis {versions.get('hiredis')})")
    if "null" in versions:
        caption += ", null: no broker, pika's ceiling (bench/nullamqp.py)"
    peers = " and ".join(SIDE_NAMES[side] for side in sides if side != "ackbus")
    fig.suptitle(f"ackbus{' vs ' + peers if peers else ''}, persistent messages, durable queues, publisher confirms",
                 fontsize=12)
    fig.text(0.01, 0.005, caption, fontsize=7, color="#444", wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 0.98))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

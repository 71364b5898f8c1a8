"""The growth chart (``scripts/bench --plot``): ``docs/benchmarks-growth.png``, next to
the main chart, drawn when growth workloads (``bench.growth``) were measured.

One panel per kind of work, both axes on a log scale, x the work (queues bound to the
fanout exchange, publishing channels, queued messages):

- fan-out: confirmed msgs/s and deliveries/s (msgs/s × queues);
- publisher channels: confirmed msgs/s;
- memory: broker RSS after filling, after recovery, and the data directory on disk (MiB);
- recovery: restart after ``kill -9`` until ready (s).

Each series is drawn at the median with a min–max whisker, and beside it a dashed
reference line through its first point for "cost grows as the work": msgs/s falling as
1/queues (each queue costing what the first did), deliveries/s and the channels'
msgs/s flat (each delivery, each channel's message costing the same), MiB and seconds
proportional to the messages. A measured line above the reference (for rates) or below
it (for MiB, s) means the cost grew more slowly than the work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.stats import SIDE_NAMES, SIDES, Summary

__all__ = ["growth_chart_path", "growth_series", "plot_growth", "without_growth"]

PREFIX = "growth_"

# panel -> (workload, metric key, series label, reference slope on log-log axes)
# A reference of slope s through the first point (x0, y0) is y0 · (x / x0) ** s.
PANELS: tuple[tuple[str, str, tuple[tuple[str, str, str, float], ...]], ...] = (
    ("fan-out to N queues, one publisher — higher is better", "queues bound to the fanout exchange", (
        ("growth_fanout", "msgs_per_s", "confirmed msgs/s", -1.0),
        ("growth_fanout", "deliveries_per_s", "deliveries/s (msgs/s × queues)", 0.0),
    )),
    ("N publisher channels at once, one queue — higher is better", "publishing channels", (
        ("growth_publishers", "msgs_per_s", "confirmed msgs/s", 0.0),
    )),
    ("memory with N queued 100 B messages — lower is better", "queued messages", (
        ("growth_memory", "rss_filled_mib", "RSS after filling (MiB)", 1.0),
        ("growth_memory", "rss_recovered_mib", "RSS after recovery (MiB)", 1.0),
        ("growth_memory", "disk_mib", "data directory on disk (MiB)", 1.0),
    )),
    ("restart after kill -9 with N queued — lower is better", "queued messages", (
        ("growth_memory", "recovery_s", "start → ready (s)", 1.0),
    )),
)

COLORS = ("#2b6cb0", "#c05621", "#2f855a")
SIDE_MARKERS = {"ackbus": "o", "rabbitmq": "s"}


def without_growth(summaries: Sequence[Summary]) -> list[Summary]:
    """The summaries that belong on the main chart (not a growth workload's)."""
    return [s for s in summaries if not s.figure.workload.startswith(PREFIX)]


def growth_chart_path(plot_file: Path) -> Path:
    """``docs/benchmarks.png`` -> ``docs/benchmarks-growth.png``."""
    return plot_file.with_name(f"{plot_file.stem}-growth{plot_file.suffix or '.png'}")


def growth_series(
    summaries: Sequence[Summary], workload: str, metric: str, side: str
) -> list[tuple[float, float, float, float]]:
    """(work, median, min, max) of one measured series, by work, from the figures keyed
    ``<workload>/<work>/<metric>``."""
    out = []
    for s in summaries:
        parts = s.figure.key.split("/")
        if len(parts) != 3 or parts[0] != workload or parts[2] != metric or not s.n(side):
            continue
        median = s.stat(side, "median")
        if math.isnan(median):
            continue
        out.append((float(parts[1]), median, s.stat(side, "min"), s.stat(side, "max")))
    return sorted(out)


def plot_growth(summaries: Sequence[Summary], results: dict[str, Any], path: Path) -> bool:
    """Draw the growth chart to ``path`` if any growth figure was measured; say whether."""
    growth = [s for s in summaries if s.figure.workload.startswith(PREFIX)]
    panels = [(title, xlabel, series) for title, xlabel, series in PANELS
              if any(growth_series(growth, w, m, side) for w, m, _, _ in series for side in SIDES)]
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ticks = FuncFormatter(lambda value, _pos: _short(value))

    cols = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.4 * rows + 0.6), squeeze=False)
    for ax, (title, xlabel, series) in zip(axes.flat, panels):
        for color, (workload, metric, label, slope) in zip(COLORS, series):
            for side in SIDES:
                points = growth_series(growth, workload, metric, side)
                if not points:
                    continue
                xs = [p[0] for p in points]
                ys = [p[1] for p in points]
                err = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
                name = label if side == "ackbus" else f"{label}, {SIDE_NAMES[side]}"
                ax.errorbar(xs, ys, yerr=err, color=color, marker=SIDE_MARKERS[side],
                            linestyle="-" if side == "ackbus" else ":", capsize=3, label=name)
                x0, y0 = xs[0], ys[0]
                ax.plot(xs, [y0 * (x / x0) ** slope for x in xs], color=color, linestyle="--", alpha=0.45,
                        linewidth=1)
                for x, y in zip(xs, ys):
                    ax.annotate(_short(y), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                                color=color)
        ax.plot([], [], color="#555", linestyle="--", alpha=0.6, label="reference: cost grows as the work")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.margins(x=0.12)  # room for the last point's label
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ticks)
            axis.set_minor_formatter(NullFormatter())
        low, high = ax.get_ylim()
        if high / low < 20:  # less than about a decade: label the minor ticks too
            ax.yaxis.set_minor_formatter(ticks)
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_xlabel(xlabel, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    machine, versions = results.get("machine", {}), results.get("versions", {})
    rounds = ", ".join(f"{name} {n}" for name, n in _rounds(results).items())
    caption = (
        f"medians over the rounds ({rounds}), whiskers min–max; dashed: through the first point, the cost "
        f"growing exactly as the work. {machine.get('nproc')} × {machine.get('cpu', '?')}, "
        f"{machine.get('ram_gib')} GiB RAM. ackbus {versions.get('ackbus', '?')} "
        f"(Python {machine.get('python')}, fsync always)"
    )
    if "rabbitmq" in versions:
        caption += f"; RabbitMQ {versions['rabbitmq']} ({versions.get('erlang')}, pika {versions.get('pika')})"
    who = "ackbus and RabbitMQ" if any(growth_series(growth, w, m, "rabbitmq") for _, _, series in panels
                                       for w, m, _, _ in series) else "ackbus"
    fig.suptitle(f"{who}: growth with work (persistent messages, durable queues, publisher confirms)", fontsize=12)
    fig.text(0.01, 0.005, caption, fontsize=7, color="#444", wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _rounds(results: dict[str, Any]) -> dict[str, int]:
    """Successful rounds per growth workload (results may merge invocations with
    different ``--rounds``)."""
    out: dict[str, set[int]] = {}
    for run in results.get("runs", ()):
        if run["workload"].startswith(PREFIX) and not run.get("error"):
            out.setdefault(run["workload"], set()).add(run["round"])
    return {name: len(rounds) for name, rounds in out.items()}


def _short(value: float) -> str:
    """1234567 -> 1.23M, 45678 -> 45.7k, 12.3 -> 12.3."""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.3g}{suffix}"
    return f"{value:.3g}"

"""Figures, their summaries (median, min, max over rounds) and the result tables."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["Figure", "Summary", "fmt", "markdown_table", "summarize", "text_table"]

SIDES = ("ackbus", "rabbitmq")
SIDE_NAMES = {"ackbus": "ackbus", "rabbitmq": "RabbitMQ"}


@dataclasses.dataclass(frozen=True)
class Figure:
    key: str  # workload/variant/metric, the key in a run's "figures"
    workload: str
    label: str  # what was measured, e.g. "one-at-a-time publish, 100 B"
    metric: str  # e.g. "msgs/s", "p99 ms"
    higher_is_better: bool


@dataclasses.dataclass(frozen=True)
class Summary:
    figure: Figure
    values: Mapping[str, Sequence[float]]  # side -> one value per successful round

    def stat(self, side: str, fn: str) -> float:
        values = [v for v in self.values.get(side, ()) if not math.isnan(v)]
        if not values:
            return math.nan
        return {"median": statistics.median, "min": min, "max": max}[fn](values)

    def n(self, side: str) -> int:
        return len(self.values.get(side, ()))

    @property
    def ratio(self) -> float:
        """ackbus median / RabbitMQ median (nan without both)."""
        a, r = self.stat("ackbus", "median"), self.stat("rabbitmq", "median")
        if math.isnan(a) or math.isnan(r) or r == 0:
            return math.nan
        return a / r

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.figure.key, "label": self.figure.label, "metric": self.figure.metric,
                               "higher_is_better": self.figure.higher_is_better}
        for side in SIDES:
            if self.n(side):
                out[side] = {fn: self.stat(side, fn) for fn in ("median", "min", "max")} | {
                    "values": list(self.values[side])}
        out["ratio"] = None if math.isnan(self.ratio) else self.ratio
        return out


def summarize(figures: Iterable[Figure], runs: Sequence[Mapping[str, Any]]) -> list[Summary]:
    """One summary per figure over the successful runs (``runs`` as saved in results)."""
    out = []
    for figure in figures:
        values: dict[str, list[float]] = {}
        for run in runs:
            if run.get("error") or run["workload"] != figure.workload:
                continue
            value = run["figures"].get(figure.key)
            if value is not None:
                values.setdefault(run["side"], []).append(float(value))
        if values:
            out.append(Summary(figure, values))
    return out


def fmt(value: float) -> str:
    """Three significant figures, thousands separated: 12,345 · 123 · 12.3 · 1.23 · 0.123."""
    if math.isnan(value):
        return "–"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _cell(summary: Summary, side: str) -> str:
    if not summary.n(side):
        return "–"
    return f"{fmt(summary.stat(side, 'median'))} ({fmt(summary.stat(side, 'min'))}–{fmt(summary.stat(side, 'max'))})"


def _ratio(summary: Summary) -> str:
    ratio = summary.ratio
    if math.isnan(ratio):
        return "–"
    return f"{ratio:.2f}"


def _rows(summaries: Sequence[Summary], with_peer: bool) -> tuple[list[str], list[list[str]]]:
    header = ["figure", "metric", "ackbus median (min–max)"]
    if with_peer:
        header += ["RabbitMQ median (min–max)", "ackbus/RabbitMQ", "better"]
    rows = []
    for s in summaries:
        row = [s.figure.label, s.figure.metric, _cell(s, "ackbus")]
        if with_peer:
            row += [_cell(s, "rabbitmq"), _ratio(s), "higher" if s.figure.higher_is_better else "lower"]
        rows.append(row)
    return header, rows


def text_table(summaries: Sequence[Summary], with_peer: bool) -> str:
    header, rows = _rows(summaries, with_peer)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def markdown_table(summaries: Sequence[Summary], with_peer: bool) -> str:
    header, rows = _rows(summaries, with_peer)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)

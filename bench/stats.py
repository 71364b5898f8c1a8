"""Figures, their summaries (median, min, max over rounds) and the result tables.

ackbus is always measured; any of the ``PEERS`` may be measured beside it. Each peer
present gets its columns: its median (min–max) and the ratio "ackbus / peer" of the
medians, followed in brackets by the min–max of the per-round ratios where both sides
succeeded in the same round (the rounds are interleaved, so a round's ratio compares
runs made minutes apart under the same load).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "PEERS",
    "SIDES",
    "SIDE_NAMES",
    "Figure",
    "Summary",
    "fmt",
    "markdown_table",
    "parse_peers",
    "peers_of",
    "summarize",
    "text_table",
]

#: "null" is the null AMQP peer (``bench.server_nullamqp``): no broker, pika's ceiling
PEERS = ("rabbitmq", "redis", "null")
SIDES = ("ackbus", *PEERS)
SIDE_NAMES = {"ackbus": "ackbus", "rabbitmq": "RabbitMQ", "redis": "Redis", "null": "null"}


def parse_peers(text: str | None) -> list[str]:
    """``--peer``: a comma-separated list of peers, any order, repeats ignored;
    returned in ``PEERS`` order (the order of the runs and of the table's columns).

    Raises:
        ValueError: an unknown or empty name.
    """
    if not text:
        return []
    names = [name.strip().lower() for name in text.split(",")]
    unknown = [name for name in names if name not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(repr(n) for n in unknown)}; choose from {', '.join(PEERS)}")
    return [peer for peer in PEERS if peer in names]


def peers_of(options: Mapping[str, Any]) -> list[str]:
    """The peers of saved results: ``options["peers"]`` (a list), or ``options["peer"]``
    of results saved before there were several (one name or None)."""
    if options.get("peers") is not None:
        return [peer for peer in PEERS if peer in options["peers"]]
    return parse_peers(options.get("peer"))


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
    # side -> the round number of each value (empty for summaries made without them)
    rounds: Mapping[str, Sequence[int]] = dataclasses.field(default_factory=dict)

    def stat(self, side: str, fn: str) -> float:
        values = [v for v in self.values.get(side, ()) if not math.isnan(v)]
        if not values:
            return math.nan
        return {"median": statistics.median, "min": min, "max": max}[fn](values)

    def n(self, side: str) -> int:
        return len(self.values.get(side, ()))

    def ratio_to(self, peer: str) -> float:
        """ackbus median / ``peer`` median (nan without both)."""
        a, r = self.stat("ackbus", "median"), self.stat(peer, "median")
        if math.isnan(a) or math.isnan(r) or r == 0:
            return math.nan
        return a / r

    @property
    def ratio(self) -> float:
        """ackbus median / RabbitMQ median (nan without both)."""
        return self.ratio_to("rabbitmq")

    def round_ratios(self, peer: str) -> list[float]:
        """ackbus / ``peer`` of each round in which both sides have a value."""
        by_round = {
            side: {r: v for r, v in zip(self.rounds.get(side, ()), self.values.get(side, ())) if not math.isnan(v)}
            for side in ("ackbus", peer)
        }
        return [
            value / by_round[peer][r]
            for r, value in sorted(by_round["ackbus"].items())
            if r in by_round[peer] and by_round[peer][r] != 0
        ]

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.figure.key, "label": self.figure.label, "metric": self.figure.metric,
                               "higher_is_better": self.figure.higher_is_better}
        for side in SIDES:
            if self.n(side):
                out[side] = {fn: self.stat(side, fn) for fn in ("median", "min", "max")} | {
                    "values": list(self.values[side])}
        out["ratio"] = None if math.isnan(self.ratio) else self.ratio
        ratios = {}
        for peer in PEERS:
            if self.n(peer):
                median, per_round = self.ratio_to(peer), self.round_ratios(peer)
                ratios[peer] = {"median_ratio": None if math.isnan(median) else median, "per_round": per_round}
        out["ratios"] = ratios
        return out


def summarize(figures: Iterable[Figure], runs: Sequence[Mapping[str, Any]]) -> list[Summary]:
    """One summary per figure over the successful runs (``runs`` as saved in results)."""
    out = []
    for figure in figures:
        values: dict[str, list[float]] = {}
        rounds: dict[str, list[int]] = {}
        for run in runs:
            if run.get("error") or run["workload"] != figure.workload:
                continue
            value = run["figures"].get(figure.key)
            if value is not None:
                values.setdefault(run["side"], []).append(float(value))
                rounds.setdefault(run["side"], []).append(int(run.get("round", 0)))
        if values:
            out.append(Summary(figure, values, rounds))
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


def _ratio(summary: Summary, peer: str) -> str:
    """The ratio of medians, then the range of the per-round ratios when at least two
    rounds pair up: "0.52 (0.48–0.55)"."""
    ratio = summary.ratio_to(peer)
    if math.isnan(ratio):
        return "–"
    per_round = summary.round_ratios(peer)
    if len(per_round) < 2:
        return f"{ratio:.2f}"
    return f"{ratio:.2f} ({min(per_round):.2f}–{max(per_round):.2f})"


def _rows(summaries: Sequence[Summary], peers: Sequence[str] | bool) -> tuple[list[str], list[list[str]]]:
    if isinstance(peers, bool):  # the call of the RabbitMQ-only tables: with_peer
        peers = ["rabbitmq"] if peers else []
    header = ["figure", "metric", "ackbus median (min–max)"]
    for peer in peers:
        header += [f"{SIDE_NAMES[peer]} median (min–max)", f"ackbus/{SIDE_NAMES[peer]}"]
    if peers:
        header.append("better")
    rows = []
    for s in summaries:
        row = [s.figure.label, s.figure.metric, _cell(s, "ackbus")]
        for peer in peers:
            row += [_cell(s, peer), _ratio(s, peer)]
        if peers:
            row.append("higher" if s.figure.higher_is_better else "lower")
        rows.append(row)
    return header, rows


def text_table(summaries: Sequence[Summary], peers: Sequence[str] | bool = ()) -> str:
    """The table for a terminal: a column pair per peer in ``peers`` (see the module)."""
    header, rows = _rows(summaries, peers)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def markdown_table(summaries: Sequence[Summary], peers: Sequence[str] | bool = ()) -> str:
    """The same table in markdown."""
    header, rows = _rows(summaries, peers)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)

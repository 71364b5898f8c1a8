"""Prometheus metrics: counters, gauges and histograms, rendered as text format 0.0.4.

A tiny registry instead of ``prometheus_client`` because the broker needs little of it
and wants the hot path short: ``inc()`` and ``observe()`` run per message, so each is a
few attribute operations (``observe`` finds its bucket by bisection) and nothing is
formatted until a scrape calls :meth:`Registry.render`.

Rules:

- Pure: no trio, no IO, no clock. Time spans are measured by the caller and passed to
  ``observe``. The one exception, :func:`process_rss_bytes`, reads ``/proc`` and sits
  apart at the end of this module.
- Not thread-safe: update metrics from the trio thread. A worker thread (an fsync in
  ``trio.to_thread.run_sync``) should hand its measurement back to the caller, which
  observes it.
- A metric with label names is a family of children, one per label-value tuple:
  ``published.labels(queue="q").inc()``. Children are created on first use and live
  until :meth:`remove` or :meth:`clear`; code on a hot path looks its child up once and
  keeps it. An unlabeled metric has one child, and its own ``inc``/``set``/``observe``
  go to it.
- Per-entity numbers that the broker already keeps (queue depth, unacked count) need
  not be copied into metrics on every message: a Gauge or Counter built with
  ``collect=`` calls that function at render time instead. For a labeled metric it
  returns ``{label_values_tuple: value}`` (a plain string key is allowed when there is
  one label); for an unlabeled one a number, or None for "no sample now".
- Counter names end in ``_total``, as Prometheus and OpenMetrics name counters.

The output follows https://prometheus.io/docs/instrumenting/exposition_formats/
(text format 0.0.4): ``# HELP`` and ``# TYPE`` lines, label values escaped for ``\\``,
``"`` and newline, histograms as cumulative ``_bucket{le="…"}`` series ending with
``le="+Inf"`` plus ``_sum`` and ``_count``. Serve it with :data:`CONTENT_TYPE`.
"""

from __future__ import annotations

import math
import os
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Final, Generic, TypeVar

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_BUCKETS",
    "Collector",
    "Counter",
    "CounterChild",
    "Gauge",
    "GaugeChild",
    "Histogram",
    "HistogramChild",
    "Registry",
    "process_rss_bytes",
]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# Latency buckets from 50 µs (an in-memory publish) to 10 s (a long fsync stall or a
# slow consumer), on the 1-2.5-5 series prometheus_client uses.
DEFAULT_BUCKETS: Final[tuple[float, ...]] = (
    0.00005, 0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05,
    0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

# Keys are label-value tuples (or plain strings for one label). Typed Any because
# Mapping is invariant in its key: dict[tuple[str, str], int] is no
# Mapping[tuple[str, ...], float], and the callers' dicts should type-check as they are.
Collector = Callable[[], float | None | Mapping[Any, float]]
"""A render-time source of values; see the module docstring."""

_METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


# --------------------------------------------------------------------------- children


class CounterChild:
    """One counter series: a number that only goes up (until the process restarts)."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value: float = 0

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` (default 1). Raises ValueError if it is negative."""
        if amount < 0:
            raise ValueError(f"a counter only goes up: inc({amount!r})")
        self._value += amount

    @property
    def value(self) -> float:
        return self._value


class GaugeChild:
    """One gauge series: a number that goes up and down."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value: float = 0

    def inc(self, amount: float = 1) -> None:
        self._value += amount

    def dec(self, amount: float = 1) -> None:
        self._value -= amount

    def set(self, value: float) -> None:
        self._value = value

    @property
    def value(self) -> float:
        return self._value


class HistogramChild:
    """One histogram series: observation counts per bucket, their sum and count."""

    __slots__ = ("_upper", "_counts", "_sum")

    def __init__(self, upper_bounds: tuple[float, ...]) -> None:
        self._upper = upper_bounds
        # Not cumulative: _counts[i] counts upper[i-1] < v <= upper[i]; the last slot
        # is the +Inf bucket. Render accumulates.
        self._counts = [0] * (len(upper_bounds) + 1)
        self._sum: float = 0

    def observe(self, value: float) -> None:
        """Record one observation (a finite number; a bucket's bound is inclusive)."""
        self._counts[bisect_left(self._upper, value)] += 1
        self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    @property
    def sum(self) -> float:
        return self._sum

    def cumulative_buckets(self) -> list[tuple[float, int]]:
        """``[(upper_bound, observations <= bound), …, (inf, count)]``, as rendered."""
        out = []
        running = 0
        for bound, n in zip((*self._upper, math.inf), self._counts):
            running += n
            out.append((bound, running))
        return out


_Child = TypeVar("_Child", CounterChild, GaugeChild, HistogramChild)
_ScalarChild = TypeVar("_ScalarChild", CounterChild, GaugeChild)


# --------------------------------------------------------------------------- families


class _Metric(Generic[_Child]):
    """A named metric: its children keyed by label values, or a render-time collector."""

    type_name: ClassVar[str]

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        collect: Collector | None = None,
    ) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        labelnames = tuple(labelnames)
        for label in labelnames:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} in metric {name}")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"duplicate label names in metric {name}: {labelnames}")
        self.name = name
        # Parsers (Prometheus' own included) drop the whitespace around HELP text.
        self.documentation = documentation.strip()
        self.labelnames: tuple[str, ...] = labelnames
        self._collect = collect
        self._children: dict[tuple[str, ...], _Child] = {}
        # Rendered `{a="x",b="y"}` per child, made once: labels never change.
        self._label_text: dict[tuple[str, ...], str] = {}
        self._solo: _Child | None = None
        if not labelnames and collect is None:
            self._solo = self.labels()

    def _new_child(self) -> _Child:
        raise NotImplementedError

    def labels(self, *values: object, **by_name: object) -> _Child:
        """The child for these label values, created on first use.

        Values may be given in label-name order or by name, and are converted with
        ``str``. An unlabeled metric's ``labels()`` returns its only child. Raises
        ValueError when the values do not match the label names, or when the metric
        is fed by ``collect=``.
        """
        if self._collect is not None:
            raise ValueError(f"metric {self.name} is computed by its collect function")
        if by_name:
            if values or set(by_name) != set(self.labelnames):
                raise ValueError(f"metric {self.name} takes labels {self.labelnames}, got {tuple(by_name)}")
            values = tuple(by_name[label] for label in self.labelnames)
        elif len(values) != len(self.labelnames):
            raise ValueError(f"metric {self.name} takes labels {self.labelnames}, got {len(values)} values")
        key = tuple(str(value) for value in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
            self._label_text[key] = _label_text(self.labelnames, key)
        return child

    def remove(self, *values: object, **by_name: object) -> None:
        """Forget one child (a deleted queue's series); no error if it never existed."""
        if by_name:
            values = tuple(by_name.get(label, "") for label in self.labelnames)
        key = tuple(str(value) for value in values)
        self._children.pop(key, None)
        self._label_text.pop(key, None)

    def clear(self) -> None:
        """Forget every child of a labeled metric."""
        if self.labelnames:
            self._children.clear()
            self._label_text.clear()

    def _only(self) -> _Child:
        if self._solo is None:
            why = "computed by its collect function" if self._collect else f"labeled {self.labelnames}: use .labels()"
            raise ValueError(f"metric {self.name} is {why}")
        return self._solo

    def _series(self) -> Iterator[tuple[str, _Child]]:
        for key, child in self._children.items():
            yield self._label_text[key], child

    def _collected(self) -> Iterator[tuple[str, float]]:
        assert self._collect is not None
        result = self._collect()
        if result is None:
            return
        if not isinstance(result, Mapping):
            if self.labelnames:
                raise ValueError(f"collect of labeled metric {self.name} must return a mapping")
            yield "", result
            return
        for key, value in result.items():
            values = (key,) if isinstance(key, str) else tuple(str(part) for part in key)
            if len(values) != len(self.labelnames):
                raise ValueError(f"collect of metric {self.name} gave labels {values!r} for {self.labelnames}")
            yield _label_text(self.labelnames, values), value

    def _render_samples(self, out: list[str]) -> None:
        raise NotImplementedError

    def render_into(self, out: list[str]) -> None:
        """Append this metric's lines (HELP, TYPE, samples) to ``out``.

        Raises whatever a ``collect`` function raises.
        """
        out.append(f"# HELP {self.name} {_escape_help(self.documentation)}")
        out.append(f"# TYPE {self.name} {self.type_name}")
        self._render_samples(out)


class _Scalar(_Metric[_ScalarChild]):
    """A metric whose series each hold one number."""

    def _render_samples(self, out: list[str]) -> None:
        name = self.name
        if self._collect is not None:
            for labels, value in self._collected():
                out.append(f"{name}{labels} {_format_value(value)}")
            return
        for labels, child in self._series():
            out.append(f"{name}{labels} {_format_value(child.value)}")


class Counter(_Scalar[CounterChild]):
    """A count of events: messages published, bytes written, connections refused."""

    type_name = "counter"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        collect: Collector | None = None,
    ) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter name {name!r} must end in _total")
        super().__init__(name, documentation, labelnames, collect=collect)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` to an unlabeled counter. Raises ValueError if negative."""
        self._only().inc(amount)

    @property
    def value(self) -> float:
        return self._only().value


class Gauge(_Scalar[GaugeChild]):
    """A level: connections open, WAL bytes, messages ready in a queue."""

    type_name = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def inc(self, amount: float = 1) -> None:
        self._only().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._only().dec(amount)

    def set(self, value: float) -> None:
        self._only().set(value)

    @property
    def value(self) -> float:
        return self._only().value


class Histogram(_Metric[HistogramChild]):
    """A distribution: publish-to-confirm latency, fsync duration, batch size."""

    type_name = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Iterable[float] = DEFAULT_BUCKETS,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds and bounds[-1] == math.inf:
            bounds.pop()  # +Inf is always there
        if not bounds:
            raise ValueError(f"histogram {name} needs at least one finite bucket")
        if any(not math.isfinite(b) for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"histogram {name} buckets must be finite and strictly increasing: {bounds}")
        if "le" in labelnames:
            raise ValueError(f"histogram {name} cannot have a label named 'le'")
        self.buckets: tuple[float, ...] = tuple(bounds)
        self._le = [f'le="{_format_value(b)}"' for b in (*bounds, math.inf)]
        super().__init__(name, documentation, labelnames)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.buckets)

    def observe(self, value: float) -> None:
        """Record one observation in an unlabeled histogram."""
        self._only().observe(value)

    @property
    def count(self) -> int:
        return self._only().count

    @property
    def sum(self) -> float:
        return self._only().sum

    def _render_samples(self, out: list[str]) -> None:
        name = self.name
        for labels, child in self._series():
            # `{a="x"}` becomes `{a="x",le="…"}`; no labels becomes `{le="…"}`.
            prefix = labels[:-1] + "," if labels else "{"
            running = 0
            for le, n in zip(self._le, child._counts):
                running += n
                out.append(f"{name}_bucket{prefix}{le}}} {running}")
            out.append(f"{name}_sum{labels} {_format_value(child.sum)}")
            out.append(f"{name}_count{labels} {running}")


# --------------------------------------------------------------------------- registry

_AnyMetric = TypeVar("_AnyMetric", Counter, Gauge, Histogram)


class Registry:
    """The metrics of one broker, rendered together for a scrape.

    A registry per broker (not a global) keeps tests independent of each other.
    """

    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}

    def register(self, metric: _AnyMetric) -> _AnyMetric:
        """Add ``metric`` and return it. Raises ValueError if its name is taken."""
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric
        return metric

    def unregister(self, metric: Counter | Gauge | Histogram) -> None:
        """Remove ``metric``; no error if it is not registered."""
        if self._metrics.get(metric.name) is metric:
            del self._metrics[metric.name]

    def get(self, name: str) -> Counter | Gauge | Histogram | None:
        return self._metrics.get(name)

    def counter(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), *, collect: Collector | None = None
    ) -> Counter:
        """Create and register a :class:`Counter`."""
        return self.register(Counter(name, documentation, labelnames, collect=collect))

    def gauge(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), *, collect: Collector | None = None
    ) -> Gauge:
        """Create and register a :class:`Gauge`."""
        return self.register(Gauge(name, documentation, labelnames, collect=collect))

    def histogram(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Iterable[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        """Create and register a :class:`Histogram`."""
        return self.register(Histogram(name, documentation, labelnames, buckets=buckets))

    def render(self) -> str:
        """Every metric in registration order, as Prometheus text format 0.0.4.

        Raises whatever a ``collect`` function raises, or ValueError when one returns
        values that do not fit its labels.
        """
        out: list[str] = []
        for metric in self._metrics.values():
            metric.render_into(out)
        out.append("")
        return "\n".join(out)


# --------------------------------------------------------------------------- formatting


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_text(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{_escape_label_value(v)}"' for n, v in zip(names, values)) + "}"


def _format_value(value: float) -> str:
    """A sample value as Go's ParseFloat reads it: ints exact, ``+Inf``, ``NaN``."""
    if type(value) is int:
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


# --------------------------------------------------------------------------- process (IO)


def process_rss_bytes(statm_path: str = "/proc/self/statm") -> int | None:
    """Resident set size of this process in bytes, or None where /proc is unavailable.

    Reads ``/proc/self/statm`` (Linux; second field = resident pages). This is the one
    function in the module that does IO; it is meant for a ``collect=`` gauge such as
    ``process_resident_memory_bytes``, so it runs at scrape time only.
    """
    try:
        with open(statm_path, "rb") as file:
            resident_pages = int(file.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None

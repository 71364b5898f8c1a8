"""Metrics: the rendered text parses as Prometheus 0.0.4 and says what was recorded."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import (
    CONTENT_TYPE,
    DEFAULT_BUCKETS,
    Counter,
    Gauge,
    Histogram,
    Registry,
    process_rss_bytes,
)


def parse(text: str) -> dict[str, Any]:
    """{family name: family} from prometheus_client's own parser."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_content_type() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_empty_registry_renders_empty() -> None:
    assert Registry().render() == ""


def test_counter_gauge_histogram_render_and_parse() -> None:
    registry = Registry()
    published = registry.counter("ackbus_published_total", "Messages published.")
    connections = registry.gauge("ackbus_connections", "Open connections.")
    latency = registry.histogram("ackbus_confirm_seconds", "Publish to confirm.", buckets=(0.1, 1.0))
    published.inc()
    published.inc(2)
    connections.inc(5)
    connections.dec()
    latency.observe(0.05)
    latency.observe(0.1)  # a bound is inclusive: le="0.1"
    latency.observe(3.0)

    text = registry.render()
    assert text.endswith("\n")
    assert "# TYPE ackbus_published_total counter" in text
    assert "# HELP ackbus_connections Open connections." in text
    families = parse(text)
    assert families["ackbus_published"].type == "counter"
    assert families["ackbus_connections"].type == "gauge"
    assert families["ackbus_confirm_seconds"].type == "histogram"
    assert families["ackbus_published"].documentation == "Messages published."
    values = samples(text)
    assert values[("ackbus_published_total", ())] == 3
    assert values[("ackbus_connections", ())] == 4
    assert values[("ackbus_confirm_seconds_bucket", (("le", "0.1"),))] == 2
    assert values[("ackbus_confirm_seconds_bucket", (("le", "1.0"),))] == 2
    assert values[("ackbus_confirm_seconds_bucket", (("le", "+Inf"),))] == 3
    assert values[("ackbus_confirm_seconds_count", ())] == 3
    assert values[("ackbus_confirm_seconds_sum", ())] == pytest.approx(3.15)


def test_unlabeled_metrics_render_zero_before_any_update() -> None:
    registry = Registry()
    registry.counter("a_total", "a")
    registry.histogram("h", "h", buckets=(1,))
    values = samples(registry.render())
    assert values[("a_total", ())] == 0
    assert values[("h_bucket", (("le", "+Inf"),))] == 0
    assert values[("h_count", ())] == 0


def test_labels_by_position_or_name_share_a_child() -> None:
    registry = Registry()
    delivered = registry.counter("ackbus_delivered_total", "Deliveries.", ["queue", "redelivered"])
    delivered.labels("orders", True).inc()
    delivered.labels(queue="orders", redelivered="True").inc(4)
    delivered.labels("audit", False).inc()
    values = samples(registry.render())
    assert values[("ackbus_delivered_total", (("queue", "orders"), ("redelivered", "True")))] == 5
    assert values[("ackbus_delivered_total", (("queue", "audit"), ("redelivered", "False")))] == 1


def test_labeled_histogram_puts_le_last() -> None:
    registry = Registry()
    wait = registry.histogram("ackbus_wait_seconds", "Wait.", ["queue"], buckets=(1, 2))
    wait.labels(queue="q").observe(1.5)
    text = registry.render()
    assert 'ackbus_wait_seconds_bucket{queue="q",le="2.0"} 1' in text
    values = samples(text)
    assert values[("ackbus_wait_seconds_bucket", (("le", "1.0"), ("queue", "q")))] == 0
    assert values[("ackbus_wait_seconds_count", (("queue", "q"),))] == 1


@settings(deadline=None)  # a loaded CI machine must not fail a pure test
@given(st.text(), st.text())
def test_label_values_and_help_round_trip_through_the_parser(value: str, help_text: str) -> None:
    registry = Registry()
    registry.gauge("g", help_text, ["queue"]).labels(queue=value).set(1.5)
    (family,) = text_string_to_metric_families(registry.render())
    assert family.documentation == help_text.strip()
    (sample,) = family.samples
    assert sample.labels == {"queue": value}
    assert sample.value == 1.5


def test_escaping_of_backslash_quote_and_newline() -> None:
    registry = Registry()
    registry.counter("c_total", "line one\nback\\slash", ["q"]).labels(q='a\\b"c\nd').inc()
    text = registry.render()
    assert "# HELP c_total line one\\nback\\\\slash" in text
    assert 'c_total{q="a\\\\b\\"c\\nd"} 1' in text


@settings(deadline=None)  # a loaded CI machine must not fail a pure test
@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), max_size=200),
    st.lists(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False), min_size=1, max_size=20, unique=True),
)
def test_histogram_buckets_are_cumulative_and_right(observations: list[float], bounds: list[float]) -> None:
    bounds.sort()
    registry = Registry()
    histogram = registry.histogram("h", "h", buckets=bounds)
    for value in observations:
        histogram.observe(value)
    values = samples(registry.render())

    rendered = []
    for bound in bounds:
        expected = sum(1 for v in observations if v <= bound)
        rendered.append(values[("h_bucket", (("le", repr(float(bound))),))])
        assert rendered[-1] == expected
    assert rendered == sorted(rendered)  # cumulative: never decreasing
    assert values[("h_bucket", (("le", "+Inf"),))] == len(observations)
    assert values[("h_count", ())] == len(observations)
    assert values[("h_sum", ())] == pytest.approx(math.fsum(observations), rel=1e-9, abs=1e-6)
    assert histogram.labels().cumulative_buckets()[-1] == (math.inf, len(observations))


def test_default_buckets_span_50us_to_10s() -> None:
    assert DEFAULT_BUCKETS[0] == 0.00005
    assert DEFAULT_BUCKETS[-1] == 10.0
    assert list(DEFAULT_BUCKETS) == sorted(set(DEFAULT_BUCKETS))
    assert Histogram("h", "h").buckets == DEFAULT_BUCKETS


def test_collect_gauges_are_computed_at_render_time() -> None:
    depth = {"orders": 3, "audit": 0}
    registry = Registry()
    registry.gauge("ackbus_queue_messages_ready", "Ready.", ["queue"], collect=lambda: dict(depth))
    registry.gauge(
        "ackbus_queue_consumers", "Consumers.", ["vhost", "queue"], collect=lambda: {("/", "orders"): 2}
    )
    registry.gauge("ackbus_uptime_seconds", "Uptime.", collect=lambda: 12.5)
    registry.gauge("ackbus_missing", "Absent now.", collect=lambda: None)
    registry.counter("ackbus_acked_total", "Acks.", ["queue"], collect=lambda: {("orders",): 9})

    values = samples(registry.render())
    assert values[("ackbus_queue_messages_ready", (("queue", "orders"),))] == 3
    assert values[("ackbus_queue_consumers", (("queue", "orders"), ("vhost", "/")))] == 2
    assert values[("ackbus_uptime_seconds", ())] == 12.5
    assert values[("ackbus_acked_total", (("queue", "orders"),))] == 9
    assert not any(name == "ackbus_missing" for name, _ in values)
    assert "# TYPE ackbus_missing gauge" in registry.render()

    depth["orders"] = 7
    del depth["audit"]
    values = samples(registry.render())
    assert values[("ackbus_queue_messages_ready", (("queue", "orders"),))] == 7
    assert ("ackbus_queue_messages_ready", (("queue", "audit"),)) not in values


def test_collect_metrics_cannot_be_updated_by_hand() -> None:
    gauge = Gauge("g", "g", collect=lambda: 1)
    with pytest.raises(ValueError, match="collect"):
        gauge.set(3)
    labeled = Gauge("l", "l", ["q"], collect=lambda: {})
    with pytest.raises(ValueError, match="collect"):
        labeled.labels(q="x")


def test_collect_results_that_do_not_fit_are_errors() -> None:
    registry = Registry()
    registry.gauge("g", "g", ["a", "b"], collect=lambda: {("only-one",): 1})
    with pytest.raises(ValueError, match="gave labels"):
        registry.render()
    registry = Registry()
    registry.gauge("g", "g", ["a"], collect=lambda: 1.0)
    with pytest.raises(ValueError, match="must return a mapping"):
        registry.render()


def test_special_values() -> None:
    registry = Registry()
    registry.gauge("inf", "i").set(math.inf)
    registry.gauge("neg", "n").set(-math.inf)
    registry.gauge("nan", "n").set(math.nan)
    registry.gauge("flag", "f").set(True)
    registry.gauge("tiny", "t").set(1e-300)
    text = registry.render()
    assert "inf +Inf" in text and "neg -Inf" in text and "nan NaN" in text
    values = samples(text)
    assert values[("inf", ())] == math.inf
    assert math.isnan(values[("nan", ())])
    assert values[("flag", ())] == 1
    assert values[("tiny", ())] == 1e-300


def test_counter_rules() -> None:
    counter = Counter("c_total", "c")
    with pytest.raises(ValueError, match="only goes up"):
        counter.inc(-1)
    counter.inc(0.5)
    assert counter.value == 0.5
    with pytest.raises(ValueError, match="must end in _total"):
        Counter("c", "c")


def test_labeled_metric_needs_labels() -> None:
    counter = Counter("c_total", "c", ["queue"])
    with pytest.raises(ValueError, match="use .labels"):
        counter.inc()
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("a", "b")
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels(queu="a")
    histogram = Histogram("h", "h", ["queue"])
    with pytest.raises(ValueError):
        histogram.observe(1.0)


@pytest.mark.parametrize(
    "build",
    [
        lambda: Gauge("1bad", "x"),
        lambda: Gauge("has-dash", "x"),
        lambda: Gauge("g", "x", ["bad-label"]),
        lambda: Gauge("g", "x", ["__reserved"]),
        lambda: Gauge("g", "x", ["a", "a"]),
        lambda: Histogram("h", "x", ["le"]),
        lambda: Histogram("h", "x", buckets=()),
        lambda: Histogram("h", "x", buckets=(2, 1)),
        lambda: Histogram("h", "x", buckets=(1, 1)),
        lambda: Histogram("h", "x", buckets=(math.nan,)),
    ],
)
def test_invalid_definitions(build: Any) -> None:
    with pytest.raises(ValueError):
        build()


def test_histogram_accepts_explicit_inf_bucket() -> None:
    assert Histogram("h", "h", buckets=(1, 2, math.inf)).buckets == (1.0, 2.0)


def test_registry_names_are_unique_and_ordered() -> None:
    registry = Registry()
    first = registry.gauge("b", "b")
    registry.gauge("a", "a")
    with pytest.raises(ValueError, match="already registered"):
        registry.gauge("b", "again")
    assert list(parse(registry.render())) == ["b", "a"]
    assert registry.get("b") is first
    registry.unregister(first)
    assert registry.get("b") is None
    assert list(parse(registry.render())) == ["a"]


def test_remove_and_clear_children() -> None:
    registry = Registry()
    ready = registry.gauge("ready", "r", ["queue"])
    ready.labels(queue="gone").set(1)
    ready.labels(queue="kept").set(2)
    ready.remove("gone")
    ready.remove(queue="never-existed")
    assert list(samples(registry.render())) == [("ready", (("queue", "kept"),))]
    ready.clear()
    assert samples(registry.render()) == {}


def test_gauge_set_inc_dec_values() -> None:
    gauge = Gauge("g", "g")
    gauge.set(10)
    gauge.inc(2.5)
    gauge.dec()
    assert gauge.value == 11.5
    assert gauge.labels() is gauge.labels()  # the one child of an unlabeled metric


def test_process_rss_bytes(tmp_path: pathlib.Path) -> None:
    statm = pathlib.Path("/proc/self/statm")
    if statm.exists():
        rss = process_rss_bytes()
        assert rss is not None and rss > 1024 * 1024
    assert process_rss_bytes(str(tmp_path / "absent")) is None
    garbled = tmp_path / "statm"
    garbled.write_text("not numbers\n")
    assert process_rss_bytes(str(garbled)) is None
    fake = tmp_path / "fake"
    fake.write_text("100 25 3 1 0 9 0\n")
    rss = process_rss_bytes(str(fake))
    assert rss is not None and rss % 25 == 0


def test_rss_gauge_from_collect() -> None:
    registry = Registry()
    registry.gauge("process_resident_memory_bytes", "Resident memory.", collect=process_rss_bytes)
    parse(registry.render())

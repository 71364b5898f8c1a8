"""``GET /metrics`` and ``GET /overview`` of a real broker process.

The exposition is read with prometheus_client's own text parser (a test dependency
only; the broker renders it itself, see broker/metrics.py), and the counters are
checked to move exactly as a known sequence of publishes, deliveries, acks and
requeues says they must.
"""

from __future__ import annotations

import http.client
import re
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.broker import ROOT, BrokerProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow

# family name (as the parser reports it: counters without `_total`) -> type
EXPECTED_FAMILIES = {
    "ackbus_locks_held": "gauge",
    "ackbus_lock_waiters": "gauge",
    "ackbus_lock_acquisitions": "counter",
    "ackbus_lock_expiries": "counter",
    "ackbus_schedules": "gauge",
    "ackbus_schedule_ticks": "counter",
    "ackbus_schedule_ticks_skipped": "counter",
    "ackbus_schedule_tick_lateness_seconds": "histogram",
    "ackbus_queue_messages_delayed": "gauge",
    "ackbus_messages_dead_lettered": "counter",
    "ackbus_dead_letters_dropped": "counter",
    "ackbus_connections": "gauge",
    "ackbus_connections_accepted": "counter",
    "ackbus_connections_rejected": "counter",
    "ackbus_http_requests": "counter",
    "ackbus_tls_handshake_failures": "counter",
    "ackbus_auth_failures": "counter",
    "ackbus_auth_refused": "counter",
    "ackbus_channels": "gauge",
    "ackbus_consumers": "gauge",
    "ackbus_queues": "gauge",
    "ackbus_queue_messages_ready": "gauge",
    "ackbus_queue_messages_unacked": "gauge",
    "ackbus_queue_consumers": "gauge",
    "ackbus_queue_published": "counter",
    "ackbus_queue_delivered": "counter",
    "ackbus_queue_acked": "counter",
    "ackbus_queue_redelivered": "counter",
    "ackbus_published": "counter",
    "ackbus_confirms_nacked": "counter",
    "ackbus_returned": "counter",
    "ackbus_deduplicated": "counter",
    "ackbus_confirm_latency_seconds": "histogram",
    "ackbus_wal_bytes_written": "counter",
    "ackbus_wal_records_written": "counter",
    "ackbus_wal_fsyncs": "counter",
    "ackbus_wal_fsync_seconds": "histogram",
    "ackbus_wal_segments": "gauge",
    "ackbus_storage_ok": "gauge",
    "ackbus_checkpoints": "counter",
    "ackbus_checkpoint_seconds": "histogram",
    "ackbus_messages_paged_out": "gauge",
    "ackbus_messages_lost": "counter",
    "ackbus_log_read_failures": "counter",
    "ackbus_unconfirmed_dropped": "counter",
    "ackbus_queues_waiting_for_log_reads": "gauge",
    "ackbus_memory_bytes": "gauge",
    "ackbus_memory_high_watermark_bytes": "gauge",
    "ackbus_memory_alarm": "gauge",
    "ackbus_disk_alarm": "gauge",
    "ackbus_publishing_blocked": "gauge",
    "ackbus_publishes_refused_blocked": "counter",
    "ackbus_exchange_messages_in": "counter",
    "ackbus_exchange_messages_out": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
    "process_start_time_seconds": "gauge",
}


class Scrape:
    """One parsed ``/metrics`` answer."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(self, sample_name: str, **labels: str) -> float:
        """The value of the one sample named ``sample_name`` with exactly ``labels``."""
        family = sample_name
        for suffix in ("_total", "_bucket", "_sum", "_count"):
            if sample_name.endswith(suffix) and sample_name.removesuffix(suffix) in self.families:
                family = sample_name.removesuffix(suffix)
        found = [
            s.value
            for s in self.families[family].samples
            if s.name == sample_name and s.labels == labels
        ]
        assert len(found) == 1, f"{sample_name}{labels}: {found}"
        return float(found[0])

    def queue(self, name: str, queue: str) -> float:
        return self.value(name, queue=queue)


def scrape(broker: BrokerProcess) -> Scrape:
    conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, body
        assert resp.getheader("content-type") == "text/plain; version=0.0.4; charset=utf-8"
    finally:
        conn.close()
    return Scrape(body.decode("utf-8"))


def until_event(ch: RawChannel, ev: str) -> list[dict[str, Any]]:
    """Read events up to and including the first ``ev``; return them all."""
    seen = []
    while True:
        event = ch.next_event()
        seen.append(event)
        if event["ev"] == ev:
            return seen


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    with BrokerProcess(tmp_path / "data", args=("--checkpoint-interval-s", "1")) as b:
        yield b


def test_every_family_is_present_typed_and_documented(broker: BrokerProcess) -> None:
    s = scrape(broker)
    types = {name: f.type for name, f in s.families.items()}
    assert types == EXPECTED_FAMILIES
    for family in s.families.values():
        assert family.documentation, f"{family.name} has no HELP text"
    doc = (ROOT / "docs" / "operations.md").read_text()
    for name, kind in EXPECTED_FAMILIES.items():
        shown = name + "_total" if kind == "counter" else name
        assert f"`{shown}`" in doc, f"docs/operations.md does not describe {shown}"
    # No queue yet: the per-queue families exist, with no series.
    assert s.families["ackbus_queue_messages_ready"].samples == []
    assert s.value("ackbus_storage_ok") == 1
    assert s.value("process_resident_memory_bytes") > 10 * 2**20
    assert s.value("ackbus_memory_alarm") == 0 and s.value("ackbus_publishing_blocked") == 0
    assert 10 * 2**20 < s.value("ackbus_memory_bytes") < s.value("ackbus_memory_high_watermark_bytes")
    assert 0 < s.value("process_open_fds") <= s.value("process_max_fds")
    assert abs(s.value("process_start_time_seconds") - time.time()) < 120
    assert s.value("ackbus_connections") >= 1  # this scrape


def test_counters_follow_publish_deliver_ack_requeue(broker: BrokerProcess) -> None:
    assert broker.request("PUT", "/queues/mq", {})[0] == 201
    before = scrape(broker)
    assert before.queue("ackbus_queue_published_total", "mq") == 0

    pub = RawChannel(broker.port)
    pub.send(*({"op": "publish", "routing_key": "mq", "body": f"m{i}"} for i in range(50)))
    pub.send({"op": "close"})
    events = until_event(pub, "close_ok")
    pub.close()
    assert [e for e in events if e["ev"] == "ack"][-1]["delivery_tag"] == 50

    s = scrape(broker)
    assert s.queue("ackbus_queue_published_total", "mq") == 50
    assert s.queue("ackbus_queue_messages_ready", "mq") == 50
    assert s.queue("ackbus_queue_messages_unacked", "mq") == 0
    assert s.value("ackbus_published_total") - before.value("ackbus_published_total") == 50
    assert s.value("ackbus_wal_bytes_written_total") > before.value("ackbus_wal_bytes_written_total")
    assert s.value("ackbus_wal_records_written_total") >= before.value("ackbus_wal_records_written_total") + 50
    fsyncs = s.value("ackbus_wal_fsyncs_total")
    assert fsyncs > before.value("ackbus_wal_fsyncs_total")
    # One fsync latency observation per WAL fsync.
    assert s.value("ackbus_wal_fsync_seconds_count") == fsyncs
    assert s.value("ackbus_wal_fsync_seconds_bucket", le="+Inf") == fsyncs

    # A consumer fills its prefetch of 20.
    ch = RawChannel(broker.port)
    ch.send({"op": "consume", "queue": "mq", "prefetch": 20, "consumer_tag": "c"})
    deliveries = [e for e in until_event(ch, "consume_ok") if e["ev"] == "deliver"]
    while len(deliveries) < 20:
        event = ch.next_event()
        if event["ev"] == "deliver":
            deliveries.append(event)
    s = scrape(broker)
    assert s.value("ackbus_channels") == 1
    assert s.value("ackbus_consumers") == 1
    assert s.queue("ackbus_queue_consumers", "mq") == 1
    assert s.queue("ackbus_queue_delivered_total", "mq") == 20
    assert s.queue("ackbus_queue_messages_unacked", "mq") == 20
    assert s.queue("ackbus_queue_messages_ready", "mq") == 30

    # Cancel, then ack 10 and requeue 5; `qos` is answered after both are applied.
    ch.send(
        {"op": "cancel", "consumer_tag": "c"},
        {"op": "ack", "delivery_tag": deliveries[9]["delivery_tag"], "multiple": True},
        *({"op": "nack", "delivery_tag": d["delivery_tag"], "requeue": True} for d in deliveries[10:15]),
        {"op": "qos", "prefetch": 5, "id": "barrier"},
    )
    until_event(ch, "ok")
    s = scrape(broker)
    assert s.value("ackbus_consumers") == 0
    assert s.queue("ackbus_queue_acked_total", "mq") == 10
    assert s.queue("ackbus_queue_messages_unacked", "mq") == 5
    assert s.queue("ackbus_queue_messages_ready", "mq") == 35
    assert s.queue("ackbus_queue_redelivered_total", "mq") == 0

    # Consuming again brings the 5 requeued messages first, redelivered.
    ch.send({"op": "consume", "queue": "mq", "prefetch": 5, "consumer_tag": "c2"})
    again = [e for e in until_event(ch, "consume_ok") if e["ev"] == "deliver"]
    while len(again) < 5:
        event = ch.next_event()
        if event["ev"] == "deliver":
            again.append(event)
    assert all(d["redelivered"] for d in again)
    s = scrape(broker)
    assert s.queue("ackbus_queue_delivered_total", "mq") == 25
    assert s.queue("ackbus_queue_redelivered_total", "mq") == 5
    assert s.queue("ackbus_queue_messages_unacked", "mq") == 10

    # Closing the channel returns its 10 unacked deliveries.
    ch.send({"op": "close"})
    until_event(ch, "close_ok")
    ch.close()
    deadline = time.monotonic() + 5
    while scrape(broker).value("ackbus_channels") != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    s = scrape(broker)
    assert s.value("ackbus_channels") == 0
    assert s.queue("ackbus_queue_messages_ready", "mq") == 40
    assert s.queue("ackbus_queue_messages_unacked", "mq") == 0
    assert s.queue("ackbus_queue_acked_total", "mq") == 10

    # A deleted queue's series disappear.
    assert broker.request("DELETE", "/queues/mq")[0] in (200, 204)
    assert 'queue="mq"' not in scrape(broker).text


def test_checkpoint_metrics_move(broker: BrokerProcess) -> None:
    assert broker.request("PUT", "/queues/cq", {})[0] == 201
    s = scrape(broker)
    assert s.value("ackbus_checkpoint_seconds_count") == 0
    # The WAL grew, so the 1 s checkpoint timer writes one.
    deadline = time.monotonic() + 10
    while scrape(broker).value("ackbus_checkpoints_total") < 1:
        assert time.monotonic() < deadline, "no checkpoint within 10 s"
        time.sleep(0.1)
    s = scrape(broker)
    assert s.value("ackbus_checkpoint_seconds_count") == s.value("ackbus_checkpoints_total")
    assert s.value("ackbus_checkpoint_seconds_sum") > 0


def test_confirm_latency_is_observed(broker: BrokerProcess) -> None:
    assert broker.request("PUT", "/queues/lq", {})[0] == 201
    ch = RawChannel(broker.port)
    for i in range(5):
        ch.send({"op": "publish", "routing_key": "lq", "body": f"m{i}"})
        until_event(ch, "ack")
    ch.close()
    s = scrape(broker)
    count = s.value("ackbus_confirm_latency_seconds_count")
    assert 1 <= count <= 5
    assert 0 < s.value("ackbus_confirm_latency_seconds_sum") < 5


def test_label_values_are_escaped(broker: BrokerProcess) -> None:
    name = 'we"ird\\queue'
    from urllib.parse import quote

    assert broker.request("PUT", "/queues/" + quote(name, safe=""), {})[0] == 201
    s = scrape(broker)
    assert s.queue("ackbus_queue_messages_ready", name) == 0


def test_overview_json_agrees_with_metrics(broker: BrokerProcess) -> None:
    assert broker.request("PUT", "/queues/oq", {})[0] == 201
    status, body = broker.request("POST", "/exchanges/amq.default/publish?routing_key=oq", b"hello")
    assert status == 200 and body["confirm"] == "ack", body
    status, overview = broker.request("GET", "/overview")
    assert status == 200
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", overview["version"])
    assert overview["ready"] is True
    assert overview["uptime_s"] >= 0
    assert overview["totals"]["queues"] == 1
    assert overview["totals"]["messages_ready"] == 1
    storage = overview["storage"]
    assert storage["enabled"] and storage["ok"]
    assert storage["durable_lsn"] == storage["last_lsn"] > 0
    s = scrape(broker)
    assert s.value("ackbus_queues") == overview["totals"]["queues"]
    assert s.value("ackbus_published_total") == overview["stats"]["published"]
    assert s.value("ackbus_wal_fsyncs_total") >= storage["wal_fsyncs"]

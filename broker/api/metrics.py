"""The broker's Prometheus metrics and the ``GET /metrics`` endpoint.

Numbers the core already keeps (queue depths, per-queue counters, connection counts)
are read at scrape time through ``collect=`` functions, so the hot path pays nothing
for them; only latencies are observed as they happen, by whoever measures them
(``observe_fsync`` from the WAL callback, ``observe_checkpoint`` after a checkpoint,
``observe_confirm`` from the runtime's book of pending publishes). The core is read
through its views (``broker.core.BrokerViews``), never its live state. The metrics reference in
docs/operations.md lists every family; a system test checks that it matches.
"""

from __future__ import annotations

from typing import Any

from broker.http import Request, Response
from broker.metrics import CONTENT_TYPE, Registry, process_rss_bytes
from broker.runtime import fd_info

__all__ = ["BrokerMetrics"]


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = Registry()
        r = self.registry
        self._runtime: Any = None
        self._server: Any = None
        self._auth: Any = None
        self.confirm_latency = r.histogram(
            "ackbus_confirm_latency_seconds",
            "Time from receiving a publish to sending its confirm (one observation per confirmed publish).",
        )
        self.fsync_latency = r.histogram("ackbus_wal_fsync_seconds", "Duration of WAL fsyncs.")
        self.checkpoint_duration = r.histogram(
            "ackbus_checkpoint_seconds",
            "Duration of checkpoints.",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )

        def server_stat(name: str) -> Any:
            return lambda: getattr(self._server.statistics(), name) if self._server else None

        def views() -> Any:
            return self._runtime.core.views

        def core_stat(name: str) -> Any:
            return lambda: views().stat(name) if self._runtime else None

        def wal_stat(name: str) -> Any:
            def read() -> Any:
                wal = self._runtime.wal if self._runtime else None
                return getattr(wal.statistics(), name) if wal is not None else None

            return read

        def per_queue(counter: str) -> Any:
            def read() -> Any:
                if self._runtime is None:
                    return {}
                return {(name,): n for name, n in views().queue_counters(counter).items()}

            return read

        r.gauge("ackbus_connections", "Open HTTP connections.", collect=server_stat("open_connections"))
        r.counter("ackbus_connections_accepted_total", "HTTP connections accepted.", collect=server_stat("total_accepted"))
        r.counter("ackbus_http_requests_total", "HTTP requests served.", collect=server_stat("requests_served"))
        r.counter(
            "ackbus_tls_handshake_failures_total", "TLS handshakes that failed or timed out.",
            collect=server_stat("tls_handshake_failures"),
        )
        r.counter(
            "ackbus_auth_failures_total", "Requests with wrong credentials (answered 401).",
            collect=lambda: self._auth.failed if self._auth is not None else None,
        )
        r.counter(
            "ackbus_auth_refused_total", "Requests refused unchecked: too many failed logins from the address (429).",
            collect=lambda: self._auth.refused if self._auth is not None else None,
        )
        r.gauge(
            "ackbus_channels",
            "Open channels (including streams).",
            collect=lambda: len(self._runtime.sinks) if self._runtime else None,
        )
        r.gauge(
            "ackbus_consumers",
            "Consumers.",
            collect=lambda: views().totals()["consumers"] if self._runtime else None,
        )
        r.gauge("ackbus_queues", "Queues.", collect=lambda: views().queue_count() if self._runtime else None)
        r.gauge("ackbus_queue_messages_ready", "Messages ready for delivery.", ["queue"], collect=per_queue("messages_ready"))
        r.gauge("ackbus_queue_messages_unacked", "Messages delivered and not yet acked.", ["queue"], collect=per_queue("messages_unacked"))
        r.gauge("ackbus_queue_consumers", "Consumers per queue.", ["queue"], collect=per_queue("consumers"))
        r.counter("ackbus_queue_published_total", "Messages enqueued.", ["queue"], collect=per_queue("published"))
        r.counter("ackbus_queue_delivered_total", "Messages delivered (incl. redeliveries).", ["queue"], collect=per_queue("delivered"))
        r.counter("ackbus_queue_acked_total", "Deliveries acked.", ["queue"], collect=per_queue("acked"))
        r.counter("ackbus_queue_redelivered_total", "Redeliveries.", ["queue"], collect=per_queue("redelivered"))
        r.gauge("ackbus_queue_messages_delayed", "Messages held back by a delay.", ["queue"], collect=per_queue("messages_delayed"))

        def dead_lettered() -> Any:
            if self._runtime is None:
                return {}
            return views().dead_lettered()

        r.counter(
            "ackbus_messages_dead_lettered_total",
            "Messages that left a queue as dead letters (rejected, expired, maxlen, delivery_limit); "
            "counted whether or not the queue has a dead-letter exchange.",
            ["queue", "reason"],
            collect=dead_lettered,
        )
        r.counter(
            "ackbus_dead_letters_dropped_total",
            "Dead letters dropped: their dead-letter exchange was missing or routed nowhere, or a cycle.",
            ["reason"],
            collect=lambda: {(k,): v for k, v in views().dead_letter_drops().items()} if self._runtime else {},
        )
        r.counter("ackbus_published_total", "Publishes received.", collect=core_stat("published"))
        r.counter("ackbus_confirms_nacked_total", "Publishes nacked.", collect=core_stat("nacked"))
        r.counter("ackbus_returned_total", "Mandatory messages returned unroutable.", collect=core_stat("returned"))
        r.counter("ackbus_deduplicated_total", "Publishes dropped as duplicates.", collect=core_stat("deduplicated"))
        r.counter("ackbus_wal_bytes_written_total", "Bytes appended to the WAL.", collect=wal_stat("bytes_written"))
        r.counter("ackbus_wal_records_written_total", "Records appended to the WAL.", collect=wal_stat("records_written"))
        r.counter("ackbus_wal_fsyncs_total", "WAL fsyncs.", collect=wal_stat("fsyncs"))
        r.gauge("ackbus_wal_segments", "WAL segment files.", collect=wal_stat("segments"))
        r.gauge(
            "ackbus_storage_ok",
            "1 when the log accepts writes, 0 while writes fail.",
            collect=lambda: int(views().storage_ok()) if self._runtime else None,
        )
        r.counter(
            "ackbus_checkpoints_total",
            "Checkpoints written.",
            collect=lambda: self._runtime.checkpoints if self._runtime else None,
        )
        r.gauge(
            "ackbus_messages_paged_out",
            "Queued messages whose body is only in the WAL segments.",
            collect=lambda: views().paged_out_total() if self._runtime else None,
        )
        r.counter(
            "ackbus_messages_lost_total",
            "Paged-out messages given up because their record is unreadable (only with --repair).",
            collect=lambda: self._runtime.notices.messages_lost if self._runtime else None,
        )
        r.counter(
            "ackbus_unconfirmed_dropped_total",
            "Queued-message references dropped at recovery because their records are not on disk "
            "(publishes that were never confirmed).",
            collect=lambda: self._runtime.unconfirmed_dropped if self._runtime else None,
        )
        r.counter(
            "ackbus_log_read_failures_total",
            "Failed reads of paged-out messages from the log (the message is kept and retried).",
            collect=lambda: self._runtime.notices.log_read_failures if self._runtime else None,
        )
        r.gauge(
            "ackbus_queues_waiting_for_log_reads",
            "Queues whose next message cannot be read back from the log yet.",
            collect=lambda: len(self._runtime.read_blocked_queues()) if self._runtime else None,
        )
        r.counter(
            "ackbus_connections_rejected_total",
            "HTTP connections answered 503 because max_connections was reached.",
            collect=server_stat("rejected_connections"),
        )
        # Coordination: locks and schedules (docs/coordination.md)
        def coord(name: str) -> Any:
            return lambda: views().coordination_counts()[name] if self._runtime else None

        r.gauge("ackbus_locks_held", "Locks held right now.", collect=coord("locks_held"))
        r.gauge("ackbus_lock_waiters", "Acquires waiting in line for a held lock.", collect=coord("lock_waiters"))
        r.counter(
            "ackbus_lock_acquisitions_total",
            "Locks granted (each took a new fencing token).",
            collect=coord("lock_acquisitions"),
        )
        r.counter(
            "ackbus_lock_expiries_total",
            "Locks freed by their expiry (their holder neither refreshed nor released them).",
            collect=coord("lock_expiries"),
        )
        r.gauge("ackbus_schedules", "Schedules.", collect=coord("schedules"))

        def per_schedule(attr: str) -> Any:
            def read() -> Any:
                if self._runtime is None:
                    return {}
                return {(name,): n for name, n in views().schedule_counters(attr).items()}

            return read

        r.counter("ackbus_schedule_ticks_total", "Ticks fired (messages published), since the start.",
                  ["schedule"], collect=per_schedule("ticks_fired"))
        r.counter("ackbus_schedule_ticks_skipped_total",
                  "Ticks not fired: missed while the broker was down or stalled, by the schedule's policy.",
                  ["schedule"], collect=per_schedule("ticks_skipped"))
        self.tick_lateness = r.histogram(
            "ackbus_schedule_tick_lateness_seconds",
            "How long after its nominal time each tick was published.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60, 600),
        )
        # Resource alarms (docs/operations.md, "Memory and disk alarms")
        def runtime_attr(read: Any) -> Any:
            return lambda: read(self._runtime) if self._runtime else None

        r.gauge("ackbus_memory_bytes", "Resident memory as the memory alarm last sampled it (every 0.5 s).",
                collect=runtime_attr(lambda rt: rt.memory.used))
        r.gauge("ackbus_memory_high_watermark_bytes", "The memory alarm's threshold (absent: no alarm).",
                collect=runtime_attr(lambda rt: rt.memory.watermark))
        r.gauge("ackbus_memory_alarm", "1 while the memory alarm is raised (publishes wait, then are refused).",
                collect=runtime_attr(lambda rt: int(rt.memory.alarm)))
        r.gauge("ackbus_disk_alarm", "1 while the disk alarm is raised (the log's space reserve is used up).",
                collect=runtime_attr(lambda rt: int("disk" in rt.flow.alarms)))
        r.gauge("ackbus_publishing_blocked", "1 while publishing is blocked by any alarm.",
                collect=runtime_attr(lambda rt: int(rt.flow.blocked)))
        r.counter("ackbus_publishes_refused_blocked_total",
                  "Publishes refused because publishing stayed blocked, or their deadline came first.",
                  collect=runtime_attr(lambda rt: rt.flow.refused))

        def per_exchange(direction: str) -> Any:
            def read() -> Any:
                if self._runtime is None:
                    return {}
                # the default exchange ("") under the name its REST path uses
                return {(name or "amq.default",): n for name, n in views().exchange_counters(direction).items()}

            return read

        r.counter("ackbus_exchange_messages_in_total", "Messages published to an exchange.",
                  ["exchange"], collect=per_exchange("messages_in"))
        r.counter("ackbus_exchange_messages_out_total",
                  "Messages an exchange routed to at least one queue.",
                  ["exchange"], collect=per_exchange("messages_out"))
        # Process metrics under the names every Prometheus client library uses, so
        # that existing dashboards and alerts apply.
        r.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", collect=process_rss_bytes)
        r.gauge("process_open_fds", "Number of open file descriptors.", collect=lambda: fd_info()["open"])
        r.gauge("process_max_fds", "Maximum number of open file descriptors.", collect=lambda: fd_info()["limit"])
        r.gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            collect=lambda: self._runtime.started_at if self._runtime else None,
        )

    def bind(self, runtime: Any, server: Any, auth: Any = None) -> None:
        self._runtime = runtime
        self._server = server
        self._auth = auth

    def observe_fsync(self, duration_s: float) -> None:
        self.fsync_latency.observe(duration_s)

    def observe_checkpoint(self, duration_s: float) -> None:
        self.checkpoint_duration.observe(duration_s)

    def observe_confirm(self, duration_s: float) -> None:
        self.confirm_latency.observe(duration_s)

    def observe_tick_lateness(self, lateness_s: float) -> None:
        self.tick_lateness.observe(lateness_s)

    def handler(self, runtime: Any) -> Any:
        async def metrics(request: Request, response: Response) -> None:
            body = self.registry.render().encode()
            await response.send_bytes(200, body, content_type=CONTENT_TYPE)

        return metrics

"""``python -m broker`` (the ``ackbus-broker`` script): run the broker until a signal.

SIGINT/SIGTERM start a graceful shutdown (exit 0 when done); a second one exits at
once, which loses nothing acknowledged because an ack is only sent for data already
on disk. SIGHUP reopens the log file (for logrotate).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import trio

from broker.config import ConfigError, Settings, load_settings
from broker.http.app import BrokerApp
from broker.http.limits import Limits
from broker.http.runtime import BrokerRuntime, RuntimeOptions
from broker.logs import configure_logging, reopen_log_files

log = logging.getLogger("ackbus")


def runtime_options(settings: Settings) -> RuntimeOptions:
    return RuntimeOptions(
        data_dir=settings.data_dir,
        fsync=settings.fsync,
        segment_max_bytes=settings.segment_max_bytes,
        checkpoint_interval_s=settings.checkpoint_interval_s,
        checkpoint_wal_bytes=settings.checkpoint_wal_bytes,
        repair=settings.repair,
        dedup_window_s=settings.dedup_window_s,
        default_lease_s=settings.default_lease_s,
        max_lease_s=settings.max_lease_s,
        consumer_timeout_s=settings.consumer_timeout_s,
        channel_buffer_bytes=settings.channel_buffer_bytes,
        max_queues=settings.max_queues,
        max_exchanges=settings.max_exchanges,
        max_prefetch=settings.max_prefetch,
        max_channels=settings.max_channels,
        max_wait_s=settings.max_wait_s,
        max_body_bytes=settings.max_body_bytes,
    )


def http_limits(settings: Settings) -> Limits:
    return Limits(
        max_header_bytes=settings.max_header_bytes,
        max_body_bytes=settings.max_body_bytes,
        header_timeout_s=settings.header_timeout_s,
        idle_timeout_s=settings.idle_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_connections=settings.max_connections,
    )


def build_app(settings: Settings) -> BrokerApp:
    from broker.http.metrics import BrokerMetrics

    metrics = BrokerMetrics()
    runtime = BrokerRuntime(runtime_options(settings), metrics=metrics)
    app = BrokerApp(runtime, http_limits(settings), metrics_handler=metrics.handler(runtime))
    metrics.bind(runtime, app.server)
    return app


async def run(settings: Settings) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; return the exit code."""
    app = build_app(settings)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(app.serve, settings.host, settings.port)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    try:
                        reopen_log_files()
                        log.info("log files reopened")
                    except OSError as exc:
                        log.error("could not reopen the log file", extra={"fields": {"error": str(exc)}})
                    continue
                log.info(
                    "shutting down",
                    extra={"fields": {"signal": signal.Signals(signum).name, "timeout_s": settings.shutdown_timeout_s}},
                )
                nursery.start_soon(_exit_on_second_signal, signals)
                drained = await app.shutdown(settings.shutdown_timeout_s)
                log.info("stopped", extra={"fields": {"drained": drained}})
                nursery.cancel_scope.cancel()
                return 0
    return 0


async def _exit_on_second_signal(signals: Any) -> None:
    async for signum in signals:
        if signum == signal.SIGHUP:
            continue
        log.warning("second signal: exiting now")
        logging.shutdown()
        os._exit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    try:
        settings = load_settings(argv, os.environ)
        configure_logging(settings.log_level, settings.log_format, settings.log_file)
    except ConfigError as exc:
        print(f"ackbus-broker: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        code = trio.run(run, settings)
    except OSError as exc:
        log.error("cannot serve", extra={"fields": {"error": str(exc)}})
        sys.exit(1)
    sys.exit(code)


if __name__ == "__main__":
    main()

"""``python -m broker`` (the ``ackbus-broker`` script): run the broker until a signal.

Exit status: 0 after a graceful shutdown (SIGINT/SIGTERM), also when its deadline
passed; 1 when the broker cannot start or serve (address in use, unreadable data
directory, corrupt log); 2 for invalid settings; 128 + the signal number when a second
SIGINT/SIGTERM cut the shutdown short. A second signal exits at once and still loses
nothing acknowledged, because an ack is only ever sent for a record already on disk
(what was not yet synced is a torn tail that recovery truncates). SIGHUP reopens the
log file (for logrotate) and reloads the TLS certificate and key (open connections keep
the old one). ``python -m broker users ...`` manages users offline (``broker.admin``).

Signals are read with ``trio.open_signal_receiver`` for the whole run, so they are
handled on the trio thread between tasks, never inside a raw signal handler.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import ssl
import sys
from typing import Any

import trio

from broker.config import ConfigError, Settings, load_settings
from broker.logs import configure_logging, reopen_log_files
from broker.storage import FaultsNotAllowed, check_fault_environment

log = logging.getLogger("ackbus")

# The cyclic garbage collector's thresholds for a broker process. A publish allocates
# about ten tracked objects (its op, properties, message, queue entry, ...) that die
# by reference counting, and the broker creates almost no garbage cycles; with
# Python's default (a young-generation pass every 700 allocations) the collector ran
# every ~70 messages and cost ~10 % of the broker's CPU under pipelined publishing.
# Passes every 50,000 allocations bound the garbage cycles kept meanwhile to a few MB.
GC_THRESHOLDS = (50_000, 20, 100)


async def run(settings: Settings) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; return the exit code.

    Raises what starting or serving raises (``OSError`` when the address cannot be
    bound, ``StorageError`` when the log cannot be recovered), possibly inside
    exception groups; :func:`main` reports them.
    """
    # Imported here, not at the top: ``--help``, ``--version``, invalid settings and
    # ``users`` never load the API, the HTTP server's routes or the listeners.
    from broker.app import build_app

    app = build_app(settings)
    drained: bool | None = None
    # Opened before anything starts, so a signal that arrives during start-up is
    # queued and handled, not fatal.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(app.serve, settings.host, settings.port)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    _reopen_logs()
                    app.reload_tls()
                    continue
                log.info(
                    "shutting down",
                    extra={"fields": {"signal": signal.Signals(signum).name, "timeout_s": settings.shutdown_timeout_s}},
                )
                nursery.start_soon(_exit_on_second_signal, signals, app)
                drained = await app.shutdown(settings.shutdown_timeout_s)
                nursery.cancel_scope.cancel()
                break
    # Logged once every task has ended (a recovery in progress runs to its end).
    if drained is False:
        log.warning(
            "stopped",
            extra={
                "fields": {
                    "drained": False,
                    "detail": "the deadline passed first: some confirms were not sent; "
                    "the clients resend those publishes",
                }
            },
        )
    else:
        log.info("stopped", extra={"fields": {"drained": True}})
    return 0


def _reopen_logs() -> None:
    try:
        reopen_log_files()
    except OSError as exc:
        log.error("could not reopen the log file", extra={"fields": {"error": str(exc)}})
    else:
        log.info("log files reopened")


async def _exit_on_second_signal(signals: Any, app: Any) -> None:
    """During a graceful shutdown: exit at once on a second SIGINT/SIGTERM.

    ``os._exit`` skips every cleanup on purpose (that is what was asked for); nothing
    acknowledged is lost because acks are only sent for records already on disk.
    """
    async for signum in signals:
        if signum == signal.SIGHUP:
            _reopen_logs()
            app.reload_tls()
            continue
        log.warning("second signal: exiting now", extra={"fields": {"signal": signal.Signals(signum).name}})
        logging.shutdown()
        os._exit(128 + signum)


def _startup_failure(exc: BaseException) -> BaseException | None:
    """The error to report when the broker could not start or serve: an ``OSError``
    (address in use, data directory not writable) or a storage error (corrupt log),
    unwrapped from the exception groups trio's nurseries put it in. None when anything
    else is among what was raised: that is a bug, and keeps its traceback."""
    from broker.app import StartRefused
    from broker.storage import StorageError

    def leaves(e: BaseException) -> list[BaseException]:
        if isinstance(e, BaseExceptionGroup):
            return [leaf for inner in e.exceptions for leaf in leaves(inner)]
        return [e]

    found = leaves(exc)
    if all(isinstance(leaf, (OSError, StorageError, StartRefused, ssl.SSLError)) for leaf in found):
        return found[0]
    return None


def main(argv: list[str] | None = None) -> None:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["users"]:
        # Offline user management of a stopped broker's data directory.
        from broker.admin import main as users_main

        sys.exit(users_main(words[1:]))
    try:
        settings = load_settings(argv, os.environ)
        configure_logging(settings.log_level, settings.log_format, settings.log_file)
        check_fault_environment()
    except (ConfigError, FaultsNotAllowed, ValueError) as exc:
        print(f"ackbus-broker: {exc}", file=sys.stderr)
        sys.exit(2)
    from broker import __version__

    log.info("starting", extra={"fields": {"version": __version__, "pid": os.getpid(), **settings.as_dict()}})
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        code = trio.run(run, settings)
    except BaseException as exc:
        failure = _startup_failure(exc)
        if failure is None:
            raise
        log.error("cannot serve: %s", failure)
        logging.shutdown()
        sys.exit(1)
    sys.exit(code)


if __name__ == "__main__":
    main()

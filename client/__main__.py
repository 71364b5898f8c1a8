"""``python -m client`` / ``ackbus``: the broker from a terminal or a shell script.

Commands: ``declare``, ``bind``, ``publish``, ``consume``, ``get``, ``peek``,
``redrive``, ``purge``, ``delete``, ``queues``, ``exchanges``, ``bindings``, ``overview``, ``cluster``,
``channels``, ``lock`` (run a command holding a lock, like ``flock``), ``locks``,
``schedule`` (those three in ``cli_coordination.py``; see ``ackbus COMMAND --help``,
docs/client.md and docs/coordination.md). Exit status, for scripts:

====  =====================================================================
 0    success (``consume`` also when stopped by SIGINT/SIGTERM)
 1    the broker refused the request (unknown queue, conflicting declare, …)
 2    bad usage
 3    the broker could not be reached, or the connection was lost for good
 4    ``publish``: at least one message was not confirmed (nacked, returned,
      refused, timed out); the others were
 5    ``get``/``consume``: fewer messages than asked for arrived in time
 6    ``lock``: the lock was lost while the command ran (the command was stopped)
130   ``publish`` interrupted by a signal (what was read was still confirmed)
141   the reader of the output went away (``ackbus queues | head``): stopped
      quietly, as ``ls`` is by SIGPIPE
====  =====================================================================

Errors are printed once, by the CLI: the library's log records of failures that
reach the CLI as exceptions anyway are dropped (its retry warnings stay).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import IO, Any

import anyio
import orjson

from . import (
    BrokerError,
    ClientError,
    ConfirmTimeout,
    ConnectionLost,
    GracefulShutdown,
    PublishFailed,
    ReconnectPolicy,
    SomePublishesFailed,
    cli_admin,
    cli_output,
    connect,
    open_graceful_shutdown,
)
from ._version import __version__
from .cli_coordination import CoordinationCommands, add_coordination_commands
from .codec import Properties
from .connection import DEFAULT_URL, Connection
from .consumer import Message
from .endpoint import StreamOpener

__all__ = ["main", "run", "build_parser"]

EXIT_OK = 0
EXIT_BROKER_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_UNCONFIRMED = 4
EXIT_NOT_ENOUGH = 5
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a program killed by SIGPIPE


class _Usage(Exception):
    pass


def _key_value(text: str) -> tuple[str, Any]:
    """``k=v``; ``v`` is parsed as JSON when it is valid JSON, else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, orjson.loads(value)
    except orjson.JSONDecodeError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ackbus",
        description="Talk to an ackbus broker: declare, bind, publish, consume, get, peek, "
        "redrive, purge, delete, queues.",
        epilog="Exit status: 0 ok, 1 broker refused, 2 usage, 3 unreachable, "
        "4 unconfirmed publish, 5 not enough messages, 6 lock lost, 130 interrupted; "
        "lock: the command's own status.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--url", default=os.environ.get("ACKBUS_URL", DEFAULT_URL), type=_url,
                        help="broker URL or HOST:PORT (default: $ACKBUS_URL or %(default)s)")
    parser.add_argument("--user", default=os.environ.get("ACKBUS_USERNAME"), metavar="NAME",
                        help="authenticate as NAME; the password comes from $ACKBUS_PASSWORD "
                        "(never a flag: other users see flags in ps). A token: $ACKBUS_TOKEN")
    parser.add_argument("--cacert", default=os.environ.get("ACKBUS_CACERT"), metavar="PEM",
                        help="trust the broker's certificate if signed by this CA bundle "
                        "(default: $ACKBUS_CACERT, else the system's CAs)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="give up reaching the broker after S seconds (default %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("declare", help="declare a queue or an exchange")
    p.add_argument("kind", choices=["queue", "exchange"])
    p.add_argument("name")
    p.add_argument("--type", default="direct", choices=["direct", "fanout", "topic", "headers", "x-consistent-hash", "x-delayed-message"],
                   help="exchange type (default %(default)s)")
    p.add_argument("--transient", action="store_true", help="not durable")
    p.add_argument("--exclusive", action="store_true", help="queue: exclusive")
    p.add_argument("--auto-delete", action="store_true")
    p.add_argument("--arg", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="an argument (VALUE parsed as JSON if it is JSON); repeatable")

    p = sub.add_parser("bind", help="bind a queue (or an exchange) to an exchange")
    p.add_argument("exchange")
    p.add_argument("destination", help="queue name (exchange name with --to-exchange)")
    p.add_argument("--routing-key", "-k", default="")
    p.add_argument("--to-exchange", action="store_true", help="destination is an exchange")
    p.add_argument("--unbind", action="store_true", help="remove the binding instead")

    p = sub.add_parser("publish", help="publish one message, or one per stdin line, confirmed")
    p.add_argument("body", nargs="?", help="the message; without it, each stdin line is one")
    p.add_argument("--exchange", "-e", default="", help="exchange (default: the default exchange)")
    p.add_argument("--routing-key", "-k", default="", help="routing key (a queue name for the default exchange)")
    p.add_argument("--mandatory", action="store_true", help="fail if no queue gets the message")
    p.add_argument("--content-type")
    p.add_argument("--message-id", help="message id (single message only; default: generated)")
    p.add_argument("--correlation-id")
    p.add_argument("--reply-to")
    p.add_argument("--priority", type=int)
    p.add_argument("--expiration", type=int, metavar="MS")
    p.add_argument("--transient", action="store_true", help="delivery_mode 1 (not persisted)")
    p.add_argument("--header", type=_key_value, action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--max-pending", type=int, default=1000, help="confirms in flight (default %(default)s)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr (default: when stderr is a terminal)")

    p = sub.add_parser("consume", help="print messages as they arrive; ack each after printing")
    p.add_argument("queue")
    p.add_argument("--count", "-n", type=int, help="stop after exactly this many messages (prefetch at most N)")
    p.add_argument("--prefetch", type=int, default=10, help="unacked messages at a time (default %(default)s)")
    p.add_argument("--wait", type=float, metavar="S",
                   help="stop when no message came for S seconds (default: wait until -n is reached or a signal)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr: count, rate, elapsed (default: when stderr is a terminal)")

    p = sub.add_parser("get", help="fetch messages once (REST lease), print, ack")
    p.add_argument("queue", nargs="+", help="a queue; several: the first listed with messages answers")
    p.add_argument("--count", "-n", type=int, default=1, help="at most this many (default %(default)s)")
    p.add_argument("--wait", type=float, default=0.0, metavar="S", help="long-poll up to S seconds for the first")
    p.add_argument("--lease", type=float, default=30.0, metavar="S")
    p.add_argument("--requeue", action="store_true", help="put them back instead of acking (peek)")
    p.add_argument("--format", choices=["text", "json"], default="text")

    p = sub.add_parser("peek", help="show a queue's messages without consuming them (one JSON object each)")
    p.add_argument("queue")
    p.add_argument("--count", "-n", type=int, default=20, help="at most this many (default %(default)s)")
    p.add_argument("--after", type=int, default=0, metavar="SEQ", help="start after this sequence number")

    p = sub.add_parser("redrive", help="move messages out of a dead-letter queue (back to their origin)")
    p.add_argument("queue")
    p.add_argument("--count", "-n", type=int, default=100_000, help="at most this many (default %(default)s)")
    p.add_argument("--exchange", "-e", help="send them here instead of back to their origin")
    p.add_argument("--routing-key", "-k", help="with --exchange: this routing key (default: their own)")

    p = sub.add_parser("purge", help="drop a queue's ready and delayed messages")
    p.add_argument("queue")

    p = sub.add_parser("delete", help="delete a queue or an exchange")
    p.add_argument("kind", choices=["queue", "exchange"])
    p.add_argument("name")

    p = sub.add_parser("queues", help="table of queues and their counts")
    p.add_argument("--json", action="store_true", help="one JSON object per queue instead")
    cli_admin.add_parsers(sub)

    add_coordination_commands(sub, _key_value)
    return parser


def _url(text: str) -> str:
    """``host:port`` (or a bare host) is taken as ``http://host:port``; several,
    comma-separated, name nodes of one cluster (any live one serves)."""
    return ",".join(part if "://" in part else f"http://{part}" for part in (p.strip() for p in text.split(",")) if part)


async def run(
    argv: Sequence[str],
    *,
    stdin: IO[bytes] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    open_stream: StreamOpener | None = None,
    handle_signals: bool = True,
) -> int:
    """Run one CLI command; return the exit status (see the module docstring)."""
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    parser = build_parser()
    argv = list(argv)
    tail: list[str] = []
    if "--" in argv:  # ``lock NAME -- COMMAND ARGS``: the command's own options stay its own
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1 :]
    try:
        args = parser.parse_args(argv)
        if tail and args.command != "lock":
            parser.error("'--' is for the command of 'ackbus lock'")
    except SystemExit as exc:
        return int(exc.code or 0)
    if tail:
        args.cmd = list(args.cmd) + tail
    policy = ReconnectPolicy(give_up_after_s=args.timeout)
    # A long-poll ``get --wait`` must not time out before the broker answers.
    request_timeout_s = max(args.timeout, (getattr(args, "wait", None) or 0.0) + 10.0)
    cli = _CliWithCoordination(args, stdin, stdout, stderr)
    client_log = logging.getLogger("ackbus.client")
    client_log.addFilter(cli_output.drop_raised)
    try:
        credentials: dict[str, Any] = {}
        if args.user:
            credentials = {"username": args.user, "password": os.environ.get("ACKBUS_PASSWORD", "")}
        async with connect(
            args.url, open_stream=open_stream, reconnect=policy, ca_file=args.cacert, **credentials,
            connect_timeout_s=min(10.0, args.timeout), request_timeout_s=request_timeout_s,
        ) as conn:
            if handle_signals:
                async with open_graceful_shutdown() as shutdown:
                    shutdown.attach(conn)
                    cli.shutdown = shutdown
                    status = await cli.dispatch(conn)
                if shutdown.aborted:
                    return EXIT_INTERRUPTED
                return status
            return await cli.dispatch(conn)
    except _Usage as exc:
        stderr.write(f"ackbus: error: {exc}\n")
        return EXIT_USAGE
    except ConnectionLost as exc:
        stderr.write(f"ackbus: cannot reach the broker: {exc}\n")
        return EXIT_UNREACHABLE
    except BrokerError as exc:
        stderr.write(f"ackbus: broker error: {exc}\n")
        return EXIT_BROKER_ERROR
    except ClientError as exc:
        stderr.write(f"ackbus: error: {exc}\n")
        return EXIT_BROKER_ERROR
    except ValueError as exc:  # bad property values
        stderr.write(f"ackbus: error: {exc}\n")
        return EXIT_USAGE
    finally:
        client_log.removeFilter(cli_output.drop_raised)


class _Cli:
    def __init__(self, args: argparse.Namespace, stdin: IO[bytes], stdout: IO[str], stderr: IO[str]) -> None:
        self.args = args
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.shutdown: GracefulShutdown | None = None

    def shutdown_requested(self) -> bool:
        return self.shutdown is not None and self.shutdown.requested

    def _stop_on_shutdown(self) -> anyio.CancelScope:
        """A cancel scope cancelled when a graceful shutdown is requested (so a read
        blocked on an idle stdin stops too)."""
        scope = anyio.CancelScope()
        shutdown = self.shutdown
        if shutdown is not None:
            if shutdown.requested:
                scope.cancel()
            else:
                shutdown.on_request(scope.cancel)
        return scope

    async def dispatch(self, conn: Connection) -> int:
        command: str = self.args.command
        try:
            admin = cli_admin.COMMANDS.get(command)
            if admin is not None:
                await admin(conn, self.args, self.stdout)
                return EXIT_OK
            handler = getattr(self, "cmd_" + command)
            status: int = await handler(conn)
            return status
        except BrokenPipeError:
            if not cli_output.pipe_reader_gone(self.stdout):
                raise  # (a socket's, not the output's)
            return EXIT_BROKEN_PIPE

    # --- declare / bind ---------------------------------------------------------------

    async def cmd_declare(self, conn: Connection) -> int:
        a = self.args
        arguments = dict(a.arg)
        if a.kind == "queue":
            await conn.declare_queue(a.name, durable=not a.transient, exclusive=a.exclusive,
                                     auto_delete=a.auto_delete, arguments=arguments)
        else:
            await conn.declare_exchange(a.name, a.type, durable=not a.transient,
                                        auto_delete=a.auto_delete, arguments=arguments)
        self.stdout.write(f"declared {a.kind} {a.name}\n")
        return EXIT_OK

    async def cmd_bind(self, conn: Connection) -> int:
        a = self.args
        call = conn.unbind if a.unbind else conn.bind
        if a.to_exchange:
            await call(a.exchange, to_exchange=a.destination, routing_key=a.routing_key)
        else:
            await call(a.exchange, a.destination, routing_key=a.routing_key)
        kind = "exchange" if a.to_exchange else "queue"
        verb = "unbound" if a.unbind else "bound"
        self.stdout.write(f"{verb} {kind} {a.destination} {'from' if a.unbind else 'to'} exchange "
                          f"{a.exchange or 'amq.default'} (routing key {a.routing_key!r})\n")
        return EXIT_OK

    # --- publish ----------------------------------------------------------------------

    def _properties(self, message_id: str | None) -> Properties:
        a = self.args
        return Properties.coerce({
            "content_type": a.content_type,
            "correlation_id": a.correlation_id,
            "reply_to": a.reply_to,
            "priority": a.priority,
            "expiration": a.expiration,
            "delivery_mode": 1 if a.transient else None,
            "headers": dict(a.header) or None,
            "message_id": message_id,
        })

    async def cmd_publish(self, conn: Connection) -> int:
        a = self.args
        if a.max_pending < 1:
            raise _Usage("--max-pending must be >= 1")
        if a.body is not None:
            async with conn.channel() as ch:
                try:
                    await ch.publish(a.exchange, a.routing_key, os.fsencode(a.body),
                                     properties=self._properties(a.message_id), mandatory=a.mandatory)
                except (PublishFailed, ConfirmTimeout) as exc:
                    self.stderr.write(f"ackbus: not confirmed: {exc}\n")
                    return EXIT_UNCONFIRMED
            return EXIT_OK
        if a.message_id is not None:
            raise _Usage("--message-id needs a single message (a BODY argument)")
        return await self._publish_lines(conn)

    async def _publish_lines(self, conn: Connection) -> int:
        a = self.args
        props = self._properties(None)
        progress = a.progress if a.progress is not None else self.stderr.isatty()
        reader = _LineReader(self.stdin)
        published = 0
        failures: list[ClientError] = []
        async with conn.channel(max_pending=a.max_pending) as ch:
            start = last_report = anyio.current_time()
            with self._stop_on_shutdown():
                while (line := await reader.next_line()) is not None:
                    await ch.start_publish(a.exchange, a.routing_key, line, properties=props,
                                           mandatory=a.mandatory)
                    published += 1
                    now = anyio.current_time()
                    if progress and now - last_report >= 1.0:
                        last_report = now
                        self._progress(published, ch.statistics().confirmed, now - start)
            try:
                await ch.wait_for_confirms()
            except SomePublishesFailed as exc:
                failures = exc.failures
            if progress:
                self._progress(published, ch.statistics().confirmed, anyio.current_time() - start)
                self.stderr.write("\n")
        for failure in failures[:20]:
            self.stderr.write(f"ackbus: not confirmed: {failure}\n")
        if len(failures) > 20:
            self.stderr.write(f"ackbus: … and {len(failures) - 20} more\n")
        if failures:
            self.stderr.write(f"ackbus: {published - len(failures)} of {published} confirmed\n")
            return EXIT_UNCONFIRMED
        return EXIT_INTERRUPTED if self.shutdown_requested() else EXIT_OK

    def _consume_progress(self, consumed: int, elapsed_s: float) -> None:
        rate = consumed / elapsed_s if elapsed_s > 0 else 0.0
        self.stderr.write(f"\rconsumed {consumed} ({rate:,.0f}/s, {elapsed_s:.1f} s)")
        self.stderr.flush()

    def _progress(self, published: int, confirmed: int, elapsed_s: float) -> None:
        rate = confirmed / elapsed_s if elapsed_s > 0 else 0.0
        self.stderr.write(
            f"\rpublished {published}, confirmed {confirmed} ({rate:,.0f}/s, {elapsed_s:.1f} s)"
        )
        self.stderr.flush()

    # --- consume / get ----------------------------------------------------------------

    async def cmd_consume(self, conn: Connection) -> int:
        a = self.args
        count = 0
        wait_s = math.inf if a.wait is None else a.wait
        # -n N takes exactly N: no more than N are ever delivered, since each one more
        # would go back to the queue on exit with its delivery count raised (which
        # counts against x-delivery-limit). The prefetch is at most N, and an ack that
        # would let the broker send past the N-th (the broker refills the window as
        # acks free it) waits until the consumer is cancelled.
        prefetch = a.prefetch if a.count is None else max(1, min(a.prefetch, a.count))
        progress = a.progress if a.progress is not None else self.stderr.isatty()
        start = last_report = anyio.current_time()
        held: list[Message] = []  # printed, acked once the consumer is cancelled
        async with conn.channel() as ch:
            async with ch.consume(a.queue, prefetch=prefetch) as messages:
                while a.count is None or count < a.count:
                    message = None
                    with anyio.move_on_after(wait_s):
                        try:
                            message = await messages.receive()
                        except anyio.EndOfStream:
                            break  # stopped by a signal
                    if message is None:
                        break  # --wait expired
                    cli_output.print_message(self.stdout, message, a.format)
                    count += 1
                    # delivered at most: count + the room the ack frees (held stay unacked)
                    if a.count is None or count + prefetch - len(held) <= a.count:
                        await message.ack()
                    else:
                        held.append(message)
                    now = anyio.current_time()
                    if progress and now - last_report >= 1.0:
                        last_report = now
                        self._consume_progress(count, now - start)
            for message in held:
                await message.ack()
        if progress:
            self._consume_progress(count, anyio.current_time() - start)
            self.stderr.write("\n")
        if a.count is not None and count < a.count and not self.shutdown_requested():
            return EXIT_NOT_ENOUGH
        return EXIT_OK

    async def cmd_get(self, conn: Connection) -> int:
        a = self.args
        if len(a.queue) == 1:
            messages = await conn.get(a.queue[0], max_messages=a.count, wait_s=a.wait, lease_s=a.lease)
        else:
            messages = await conn.get_any(a.queue, max_messages=a.count, wait_s=a.wait, lease_s=a.lease)
        for message in messages:
            cli_output.print_message(self.stdout, message, a.format)
        if messages:
            queue = messages[0].queue  # (one queue answers a get)
            ids = [m.lease_id for m in messages]
            if a.requeue:
                await conn.nack_leases(queue, ids, requeue=True)
            else:
                await conn.ack_leases(queue, ids)
        return EXIT_OK if messages else EXIT_NOT_ENOUGH

    # --- operating on queues -----------------------------------------------------------

    async def cmd_peek(self, conn: Connection) -> int:
        a = self.args
        page = await conn.browse(a.queue, limit=a.count, after=a.after)
        for item in page["messages"]:
            self.stdout.write(orjson.dumps(item).decode() + "\n")
        return EXIT_OK

    async def cmd_redrive(self, conn: Connection) -> int:
        a = self.args
        if a.routing_key is not None and a.exchange is None:
            raise _Usage("--routing-key needs --exchange")
        result = await conn.redrive(a.queue, count=a.count, exchange=a.exchange, routing_key=a.routing_key)
        self.stdout.write(f"moved {result['moved']}\n")
        if "stopped" in result:
            self.stderr.write(f"ackbus: stopped: {result['stopped']}\n")
            return EXIT_NOT_ENOUGH
        return EXIT_OK

    async def cmd_purge(self, conn: Connection) -> int:
        self.stdout.write(f"purged {await conn.purge_queue(self.args.queue)}\n")
        return EXIT_OK

    async def cmd_delete(self, conn: Connection) -> int:
        a = self.args
        if a.kind == "queue":
            await conn.delete_queue(a.name)
        else:
            await conn.delete_exchange(a.name)
        self.stdout.write(f"deleted {a.kind} {a.name}\n")
        return EXIT_OK

    # --- queues -----------------------------------------------------------------------

    async def cmd_queues(self, conn: Connection) -> int:
        queues = await conn.list_queues()
        if self.args.json:
            for q in queues:
                self.stdout.write(orjson.dumps(dict(q.raw)).decode() + "\n")
            return EXIT_OK
        rows = [("name", "ready", "unacked", "consumers", "durable")]
        rows += [(q.name, str(q.messages_ready), str(q.messages_unacked), str(q.consumers),
                  "yes" if q.durable else "no") for q in queues]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        for row in rows:
            cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:4], widths[1:4])]
            cells.append(row[4].ljust(widths[4]))
            self.stdout.write("  ".join(cells).rstrip() + "\n")
        return EXIT_OK


class _CliWithCoordination(CoordinationCommands, _Cli):
    """Every command: the ones above and ``lock``, ``locks``, ``schedule``."""


class _LineReader:
    """stdin lines (without their newline), read in a worker thread so the channel
    keeps running while stdin blocks."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._read = getattr(stream, "read1", stream.read)
        self._buffer = b""
        self._lines: list[bytes] = []
        self._eof = False

    async def next_line(self) -> bytes | None:
        """The next line, or ``None`` at the end of the input."""
        while not self._lines:
            if self._eof:
                return None
            chunk = await anyio.to_thread.run_sync(self._read, 65536, abandon_on_cancel=True)
            if not chunk:
                self._eof = True
                if self._buffer:
                    self._lines.append(self._buffer)
                    self._buffer = b""
                continue
            *lines, self._buffer = (self._buffer + chunk).split(b"\n")
            self._lines.extend(reversed(lines))
        return self._lines.pop()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: run the CLI and return its exit status."""
    status: int = anyio.run(run, sys.argv[1:] if argv is None else argv, backend="trio")
    if status == EXIT_BROKEN_PIPE:
        # What is still buffered for stdout goes nowhere, rather than into a
        # BrokenPipeError when the interpreter flushes it at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return status


if __name__ == "__main__":
    sys.exit(main())

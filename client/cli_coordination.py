"""The CLI's coordination commands: ``ackbus lock NAME -- COMMAND`` (like ``flock``),
``ackbus locks`` and ``ackbus schedule ...`` (docs/client.md, docs/coordination.md).

Kept apart from ``__main__`` (the other commands), which adds these parsers with
:func:`add_coordination_commands` and mixes :class:`CoordinationCommands` into its
command class. A usage error is a ``ValueError`` (exit 2 there)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from functools import partial
from typing import IO, Any

import orjson
import trio

from ._nursery import open_service_nursery
from .connection import Connection
from .locks import LockHeld, LockLost
from .shutdown import GracefulShutdown

__all__ = ["CoordinationCommands", "add_coordination_commands", "EXIT_LOCK_LOST"]

#: ``lock``: the lock was lost while the command ran (the command was stopped).
EXIT_LOCK_LOST = 6


def add_coordination_commands(sub: Any, key_value: Callable[[str], tuple[str, Any]]) -> None:
    """Add the ``lock``, ``locks`` and ``schedule`` parsers to ``sub`` (the CLI's
    subparsers); ``key_value`` parses ``--header K=V``."""
    p = sub.add_parser(
        "lock", help="run a command while holding a lock (like flock); exit with its status",
        description="Acquire lock NAME, run the command holding it (refreshed in the background; "
        "the command gets ACKBUS_LOCK_NAME, ACKBUS_LOCK_OWNER and ACKBUS_LOCK_TOKEN, its fencing "
        "token), release it, exit with the command's status. Held by another after --wait: exit 1. "
        "Lost while the command runs: the command gets SIGTERM (SIGKILL 5 s later), exit 6.",
    )
    p.add_argument("name")
    p.add_argument("--ttl", type=float, default=30.0, metavar="S", help="time to live, refreshed (default %(default)s)")
    p.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait in line up to S seconds (default: no wait)")
    p.add_argument("--owner", help="owner name (default: host/pid-N/random)")
    p.add_argument("cmd", nargs="*", metavar="-- COMMAND [ARGS]")

    p = sub.add_parser("locks", help="table of held locks: owner, token, expiry, waiters")
    p.add_argument("--json", action="store_true", help="one JSON object per lock instead")

    p = sub.add_parser("schedule", help="create, list, show, delete, pause or resume schedules")
    p.add_argument("action", choices=["put", "list", "get", "delete", "pause", "resume"])
    p.add_argument("name", nargs="?")
    timing = p.add_mutually_exclusive_group()
    timing.add_argument("--cron", help="put: 5-field cron expression (with --timezone)")
    timing.add_argument("--interval", type=float, metavar="S", help="put: every S seconds")
    timing.add_argument("--at", help="put: once, at this ISO 8601 time (with an offset) or epoch seconds")
    p.add_argument("--timezone", help="put: IANA time zone of --cron (default UTC)")
    p.add_argument("--start", help="put: first tick of --interval (ISO 8601 or epoch seconds)")
    p.add_argument("--exchange", "-e", default="", help="put: exchange (default: the default exchange)")
    p.add_argument("--routing-key", "-k", default="", help="put: routing key")
    p.add_argument("--body", default="", help="put: message body")
    p.add_argument("--content-type")
    p.add_argument("--header", type=key_value, action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--missed", choices=["latest", "skip", "all"], default="latest",
                   help="put: ticks missed while the broker was down (default %(default)s)")
    p.add_argument("--max-missed", type=int, default=100, metavar="N", help="put: with --missed all, at most N")
    p.add_argument("--paused", action="store_true", help="put: create it paused")


class CoordinationCommands:
    """The ``lock``, ``locks`` and ``schedule`` commands, mixed into the CLI's command
    class (which provides these attributes)."""

    args: argparse.Namespace
    stdout: IO[str]
    stderr: IO[str]
    shutdown: GracefulShutdown | None

    async def cmd_lock(self, conn: Connection) -> int:
        a = self.args
        cmd = list(a.cmd)
        if not cmd:
            raise ValueError("lock: give the command to run after --")
        try:
            async with conn.lock(a.name, ttl_s=a.ttl, wait_s=a.wait, owner=a.owner) as lock:
                env = dict(os.environ, ACKBUS_LOCK_NAME=lock.name, ACKBUS_LOCK_OWNER=lock.owner,
                           ACKBUS_LOCK_TOKEN=str(lock.token))
                async with open_service_nursery() as nursery:
                    proc: trio.Process = await nursery.start(
                        partial(trio.run_process, cmd, check=False, env=env, deliver_cancel=_terminate)
                    )
                    if self.shutdown is not None:
                        # SIGTERM/SIGINT to ackbus: passed on to the command, whose
                        # status is still ours (the lock is released when it ends)
                        self.shutdown.on_request(proc.terminate)
                status = proc.returncode
                assert status is not None  # (the process has ended with the nursery)
                return status
        except LockHeld as exc:
            self.stderr.write(f"ackbus: {exc}\n")
            return 1
        except LockLost as exc:
            self.stderr.write(f"ackbus: {exc}; the command was stopped\n")
            return EXIT_LOCK_LOST
        except OSError as exc:
            raise ValueError(f"cannot run {cmd[0]!r}: {exc}") from None

    async def cmd_locks(self, conn: Connection) -> int:
        locks = await conn.list_locks()
        if self.args.json:
            for lock in locks:
                self.stdout.write(orjson.dumps(lock).decode() + "\n")
            return 0
        rows: list[tuple[str, ...]] = [("name", "owner", "token", "expires_at", "waiters")]
        rows += [(str(x["name"]), str(x["owner"]), str(x["token"]), str(x["expires_at"]), str(len(x["waiters"])))
                 for x in locks]
        _table(self.stdout, rows)
        return 0

    async def cmd_schedule(self, conn: Connection) -> int:
        a = self.args
        schedules = conn.schedules
        if a.action == "list":
            for item in await schedules.list():
                self.stdout.write(orjson.dumps(item).decode() + "\n")
            return 0
        if not a.name:
            raise ValueError(f"schedule {a.action}: give the schedule's name")
        if a.action == "put":
            properties: dict[str, Any] = {}
            if a.content_type:
                properties["content_type"] = a.content_type
            if a.header:
                properties["headers"] = dict(a.header)
            result = await schedules.put(
                a.name, exchange=a.exchange, routing_key=a.routing_key, body=a.body,
                properties=properties or None, cron=a.cron, timezone=a.timezone,
                interval_s=a.interval, start=_time_arg(a.start), at=_time_arg(a.at),
                missed=a.missed, max_missed=a.max_missed, paused=a.paused,
            )
        elif a.action == "get":
            result = await schedules.get(a.name)
        elif a.action == "delete":
            await schedules.delete(a.name)
            return 0
        else:
            result = await (schedules.pause(a.name) if a.action == "pause" else schedules.resume(a.name))
        self.stdout.write(orjson.dumps(result).decode() + "\n")
        return 0


def _time_arg(text: str | None) -> float | str | None:
    """Epoch seconds when the text is a number, else the ISO text for the broker to read."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


async def _terminate(process: trio.Process) -> None:
    """Stop a command whose lock was lost: SIGTERM, then SIGKILL after 5 s."""
    process.terminate()
    with trio.move_on_after(5):
        await process.wait()
        return
    process.kill()


def _table(out: IO[str], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")

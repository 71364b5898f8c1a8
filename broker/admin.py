"""``python -m broker users ...``: manage users and tokens in a stopped broker's data
directory (the way to create the first user before serving beyond loopback).

It recovers the data directory as the broker does (holding its lock, so it refuses
while a broker runs on it: two writers would corrupt the log), applies one command to
the core, waits until its record is on disk, and stops. A directory the broker left
cleanly gets a final checkpoint, as a broker's clean stop would; one that holds a
crash's log is left for the broker's next start to recover as a crash. Passwords never
come from the command line (other users see it in ``ps``): from
``ACKBUS_NEW_PASSWORD``, one line of standard input with ``--password-stdin``, or a
prompt. A new token's secret is printed once, on standard output.

Exit status: 0 done, 1 the data directory cannot be used (in use, corrupt), 2 bad
arguments or a refused command (no such user, invalid name or pattern).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import orjson
import trio

from broker.api import hash_password, new_token
from broker.core import Broker, ErrorReply
from broker.runtime import BrokerRuntime, RuntimeOptions
from broker.storage import StorageError

__all__ = ["main", "run_command"]

PASSWORD_ENV = "ACKBUS_NEW_PASSWORD"
#: Commands that only look: they never create a data directory.
_READ_ONLY = frozenset({"list", "tokens"})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"ackbus-broker users: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m broker users", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir", default=os.environ.get("ACKBUS_DATA_DIR", "data"),
        help="the broker's data directory (default: $ACKBUS_DATA_DIR or ./data)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def permissions(p: argparse.ArgumentParser) -> None:
        for kind in ("configure", "write", "read"):
            p.add_argument(f"--{kind}", metavar="REGEX", help=f"{kind} permission ('.*' = all, '' = none)")

    add = sub.add_parser("add", help="create (or replace) a user")
    add.add_argument("name")
    add.add_argument("--tags", default="", help="comma-separated, e.g. administrator")
    add.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
    permissions(add)
    passwd = sub.add_parser("passwd", help="change a user's password")
    passwd.add_argument("name")
    passwd.add_argument("--password-stdin", action="store_true")
    perms = sub.add_parser("permissions", help="set a user's permissions")
    perms.add_argument("name")
    permissions(perms)
    tags = sub.add_parser("tags", help="set a user's tags")
    tags.add_argument("name")
    tags.add_argument("tags", help="comma-separated ('' for none)")
    delete = sub.add_parser("delete", help="delete a user and its tokens")
    delete.add_argument("name")
    sub.add_parser("list", help="list users (JSON lines)")
    token = sub.add_parser("token", help="create an API token for a user; prints it once")
    token.add_argument("name")
    token.add_argument("--expires-in-s", type=float, default=None)
    token.add_argument("--description", default="")
    tokens = sub.add_parser("tokens", help="list a user's tokens (JSON lines)")
    tokens.add_argument("name")
    revoke = sub.add_parser("revoke", help="revoke an API token by its id")
    revoke.add_argument("id")
    return parser


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    elif sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise ValueError("the passwords differ")
    else:
        raise ValueError(f"give the password with --password-stdin, {PASSWORD_ENV} or at a terminal")
    if not password:
        raise ValueError("the password must not be empty")
    return password


def _permissions(args: argparse.Namespace, current: dict[str, str] | None) -> dict[str, str]:
    result = dict(current or {"configure": "", "write": "", "read": ""})
    for kind in ("configure", "write", "read"):
        value = getattr(args, kind)
        if value is not None:
            result[kind] = value
    return result


def _tags(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _command(args: argparse.Namespace) -> Callable[[Broker], list[Any]]:
    """What to do to the recovered core; returns the lines to print. Hashing happens
    here, before the data directory is opened."""
    name = getattr(args, "name", "")
    if args.command == "add":
        hashed = hash_password(_password(args))

        def add(core: Broker) -> list[Any]:
            created = core.put_user(name, password=hashed, tags=_tags(args.tags), permissions=_permissions(args, None))
            return [f"user {name!r} {'created' if created else 'replaced'}"]

        return add
    if args.command == "passwd":
        hashed = hash_password(_password(args))

        def passwd(core: Broker) -> list[Any]:
            user = core.users.get(name)
            if user is None:
                raise ValueError(f"no user {name!r}")
            core.put_user(name, password=hashed, tags=user.tags, permissions=user.permissions)
            return [f"password of {name!r} changed"]

        return passwd
    if args.command == "permissions":

        def perms(core: Broker) -> list[Any]:
            user = core.users.get(name)
            core.set_permissions(name, _permissions(args, user.permissions if user else None))
            return [core.users.users[name].info()]

        return perms
    if args.command == "tags":

        def tags(core: Broker) -> list[Any]:
            user = core.users.get(name)
            if user is None:
                raise ValueError(f"no user {name!r}")
            core.put_user(name, password=user.password, tags=_tags(args.tags), permissions=user.permissions)
            return [core.users.users[name].info()]

        return tags
    if args.command == "delete":

        def delete(core: Broker) -> list[Any]:
            core.delete_user(name)
            return [f"user {name!r} deleted"]

        return delete
    if args.command == "list":
        return lambda core: [u.info() for u in core.users.users.values()]
    if args.command == "token":
        token_id, digest, text = new_token()

        def token(core: Broker) -> list[Any]:
            lifetime = args.expires_in_s
            expires = core.wall_clock() + lifetime if lifetime is not None else None
            core.add_token(token_id, name, digest, expires_s=expires, description=args.description)
            return [text]

        return token
    if args.command == "tokens":

        def tokens(core: Broker) -> list[Any]:
            if core.users.get(name) is None:
                raise ValueError(f"no user {name!r}")
            return [t.info() for t in core.users.tokens_of(name)]

        return tokens

    def revoke(core: Broker) -> list[Any]:
        core.revoke_token(args.id)
        return [f"token {args.id} revoked"]

    return revoke


async def run_command(data_dir: Path, command: Callable[[Broker], list[Any]]) -> list[Any]:
    """Recover ``data_dir``, apply ``command`` to the core, make its records durable,
    stop. Raises what recovery raises (``DataDirInUse``, ``StorageError``, ``OSError``)
    and what the command raises (``ErrorReply``, ``ValueError``): nothing is written
    then."""
    runtime = BrokerRuntime(RuntimeOptions(data_dir=data_dir, checkpoint_interval_s=0, checkpoint_wal_bytes=0))
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.serve)
        await runtime.ready_event.wait()
        try:
            lines = command(runtime.core)
            await runtime.wait_durable()
        finally:
            clean = runtime.recovery_info.get("wal_records", 1) == 0
            await runtime.aclose(checkpoint=clean)
            nursery.cancel_scope.cancel()
    return lines


def main(argv: Sequence[str]) -> int:
    """Run ``users`` with ``argv`` (the words after it); return the exit status."""
    args = _parser().parse_args(list(argv))
    if args.command in _READ_ONLY and not Path(args.data_dir).is_dir():
        # a typo must not leave a new, empty data directory behind
        print(f"ackbus-broker users: no data directory at {args.data_dir}", file=sys.stderr)
        return 1
    try:
        command = _command(args)
        lines = trio.run(run_command, Path(args.data_dir), command)
    except (ErrorReply, ValueError) as exc:
        message = exc.message if isinstance(exc, ErrorReply) else str(exc)
        print(f"ackbus-broker users: {message}", file=sys.stderr)
        return 2
    except (StorageError, OSError) as exc:
        print(f"ackbus-broker users: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        if isinstance(leaf, (StorageError, OSError)):
            print(f"ackbus-broker users: {leaf}", file=sys.stderr)
            return 1
        if isinstance(leaf, (ErrorReply, ValueError)):
            message = leaf.message if isinstance(leaf, ErrorReply) else str(leaf)
            print(f"ackbus-broker users: {message}", file=sys.stderr)
            return 2
        raise
    for line in lines:
        print(line if isinstance(line, str) else orjson.dumps(line).decode())
    return 0

"""The ``ackbus`` CLI's operator commands (in the spirit of rabbitmqadmin's ``list``
and ``show overview``): ``overview``, ``exchanges``, ``bindings``, ``channels``,
``cluster``, ``close-channel`` and ``queue replicas`` (a quorum queue's replicas, and
changing them, as ``rabbitmq-queues add_member``/``delete_member`` do). Each prints a
table, or with ``--json`` one JSON object per line (``overview``: one object).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import IO, Any

import orjson

from .connection import Connection

__all__ = ["add_parsers", "COMMANDS", "write_table"]


def add_parsers(sub: Any) -> None:
    """Add the commands to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser("overview", help="broker version, uptime, totals, storage")
    p.add_argument("--json", action="store_true", help="the raw JSON object instead")
    p = sub.add_parser("exchanges", help="table of exchanges")
    p.add_argument("--json", action="store_true", help="one JSON object per exchange instead")
    p = sub.add_parser("bindings", help="table of bindings")
    p.add_argument("--json", action="store_true", help="one JSON object per binding instead")
    p = sub.add_parser("channels", aliases=["connections"], help="table of open channels and their consumers")
    p.add_argument("--json", action="store_true", help="one JSON object per channel instead")
    p = sub.add_parser("cluster", help="the cluster's nodes, their queues, and etcd's health")
    p.add_argument("--json", action="store_true", help="the raw JSON object instead")
    p = sub.add_parser("close-channel", help="close an open channel or stream (its unacked messages go back)")
    p.add_argument("id", type=int, help="the channel's id (see 'ackbus channels')")
    p.add_argument("--reason", default=None, help="what its client is told (default: closed by an operator)")
    p = sub.add_parser("queue", help="operations on one queue of a cluster")
    queue_sub = p.add_subparsers(dest="queue_command", required=True, metavar="SUBCOMMAND")
    p = queue_sub.add_parser("replicas", help="a quorum queue's replicas; --add or --remove one (cluster mode)")
    p.add_argument("queue")
    change = p.add_mutually_exclusive_group()
    change.add_argument("--add", metavar="NODE", help="add node NODE: it catches up, then joins the in-sync set")
    change.add_argument("--remove", metavar="NODE", help="remove node NODE (the leader steps down first)")
    p.add_argument("--json", action="store_true", help="the raw JSON object instead")


def write_table(out: IO[str], header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> None:
    """Columns padded to their widest cell; columns in ``right`` right-aligned."""
    table = [list(header), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.write("  ".join(cells).rstrip() + "\n")


def _json_lines(out: IO[str], objects: Sequence[Any]) -> None:
    for obj in objects:
        out.write(orjson.dumps(obj).decode() + "\n")


async def overview(conn: Connection, args: argparse.Namespace, out: IO[str]) -> None:
    data = await conn.overview()
    if args.json:
        _json_lines(out, [data])
        return
    totals = data.get("totals", {}) or {}
    stats = data.get("stats", {}) or {}
    storage = data.get("storage", {}) or {}
    rows = [
        ("version", str(data.get("version", "?"))),
        ("uptime", f"{float(data.get('uptime_s', 0)):.0f} s"),
        ("ready", "yes" if data.get("ready") else "no (recovering)"),
        *[(name, str(value)) for name, value in totals.items()],
        *[(f"total {name}", str(value)) for name, value in stats.items()],
        ("storage", "off (memory only)" if not storage.get("enabled") else
         ("ok" if storage.get("ok") else "FAILED") + f", fsync {storage.get('fsync', '?')}"),
    ]
    write_table(out, ("what", "value"), rows)


async def exchanges(conn: Connection, args: argparse.Namespace, out: IO[str]) -> None:
    items = await conn.list_exchanges()
    if args.json:
        _json_lines(out, items)
        return
    rows = [
        (str(x.get("name", "")), str(x.get("type", "")), "yes" if x.get("durable") else "no",
         "yes" if x.get("auto_delete") else "no", orjson.dumps(x.get("arguments") or {}).decode())
        for x in items
    ]
    write_table(out, ("name", "type", "durable", "auto_delete", "arguments"), rows)


async def bindings(conn: Connection, args: argparse.Namespace, out: IO[str]) -> None:
    items = await conn.list_bindings()
    if args.json:
        _json_lines(out, items)
        return
    rows = []
    for b in items:
        if b.get("to_exchange") is not None:
            destination, kind = str(b["to_exchange"]), "exchange"
        else:
            destination, kind = str(b.get("queue", "")), "queue"
        rows.append((str(b.get("exchange", "")) or "amq.default", destination, kind,
                     str(b.get("routing_key", "")), orjson.dumps(b.get("arguments") or {}).decode()))
    write_table(out, ("source", "destination", "kind", "routing_key", "arguments"), rows)


async def channels(conn: Connection, args: argparse.Namespace, out: IO[str]) -> None:
    items = await conn.list_channels()
    if args.json:
        _json_lines(out, items)
        return
    rows = [
        (str(c.get("id", "")), str(c.get("kind", "")), str(c.get("remote") or "-"),
         str(c.get("user_agent") or "-"), str(c.get("publishes", 0)), str(c.get("unacked", 0)),
         ",".join(f"{x.get('queue')}({x.get('consumer_tag')})" for x in c.get("consumers") or []) or "-")
        for c in items
    ]
    write_table(out, ("id", "kind", "remote", "user_agent", "publishes", "unacked", "consumers"), rows,
                right=(0, 4, 5))


async def close_channel(conn: Connection, args: argparse.Namespace, out: IO[str]) -> None:
    result = await conn.close_channel(args.id, args.reason)
    out.write(f"closed channel {result.get('closed', args.id)}: {result.get('reason', '')}\n")


async def cluster(conn: Connection, args: argparse.Namespace, out: IO[str]) -> None:
    data = await conn.cluster()
    if args.json:
        _json_lines(out, [data])
        return
    if not data.get("enabled"):
        out.write(f"not clustered: {data.get('reason', 'a single node')}\n")
        return
    etcd = data.get("etcd", {}) or {}
    out.write(
        f"cluster {data.get('cluster_name')}, seen from {data.get('node')} at revision {data.get('revision')}; "
        f"etcd {'ok' if etcd.get('ok') else 'UNREACHABLE: ' + str(etcd.get('error'))}\n"
    )
    rows = [
        (
            str(n.get("name")) + (" *" if n.get("this_node") else ""),
            str(n.get("url")),
            "alive" if n.get("alive") else "DEAD",
            str(len(n.get("queues") or [])),
        )
        for n in data.get("nodes") or []
    ]
    write_table(out, ("node", "url", "state", "queues"), rows, right=(3,))
    for e in etcd.get("endpoints") or []:
        state = {True: "healthy", False: f"unhealthy: {e.get('error')}", None: "not tried"}[e.get("healthy")]
        out.write(f"etcd {e.get('url')}: {state}\n")


async def queue(conn: Connection, args: argparse.Namespace, out: IO[str]) -> None:
    """``ackbus queue replicas Q [--add NODE | --remove NODE]``."""
    if args.add is not None or args.remove is not None:
        data = await conn.change_replicas(args.queue, add=args.add, remove=args.remove)
        if args.json:
            _json_lines(out, [data])
            return
        what = f"added {data.get('added')}" if "added" in data else f"removed {data.get('removed')}"
        stepped = " (the leader stepped down)" if data.get("leader_stepped_down") else ""
        out.write(
            f"queue {args.queue}: {what}{stepped}; replicas {', '.join(data.get('replicas') or [])}; "
            f"in sync {', '.join(data.get('in_sync') or [])}\n"
        )
        return
    info = await conn.queue_replication(args.queue)
    if args.json:
        _json_lines(out, [info])
        return
    if not info:
        out.write(f"queue {args.queue} has no replicas (not a quorum queue, or not a cluster)\n")
        return
    lag = info.get("lag") or {}
    in_sync = set(info.get("in_sync") or [])
    rows = [
        (
            str(n),
            "leader" if n == info.get("leader") else "follower",
            "yes" if n in in_sync else "no",
            str(lag[n]) if n in lag else "-",
        )
        for n in info.get("replicas") or []
    ]
    out.write(f"queue {args.queue}: epoch {info.get('epoch')}, leader {info.get('leader') or 'none'}\n")
    write_table(out, ("node", "role", "in_sync", "lag"), rows, right=(3,))


COMMANDS: dict[str, Callable[[Connection, argparse.Namespace, IO[str]], Any]] = {
    "overview": overview,
    "exchanges": exchanges,
    "bindings": bindings,
    "channels": channels,
    "connections": channels,
    "close-channel": close_channel,
    "cluster": cluster,
    "queue": queue,
}

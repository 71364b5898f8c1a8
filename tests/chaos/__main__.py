"""``python -m tests.chaos --minutes N [--nodes 3|5] [--netns | --loopback] [--faults
KIND,...]``: run the fault test, print its table (and the JSON with ``--json``); exit 1
on any violation (a confirmed message lost, an unmarked duplicate, an order, fencing
or epoch violation). Without ``--netns`` or ``--loopback`` it uses network namespaces
when they can be made here and says so; ``--netns`` fails with the reason when they
cannot. ``--faults`` injects only the kinds named (exit 2 for one unknown, or one the
placement cannot make)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.chaos.checker import table, violations
from tests.chaos.harness import exit_on_sigterm, run
from tests.chaos.nemesis import ALL_KINDS, parse_kinds
from tests.chaos.netns import NetnsUnavailable


def _kinds(text: str) -> list[str]:
    try:
        return parse_kinds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ttl", type=int, default=3, help="cluster_lease_ttl_s of the nodes")
    parser.add_argument("--dir", type=Path, default=None, help="where etcd and the nodes keep their data (kept)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--netns", action="store_true", help="each member in a network namespace (partitions too); fail if impossible")
    where.add_argument("--loopback", action="store_true", help="every member on loopback (no partitions)")
    parser.add_argument("--faults", type=_kinds, default=None, metavar="KIND,...",
                        help=f"inject only these kinds of fault (default: every kind the placement can make): {', '.join(ALL_KINDS)}")
    parser.add_argument("--json", action="store_true")
    exit_on_sigterm()
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="ackbus-chaos-"))
    directory.mkdir(parents=True, exist_ok=True)
    netns = True if args.netns else (False if args.loopback else None)
    try:
        result = run(directory, args.minutes, nodes=args.nodes, publishers=args.publishers, seed=args.seed,
                     ttl_s=args.ttl, netns=netns, faults=args.faults)
    except NetnsUnavailable as exc:
        print(f"chaos: network namespaces cannot be made here: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    print(table(result))
    if args.json:
        print(json.dumps(result))
    print(f"(data, logs and history.json in {directory})", file=sys.stderr)
    failed = violations(result)
    if failed:
        print(f"chaos: VIOLATIONS: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m tests.chaos --minutes N [--nodes 3|5]``: run the fault test, print its
table (and the JSON with ``--json``); exit 1 when a confirmed message was lost."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.chaos.harness import run, table


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ttl", type=int, default=3, help="cluster_lease_ttl_s of the nodes")
    parser.add_argument("--dir", type=Path, default=None, help="where etcd and the nodes keep their data (kept)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="ackbus-chaos-"))
    result = run(directory, args.minutes, nodes=args.nodes, publishers=args.publishers, seed=args.seed, ttl_s=args.ttl)
    print(table(result))
    if args.json:
        print(json.dumps(result))
    print(f"(data and logs in {directory})", file=sys.stderr)
    return 1 if result["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())

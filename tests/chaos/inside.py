"""``python -m tests.chaos.inside SPEC``: the part of a namespaced run that runs in the
hub namespace (started there by :func:`tests.chaos.harness.run`, which made the
namespaces and removes them): the cluster, the clients, the nemesis, the checker. It
writes the findings to the spec's ``out`` file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.chaos.harness import exit_on_sigterm, run_here
from tests.chaos.netns import Topology


def main() -> int:
    exit_on_sigterm()
    spec = json.loads(Path(sys.argv[1]).read_text())
    topo = spec["topology"]
    topology = Topology(topo["members"], prefix=topo["prefix"], addresses=spec["addresses"])
    result = run_here(Path(spec["directory"]), spec["minutes"], spec["nodes"], spec["publishers"], spec["seed"], spec["ttl_s"], topology,
                      spec.get("faults"))
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

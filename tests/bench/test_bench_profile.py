"""``python -m bench.profile``: stacks attributed to hops, and one short real run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.procs import ROOT
from bench.profile import BROKER_HOPS, attribute

RAW = [
    "<module> (broker/__main__.py:1);ChannelSession.serve_reader (a.py:1);ChannelSession._publish (a.py:2);"
    "Publishing.publish (p.py:3);DedupWindow.lookup (d.py:4) 30",
    "<module> (broker/__main__.py:1);ChannelSession.serve_reader (a.py:1);parse_op_line (c.py:5) 10",
    "Thread._bootstrap (t.py:1);WorkerThread._work (trio/_core/_thread_cache.py:211) 50",
    "Thread._bootstrap (t.py:1);WriteAheadLog._io_write (w.py:1);_OsFile.sync (fs.py:2) 5",
    "<module> (broker/__main__.py:1);something_new (x.py:1) 5",
    "",
]


def test_stacks_go_to_the_first_hop_that_names_one_of_their_frames() -> None:
    counts, idle = attribute(RAW, BROKER_HOPS)
    assert idle == 50  # parked worker threads are left out
    assert counts["core: publish (checks, dedup, message, record, enqueue, confirm)"] == 30
    assert counts["channel: op line parsed, checked"] == 10  # not the reader loop it sits in
    assert counts["WAL thread: write + fdatasync (mostly waiting)"] == 5
    assert counts["other"] == 5
    assert sum(counts.values()) == 50


@pytest.mark.slow
def test_a_short_run_reports_cpu_per_message() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.profile", "--seconds", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("publish_pipelined, 100 B: ")
    for side in ("broker", "client"):
        (line,) = [x for x in lines if x.startswith(f"{side}: ")]
        assert float(line.split()[1]) > 0, line

"""The README's curl example, run line by line against a real broker process.

The five ``curl`` lines are taken from README.md's example block as they are written,
with the broker's port in place of 8080 and the lease id the get printed in place of
``LEASE_ID``; each output is checked, and so are the outputs the README quotes.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import ROOT, BrokerProcess

README = ROOT / "README.md"

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


def example_lines() -> list[str]:
    """The lines of the one fenced block in README.md made only of curl commands."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    curl_blocks = [
        lines
        for lines in ([ln for ln in block.splitlines() if ln.strip()] for block in blocks)
        if lines and all(ln.startswith("curl ") for ln in lines)
    ]
    assert len(curl_blocks) == 1, f"expected one curl example block in README.md, found {len(curl_blocks)}"
    return curl_blocks[0]


def run_curl(line: str, port: int) -> tuple[int, Any]:
    """Run one README line (shell word splitting, no shell) on ``port``; return
    (HTTP status, parsed JSON output)."""
    assert "8080" in line
    argv = shlex.split(line.replace(":8080", f":{port}"))
    assert argv[0] == "curl"
    # Quiet, but report errors and append the status code on a line of its own.
    argv[1:1] = ["--silent", "--show-error", "--max-time", "30", "--write-out", "\n%{http_code}"]
    done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, (line, done.returncode, done.stderr)
    output, _, status = done.stdout.decode().rpartition("\n")
    return int(status), json.loads(output)


def test_readme_has_the_five_line_example() -> None:
    lines = example_lines()
    assert len(lines) == 5
    verbs = ["PUT localhost:8080/queues/", "/bindings", "/publish", "/get", "/ack"]
    for line, verb in zip(lines, verbs):
        assert verb in line, (verb, line)


@pytest.mark.slow
def test_readme_curl_example(tmp_path: Path) -> None:
    declare, bind, publish, get, ack = example_lines()
    readme = README.read_text()
    with BrokerProcess(tmp_path / "data") as broker:
        status, body = run_curl(declare, broker.port)
        assert status == 201
        assert body["name"] == "jobs" and body["durable"] is True

        status, body = run_curl(bind, broker.port)
        assert status == 201
        assert body == {"bound": True, "created": True}

        status, body = run_curl(publish, broker.port)
        assert status == 200
        assert body == {"confirm": "ack", "routed": 1}
        assert "`" + json.dumps(body, separators=(",", ":")) + "`" in readme

        status, body = run_curl(get, broker.port)
        assert status == 200
        (message,) = body["messages"]
        assert message["body"] == "hello"
        assert message["properties"] == {"content_type": "text/plain"}
        assert message["routing_key"] == "jobs"
        assert message["exchange"] == "amq.direct"
        assert message["redelivered"] is False
        shown = '{"messages":[{"body":"hello","properties":{"content_type":"text/plain"},"delivery_count":0,"lease_id":"'
        assert shown in readme
        assert json.dumps(message, separators=(",", ":")).startswith(shown[len('{"messages":[') :])

        assert "LEASE_ID" in ack
        status, body = run_curl(ack.replace("LEASE_ID", message["lease_id"]), broker.port)
        assert status == 200
        assert body == {"acked": 1}
        assert "`{\"acked\":1}`" in readme

        status, info = broker.request("GET", "/queues/jobs")
        assert status == 200
        assert (info["messages_ready"], info["messages_unacked"]) == (0, 0)

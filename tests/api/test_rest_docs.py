"""docs/http-api.md documents the endpoints that exist, and every REST endpoint."""

from __future__ import annotations

import re
from pathlib import Path

from broker.api import build_router
from broker.runtime import BrokerRuntime, RuntimeOptions

DOC = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"

#: The REST calls of the HTTP API (v1) as designed, the channel aside.
DESIGN_CALLS = {
    ("GET", "/healthz"),
    ("GET", "/overview"),
    ("PUT", "/exchanges/{name}"),
    ("DELETE", "/exchanges/{name}"),
    ("GET", "/exchanges"),
    ("GET", "/exchanges/{name}"),
    ("PUT", "/queues/{name}"),
    ("DELETE", "/queues/{name}"),
    ("GET", "/queues"),
    ("GET", "/queues/{name}"),
    ("POST", "/queues/{name}/purge"),
    ("POST", "/bindings"),
    ("DELETE", "/bindings"),
    ("GET", "/bindings"),
    ("POST", "/exchanges/{name}/publish"),
    ("POST", "/queues/{name}/get"),
    ("POST", "/queues/{name}/ack"),
    ("POST", "/queues/{name}/nack"),
    ("POST", "/queues/{name}/extend"),
    ("GET", "/queues/{name}/stream"),
    ("POST", "/locks/{name}/acquire"),
    ("POST", "/locks/{name}/refresh"),
    ("POST", "/locks/{name}/release"),
    ("GET", "/locks"),
    ("GET", "/locks/{name}"),
    ("PUT", "/schedules/{name}"),
    ("GET", "/schedules"),
    ("GET", "/schedules/{name}"),
    ("DELETE", "/schedules/{name}"),
}


def documented_calls() -> set[tuple[str, str]]:
    calls = set()
    for heading in re.findall(r"^###\s+(.*)$", DOC.read_text(), flags=re.M):
        for method, path in re.findall(r"`([A-Z]+) (/[^`?\s]*)", heading):
            calls.add((method, path))
    return calls


def test_every_design_call_is_documented() -> None:
    assert DESIGN_CALLS <= documented_calls()


def test_every_documented_call_is_served() -> None:
    router = build_router(BrokerRuntime(RuntimeOptions(data_dir=None)))
    for method, path in documented_calls():
        found = router.match(method, path.replace("{name}", "x"))  # raises 404/405 if not
        assert found.handler is not None


def test_every_documented_call_has_a_curl_example() -> None:
    sections = re.split(r"^### ", DOC.read_text(), flags=re.M)[1:]
    for section in sections:
        heading = section.splitlines()[0]
        assert "curl " in section, f"no curl example under {heading!r}"

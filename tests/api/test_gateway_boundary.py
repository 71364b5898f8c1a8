"""The API's boundary with the core, read from the source.

Every core command of the API goes through the runtime's command gateway
(``broker/runtime/gateway.py``), which carries out its effects: no API module pumps by
hand. The API reads the core through its views (``Broker.views``), never its live
state. Handlers take ``broker.http``'s ``Request`` and ``Response``, not ``Any``.

``auth.py`` and ``permissions.py`` are left out: authentication reads the user store
itself (it checks credentials before any command runs).
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
API = ROOT / "broker" / "api"
EXEMPT = {"auth.py", "permissions.py"}

#: The core's live state, which only the core and its views may touch.
LIVE_STATE = ("channels", "queues", "exchanges", "coord", "users", "stats", "dead_letter_drops", "storage_ok")


def _api_sources() -> list[tuple[pathlib.Path, str]]:
    return [(path, path.read_text()) for path in sorted(API.rglob("*.py")) if path.name not in EXEMPT]


def _hits(pattern: str) -> list[str]:
    regex = re.compile(pattern)
    found = []
    for path, text in _api_sources():
        for number, line in enumerate(text.splitlines(), 1):
            if regex.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_api_module_pumps_by_hand() -> None:
    assert _hits(r"\.pump\(") == []


def test_no_api_module_reads_the_cores_live_state() -> None:
    assert _hits(r"\bcore\.(" + "|".join(LIVE_STATE) + r")\b") == []


def test_handlers_take_http_requests_and_responses() -> None:
    assert _hits(r"(request|response): Any\b") == []


def test_the_sources_were_read() -> None:
    names = {path.name for path, _ in _api_sources()}
    assert {"ops.py", "session.py", "exchanges.py", "metrics.py"} <= names

"""Every Python snippet of README.md and docs/*.md runs to its end as written.

Each document's snippets run in order, each in a fresh interpreter, against one real
broker subprocess of their own (the broker's port in place of 8080); each must exit 0
within 60 s. A snippet that cannot run on its own (a fragment, or one that needs a
worker or a signal) carries a marker on the line before its fence,
``<!-- snippet: skip (the reason) -->``; it is still compiled, so its syntax holds.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.broker import ROOT, BrokerProcess, free_port

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"^<!-- snippet: skip \((?P<reason>[^)]+)\) -->$")
FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_+-]*)\s*$")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    skip_reason: str | None

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_snippets(path: Path) -> list[Snippet]:
    """The ```python blocks of ``path``, with the skip marker before each if any."""
    lines = path.read_text().splitlines()
    out: list[Snippet] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if match["lang"] in ("python", "py"):
            marker = SKIP.match(lines[i - 1]) if i else None
            out.append(Snippet(path, i + 1, "\n".join(lines[i + 1:end]) + "\n", marker["reason"] if marker else None))
        i = end + 1
    return out


SNIPPETS = {path: python_snippets(path) for path in DOCUMENTS}
WITH_SNIPPETS = [path for path, snippets in SNIPPETS.items() if snippets]


def test_markers_sit_before_python_fences() -> None:
    """A skip marker anywhere else (a typo, a moved block) would skip nothing."""
    for path in DOCUMENTS:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("<!-- snippet"):
                assert SKIP.match(line), f"{path}:{i + 1}: malformed marker {line!r}"
                assert i + 1 < len(lines) and lines[i + 1] in ("```python", "```py"), (
                    f"{path}:{i + 1}: a marker not right before a ```python fence")


def test_skipped_snippets_compile_and_are_few() -> None:
    snippets = [s for group in SNIPPETS.values() for s in group]
    skipped = [s for s in snippets if s.skip_reason]
    for snippet in skipped:
        try:
            compile(snippet.code, str(snippet), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except SyntaxError as exc:
            raise AssertionError(f"{snippet}: {exc}") from None
    runnable = len(snippets) - len(skipped)
    assert runnable >= 6, f"only {runnable} of {len(snippets)} snippets run"


@pytest.mark.slow
@pytest.mark.parametrize("path", WITH_SNIPPETS, ids=lambda p: str(p.relative_to(ROOT)))
def test_snippets_run(path: Path, tmp_path: Path) -> None:
    runnable = [s for s in SNIPPETS[path] if not s.skip_reason]
    if not runnable:
        pytest.skip(f"every snippet of {path.name} is marked to skip")
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    amqp_port = free_port()
    with BrokerProcess(tmp_path / "data", env={"ACKBUS_AMQP_PORT": str(amqp_port)}) as broker:
        for snippet in runnable:
            # the docs name the default ports; this broker has free ones
            code = snippet.code.replace(":8080", f":{broker.port}").replace(":5672", f":{amqp_port}")
            code = code.replace('"127.0.0.1", 5672)', f'"127.0.0.1", {amqp_port})')
            try:
                done = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env,
                                      capture_output=True, timeout=60, check=False)
            except subprocess.TimeoutExpired as exc:
                raise AssertionError(f"{snippet} did not end within 60 s:\n{code}") from exc
            assert done.returncode == 0, (
                f"{snippet} exited {done.returncode}:\n{code}\n{done.stderr.decode(errors='replace')[-3000:]}")

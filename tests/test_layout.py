"""The layers' import table, enforced.

docs/architecture.md holds the same table for people; this module is its proof. Every
``import`` in ``broker/`` and ``client/`` is read from the source (absolute and relative
alike, including imports inside functions and under ``if TYPE_CHECKING:``), resolved to
the module it names, and checked three ways:

1. a layer imports only the layers its row of ``MAY_IMPORT`` names;
2. another layer is entered through its face (``broker.core``, not
   ``broker.core.broker``): a package's ``__init__`` says what it offers;
3. no module imports itself through a chain of other modules (a cycle), type-only
   imports included: a cycle that only type checking sees still ties two modules into
   one.

The sans-IO rule for the core (no trio, no sockets, no files, no clocks) is a fourth
check on third-party and standard-library names.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: Layer -> the layers it may import (besides itself). A layer is a package
#: (``broker.core``) or a top-level module (``broker.app``); ``broker`` is the
#: ``broker/__init__.py`` module alone (the version).
MAY_IMPORT: dict[str, set[str]] = {
    "broker": set(),
    "broker.core": set(),
    "broker.storage": set(),
    "broker.metrics": set(),
    "broker.http": set(),
    "broker.runtime": {"broker", "broker.core", "broker.storage"},
    "broker.api": {"broker", "broker.core", "broker.runtime", "broker.http", "broker.metrics"},
    # the AMQP listener reuses the API layer's permission checks and login (Access,
    # Authenticator.login) rather than a second copy of them
    "broker.amqp": {"broker", "broker.core", "broker.runtime", "broker.api"},
    "broker.config": {"broker", "broker.core", "broker.storage", "broker.runtime", "broker.http"},
    "broker.logs": {"broker.config"},
    "broker.app": {
        "broker.amqp",
        "broker.api",
        "broker.config",
        "broker.core",
        "broker.http",
        "broker.logs",
        "broker.metrics",
        "broker.runtime",
        "broker.storage",
    },
    "broker.admin": {"broker.api", "broker.core", "broker.runtime", "broker.storage"},
    "broker.__main__": {"broker", "broker.admin", "broker.app", "broker.config", "broker.logs", "broker.storage"},
    "client": set(),
}

#: What the core may not import: it is a plain state machine (time, ids and the log's
#: bytes arrive as arguments).
NOT_IN_CORE = {"trio", "h11", "socket", "os", "time", "asyncio", "threading", "selectors", "io"}


@dataclass(frozen=True)
class Import:
    importer: str  # module name, e.g. broker.core.broker
    target: str  # resolved module name, e.g. broker.core.records
    line: int
    path: pathlib.Path

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.importer} imports {self.target}"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").is_file()


def _exists(module: str) -> bool:
    base = ROOT / module.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _source_files() -> list[pathlib.Path]:
    return sorted(p for top in ("broker", "client") for p in (ROOT / top).rglob("*.py"))


def read_imports(path: pathlib.Path) -> Iterator[Import]:
    """Every import in ``path``, resolved; ``from pkg import name`` names the submodule
    ``pkg.name`` when there is one, else ``pkg``."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno, path)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: -(node.level - 1)]
                base = ".".join(base_parts)
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                if _exists(candidate):
                    yield Import(module, candidate, node.lineno, path)
                else:
                    yield Import(module, source, node.lineno, path)


def layer_of(module: str) -> str | None:
    """The layer a first-party module belongs to, or None for a third-party one."""
    parts = module.split(".")
    if parts[0] not in ("broker", "client"):
        return None
    if parts[0] == "client":
        return "client"
    if len(parts) == 1:
        return "broker"
    return f"broker.{parts[1]}"


def all_imports() -> list[Import]:
    return [imp for path in _source_files() for imp in read_imports(path)]


def layering_violations(imports: list[Import]) -> list[str]:
    found = []
    for imp in imports:
        src, dst = layer_of(imp.importer), layer_of(imp.target)
        if src is None or dst is None or src == dst:
            continue
        if src not in MAY_IMPORT:
            found.append(f"{imp}: layer {src} is not in the import table")
        elif dst not in MAY_IMPORT[src]:
            found.append(f"{imp}: {src} may not import {dst}")
    return found


def face_violations(imports: list[Import]) -> list[str]:
    found = []
    for imp in imports:
        src, dst = layer_of(imp.importer), layer_of(imp.target)
        if src is None or dst is None or src == dst:
            continue
        if _is_package(dst) and imp.target != dst:
            found.append(f"{imp}: import it from {dst}, the package's face")
    return found


def cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if layer_of(imp.target) is not None and imp.target != imp.importer:
            graph.setdefault(imp.importer, set()).add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


# ------------------------------------------------------------------------ the rules


def test_every_layer_imports_only_what_the_table_allows() -> None:
    assert layering_violations(all_imports()) == []


def test_other_layers_are_entered_through_their_package_face() -> None:
    assert face_violations(all_imports()) == []


def test_no_import_cycles_type_only_imports_included() -> None:
    assert cycles(all_imports()) == []


def test_core_is_sans_io() -> None:
    found = {
        f"{imp}"
        for imp in all_imports()
        if layer_of(imp.importer) == "broker.core" and imp.target.split(".")[0] in NOT_IN_CORE
    }
    assert not found, sorted(found)


def test_every_layer_on_disk_is_in_the_table() -> None:
    layers = {layer_of(_module_name(p)) for p in _source_files()}
    assert layers <= set(MAY_IMPORT), layers - set(MAY_IMPORT)


# ------------------------------------------------------------- the checker is honest


def _write(tmp: pathlib.Path, rel: str, text: str) -> pathlib.Path:
    path = tmp / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def fake_root(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A tiny tree to run the checker on, with ROOT pointed at it."""
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    for pkg in ("broker", "broker/core", "broker/storage", "broker/http", "client"):
        _write(tmp_path, f"{pkg}/__init__.py", "")
    return tmp_path


def test_a_relative_import_of_a_forbidden_layer_is_caught(fake_root: pathlib.Path) -> None:
    _write(fake_root, "broker/storage/fs.py", "X = 1\n")
    path = _write(fake_root, "broker/core/names.py", "from ..storage import fs\n")
    found = layering_violations(list(read_imports(path)))
    assert len(found) == 1 and "broker.core may not import broker.storage" in found[0]


def test_a_type_only_cycle_is_caught(fake_root: pathlib.Path) -> None:
    a = _write(fake_root, "client/a.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    b = _write(fake_root, "client/b.py", "from .a import A\n")
    assert cycles([*read_imports(a), *read_imports(b)]) == [["client.a", "client.b"]]


def test_an_import_past_the_face_is_caught(fake_root: pathlib.Path) -> None:
    _write(fake_root, "broker/core/errors.py", "E = 1\n")
    path = _write(fake_root, "broker/http/x.py", "from broker.core.errors import E\n")
    assert face_violations(list(read_imports(path)))

"""The layers' import table, enforced.

docs/architecture.md holds the same table for people; this module is its proof. Every
``import`` in ``broker/``, ``client/`` and ``bench/`` is read from the source (absolute
and relative alike, including imports inside functions and under ``if TYPE_CHECKING:``,
and ``importlib.import_module(...)`` / ``__import__(...)`` with a constant name; a
dynamic import of a computed name is refused, since no reader can follow it), resolved
to the module it names, and checked three ways:

1. a layer imports only the layers its row of ``MAY_IMPORT`` names;
2. another layer is entered through its face (``broker.core``, not
   ``broker.core.broker``): a package's ``__init__`` says what it offers;
3. no module imports itself through a chain of other modules (a cycle), type-only
   imports included: a cycle that only type checking sees still ties two modules into
   one.

The sans-IO rule for the core (no trio, no sockets, no files, no clocks) is a fourth
check: the core imports only the standard-library and third-party modules of an allow
list (``CORE_MAY_USE``), reads nothing of ``sys`` but its constants, and calls no
``now()``.
"""

from __future__ import annotations

import ast
import functools
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
    "broker.cluster": {"broker.core", "broker.runtime"},
    "broker.api": {"broker", "broker.core", "broker.runtime", "broker.http", "broker.metrics", "broker.cluster"},
    # the AMQP listener reuses the API layer's permission checks and login (Access,
    # Authenticator.login) rather than a second copy of them
    "broker.amqp": {"broker", "broker.core", "broker.runtime", "broker.api"},
    "broker.config": {"broker", "broker.core", "broker.storage", "broker.runtime", "broker.http"},
    "broker.logs": {"broker.config"},
    "broker.app": {
        "broker.amqp",
        "broker.api",
        "broker.cluster",
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
    # the benchmark harness drives brokers as subprocesses; its ackbus worker is a client
    "bench": {"client"},
}

#: The top-level packages whose modules are read.
TOP_LEVEL = ("broker", "client", "bench")

#: Everything outside ackbus the core may import: it is a plain state machine (time, ids
#: and the log's bytes arrive as arguments), so only modules that compute. An allow
#: list: a new import fails here until someone decides it keeps the core pure.
CORE_MAY_USE = frozenset(
    {
        "__future__",
        "abc",
        "array",
        "base64",
        "bisect",
        "collections",
        # copy: a view's JSON-ready dicts are copies of the entities' (queueinfo.py)
        "copy",
        "dataclasses",
        # datetime: conversions of epoch seconds given as arguments (a clock is caught
        # by test_core_reads_no_clock)
        "datetime",
        # decimal: AMQP's decimal field values in message headers, checked (fieldtables.py)
        "decimal",
        "enum",
        "functools",
        "hashlib",
        "heapq",
        "itertools",
        "json",
        "math",
        "operator",
        "re",
        "struct",
        # sys: only its constants (CORE_SYS_CONSTANTS), checked below
        "sys",
        "types",
        "typing",
        "zlib",
        # the IANA time-zone database: data, read once per zone name
        "zoneinfo",
        # third party: cron expressions (pure functions of a datetime), JSON codec
        "cronsim",
        "orjson",
    }
)

#: What the core may read of ``sys``: constants of the machine, not of the process.
CORE_SYS_CONSTANTS = frozenset({"byteorder"})

#: Calls that read a clock (``datetime.now()``, ``date.today()``...): not in the core.
CLOCK_CALLS = frozenset({"now", "utcnow", "today"})


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
    return sorted(p for top in TOP_LEVEL for p in (ROOT / top).rglob("*.py"))


_DYNAMIC_IMPORTERS = ("import_module", "__import__")


def _dynamic_import(node: ast.Call) -> tuple[str | None, list[str]] | None:
    """For ``importlib.import_module(name)``, ``import_module(name)`` or
    ``__import__(name, ..., fromlist)``: the name (None if not a constant string) and
    the constant ``fromlist``; None for any other call."""
    func = node.func
    if isinstance(func, ast.Attribute):
        if not (func.attr == "import_module" and isinstance(func.value, ast.Name) and func.value.id == "importlib"):
            return None
        called = func.attr
    elif isinstance(func, ast.Name) and func.id in _DYNAMIC_IMPORTERS:
        called = func.id
    else:
        return None
    arg = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
    name = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
    fromlist: list[str] = []
    if called == "__import__":
        given = node.args[3] if len(node.args) > 3 else next(
            (k.value for k in node.keywords if k.arg == "fromlist"), None
        )
        if isinstance(given, (ast.List, ast.Tuple)):
            fromlist = [e.value for e in given.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return name, fromlist


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
        elif isinstance(node, ast.Call):
            found = _dynamic_import(node)
            if found is None:
                continue
            name, fromlist = found
            if name is None:
                yield Import(module, DYNAMIC, node.lineno, path)
                continue
            if name.startswith("."):  # import_module(".x", __package__)
                level = len(name) - len(name.lstrip("."))
                base_parts = package.split(".")
                if level > 1:
                    base_parts = base_parts[: -(level - 1)]
                rest = name[level:]
                name = ".".join(base_parts) + (f".{rest}" if rest else "")
            yield Import(module, name, node.lineno, path)
            for item in fromlist:
                if _exists(f"{name}.{item}"):
                    yield Import(module, f"{name}.{item}", node.lineno, path)
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
    if parts[0] not in TOP_LEVEL:
        return None
    if parts[0] in ("client", "bench"):
        return parts[0]
    if len(parts) == 1:
        return "broker"
    return f"broker.{parts[1]}"


#: The target of a dynamic import whose name is computed: nobody can check it.
DYNAMIC = "<computed name>"


def all_imports() -> list[Import]:
    """Every import of the source tree under ``ROOT``."""
    return list(_imports_under(ROOT))


@functools.cache
def _imports_under(root: pathlib.Path) -> tuple[Import, ...]:
    """Read once a process for each root: the rules below check the same unchanged tree
    (each read is ~1 s of parsing)."""
    return tuple(imp for path in _source_files() for imp in read_imports(path))


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


def core_outside_imports(imports: list[Import]) -> list[str]:
    """The core's imports of anything outside ackbus that ``CORE_MAY_USE`` lacks."""
    return sorted(
        f"{imp}: not in CORE_MAY_USE (the core computes; IO is the runtime's)"
        for imp in imports
        if layer_of(imp.importer) == "broker.core"
        and layer_of(imp.target) is None
        and imp.target.split(".")[0] not in CORE_MAY_USE
    )


def core_impure_uses(path: pathlib.Path) -> list[str]:
    """In one core module: ``sys`` read for more than its constants, a clock called."""
    rel = path.relative_to(ROOT)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys":
            if node.attr not in CORE_SYS_CONSTANTS:
                found.append(f"{rel}:{node.lineno}: sys.{node.attr} (the core reads only {sorted(CORE_SYS_CONSTANTS)})")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            found += [
                f"{rel}:{node.lineno}: from sys import {alias.name}"
                for alias in node.names
                if alias.name not in CORE_SYS_CONSTANTS
            ]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCK_CALLS:
            found.append(f"{rel}:{node.lineno}: .{node.func.attr}() reads a clock; time arrives as an argument")
    return found


def test_core_imports_only_what_computes() -> None:
    assert core_outside_imports(all_imports()) == []


def test_core_reads_no_process_state_and_no_clock() -> None:
    found = [line for path in _source_files() if layer_of(_module_name(path)) == "broker.core"
             for line in core_impure_uses(path)]
    assert found == []


def test_no_dynamic_import_of_a_computed_name() -> None:
    assert [f"{imp}" for imp in all_imports() if imp.target == DYNAMIC] == []


def test_bench_modules_form_no_import_cycle() -> None:
    """(The rule above covers bench too; this names it, since bench had the last one.)"""
    bench = [imp for imp in all_imports() if layer_of(imp.importer) == "bench"]
    assert bench, "no imports read from bench/"
    assert cycles(bench) == []


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
    for pkg in ("broker", "broker/core", "broker/storage", "broker/http", "client", "bench"):
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


@pytest.mark.parametrize(
    "text",
    [
        'import importlib\nimportlib.import_module("broker.storage.fs")\n',
        'from importlib import import_module\nimport_module("..storage.fs", __package__)\n',
        '__import__("broker.storage.fs")\n',
        '__import__("broker.storage", globals(), locals(), ["fs"], 0)\n',
    ],
)
def test_a_dynamic_import_of_a_forbidden_layer_is_caught(fake_root: pathlib.Path, text: str) -> None:
    _write(fake_root, "broker/storage/fs.py", "X = 1\n")
    path = _write(fake_root, "broker/core/names.py", text)
    found = layering_violations(list(read_imports(path)))
    assert found and all("broker.core may not import broker.storage" in f for f in found), found


def test_a_dynamic_import_of_a_computed_name_is_caught(fake_root: pathlib.Path) -> None:
    path = _write(fake_root, "client/a.py", "import importlib\nNAME = 'x'\nimportlib.import_module(NAME)\n")
    assert [imp.target for imp in read_imports(path)] == ["importlib", DYNAMIC]


def test_a_core_import_outside_the_allow_list_is_caught(fake_root: pathlib.Path) -> None:
    path = _write(fake_root, "broker/core/names.py", "import pathlib\nimport random\nimport heapq\n")
    found = core_outside_imports(list(read_imports(path)))
    assert len(found) == 2 and "imports pathlib" in found[0] and "imports random" in found[1]


def test_core_sys_beyond_its_constants_and_clocks_are_caught(fake_root: pathlib.Path) -> None:
    path = _write(
        fake_root,
        "broker/core/names.py",
        "import sys\nfrom datetime import datetime\nA = sys.byteorder\nB = sys.argv\nC = datetime.now()\n",
    )
    found = core_impure_uses(path)
    assert len(found) == 2 and "sys.argv" in found[0] and "now()" in found[1]


def test_a_bench_cycle_through_private_names_is_caught(fake_root: pathlib.Path) -> None:
    a = _write(fake_root, "bench/workloads.py", "from bench.growth import growth\n")
    b = _write(fake_root, "bench/growth.py", "def growth():\n    from bench.workloads import _helper\n")
    assert cycles([*read_imports(a), *read_imports(b)]) == [["bench.growth", "bench.workloads"]]


def test_bench_may_import_the_client_but_not_the_broker(fake_root: pathlib.Path) -> None:
    path = _write(fake_root, "bench/worker.py", "import client\nfrom broker.storage import fs\n")
    found = layering_violations(list(read_imports(path)))
    assert len(found) == 1 and "bench may not import broker.storage" in found[0]


def _class_names(package: str) -> dict[str, list[str]]:
    """Top-level class names of a package's modules, with where each is defined."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    return found


#: Class names both sides use for the two ends of one thing: the protocol's events
#: (the broker's effect and the client's decoded event of one line), and each side's
#: own view of topology, schedules, transactions, settings and pending confirms. The
#: names that confused readers (``Channel``, ``Message``, ``BrokerError``,
#: ``ChannelSession``) are not here: the broker's are ``ChannelState``,
#: ``StoredMessage``, ``ErrorReply`` and ``ServedChannel``. Do not add to this list.
SHARED_CLASS_NAMES = frozenset(
    {
        "Ack", "Nack", "Deliver", "Return", "ConsumerActive", "ConsumerCancelled",
        "Endpoint", "PendingConfirms", "Response", "Schedules", "Settings", "Topology",
        "Transactions",
    }
)


def test_client_and_broker_name_no_new_class_alike() -> None:
    """A class name means one thing in this repository: grep for ``Channel`` or
    ``Message`` finds the client's (the documented API), never a broker class too."""
    broker, client = _class_names("broker"), _class_names("client")
    clashes = {name: broker[name] + client[name] for name in sorted(set(broker) & set(client))}
    assert {name: where for name, where in clashes.items() if name not in SHARED_CLASS_NAMES} == {}
    for name in ("Channel", "Message", "BrokerError", "ChannelSession"):
        assert name not in broker, f"{name} is the client's name: {broker[name]}"

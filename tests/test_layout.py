"""Layer boundaries: the core is sans-IO, storage does not know HTTP."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _imports(folder: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
    return names


def test_core_is_sans_io() -> None:
    forbidden = {"trio", "h11", "socket", "os", "time", "asyncio", "threading"}
    found = {name.split(".")[0] for name in _imports(ROOT / "broker" / "core")}
    assert not (found & forbidden), found & forbidden


def test_storage_does_not_import_http() -> None:
    found = _imports(ROOT / "broker" / "storage")
    assert not any(name.startswith("broker.http") for name in found), found

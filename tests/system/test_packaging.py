"""Installing ackbus prints no setuptools deprecation warnings (``scripts/serve``
printed about a hundred lines of them): the package's metadata is built here with the
setuptools the build system asks for, every warning shown, and must come out clean,
with the license as an SPDX expression and the Python it needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

from tests.support.broker import ROOT

HOOK = """
import sys
from setuptools import build_meta
print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))
"""


def test_metadata_builds_without_deprecation_warnings(tmp_path: Path) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (requirement,) = [r for r in pyproject["build-system"]["requires"] if r.startswith("setuptools")]
    wanted = int(requirement.partition(">=")[2].split(".")[0])
    installed = int(version("setuptools").split(".")[0])
    assert installed >= wanted, f"setuptools {version('setuptools')} < {requirement}: run scripts/test to update .venv"

    source = tmp_path / "src"  # what the metadata needs, not the source tree itself
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for package in ("broker", "client"):
        (source / package).mkdir()
        shutil.copy(ROOT / package / "__init__.py", source / package / "__init__.py")
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-W", "always", "-c", HOOK, str(out)], cwd=source,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Deprecat" not in done.stderr and "Warning" not in done.stderr, done.stderr[-3000:]
    metadata = (out / done.stdout.split()[-1] / "METADATA").read_text()
    assert "License-Expression: MIT" in metadata
    assert "License-File: LICENSE" in metadata
    assert "Requires-Python: >=3.11" in metadata
    assert "Classifier: License ::" not in metadata


def test_the_readme_says_which_python() -> None:
    assert "Python 3.11" in (ROOT / "README.md").read_text()

"""The compiled build and the interpreted source do the same: the core's scenario
(``tests/compiled/core_scenario.py``: publishes with deduplication, routing to durable,
transient, bounded and fan-out queues, deliveries, acks, nacks, errors, durability and
time), the channel's (``tests/compiled/channel_scenario.py``: received blocks of op
lines through the compiled per-chunk path into the core) and the AMQP listener's frame
reading (``tests/compiled/amqp_scenario.py``: seeded byte streams, whole and broken)
run under each build, in a process of its own, print the same effects, answers and
events, line for line.

The compiled build's tree comes from ``ACKBUS_COMPILED_TREE`` (``scripts/test`` builds
it and sets it); without it the test is skipped, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent.parent.parent


def _run(root: Path, seed: int, count: int, scenario: str = "core_scenario") -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    result = subprocess.run(
        [sys.executable, "-P", "-m", f"tests.compiled.{scenario}", str(seed), str(count)],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


def _build_of(root: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-P", "-c", "from broker.runtime import build_name; print(build_name())"],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE, text=True, timeout=60,
    )
    return result.stdout.strip()


@pytest.fixture(scope="module")
def roots() -> tuple[Path, Path]:
    compiled = os.environ.get("ACKBUS_COMPILED_TREE")
    if not compiled:
        pytest.skip("no compiled build: run scripts/test (it builds one when a C compiler is there)")
    source = Path(os.environ.get("ACKBUS_SOURCE_ROOT", _HERE))
    tree = Path(compiled)
    assert _build_of(source) == "interpreted"
    assert _build_of(tree) == "compiled"
    return source, tree


def test_version_names_the_build(roots: tuple[Path, Path]) -> None:
    """``--version`` (and ``GET /overview``'s ``build``, from the same function) says
    which build runs."""
    for root, name in zip(roots, ("interpreted", "compiled")):
        result = subprocess.run(
            [sys.executable, "-P", "-m", "broker", "--version"], cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE, text=True, timeout=60,
        )
        assert result.stdout.strip().endswith(f"({name} build)"), result.stdout


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_core_does_the_same_in_both_builds(roots: tuple[Path, Path], seed: int) -> None:
    source, tree = roots
    interpreted = _run(source, seed, 3000)
    compiled = _run(tree, seed, 3000)
    assert len(interpreted) > 3000  # effects and answers were printed
    for n, (a, b) in enumerate(zip(interpreted, compiled)):
        assert a == b, f"line {n + 1} differs:\ninterpreted: {a}\ncompiled:    {b}"
    assert len(interpreted) == len(compiled)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_amqp_frame_reading_does_the_same_in_both_builds(roots: tuple[Path, Path], seed: int) -> None:
    """``broker/amqp/hotpath.py`` (compiled) with the connection around it: the same
    events, output and state for the same bytes (``tests/compiled/amqp_scenario.py``)."""
    source, tree = roots
    interpreted = _run(source, seed, 150, "amqp_scenario")
    compiled = _run(tree, seed, 150, "amqp_scenario")
    assert sum(" Content(" in line for line in interpreted) > 1000  # publishes were read
    assert sum(" Acks(" in line for line in interpreted) > 100
    for n, (a, b) in enumerate(zip(interpreted, compiled)):
        assert a == b, f"line {n + 1} differs:\ninterpreted: {a}\ncompiled:    {b}"
    assert len(interpreted) == len(compiled)


def test_the_channel_path_is_compiled_in_the_tree(roots: tuple[Path, Path]) -> None:
    """The compiled tree runs the per-chunk path and the outbox as extension modules (else the test
    below would compare the source with itself)."""
    _source, tree = roots
    result = subprocess.run(
        [sys.executable, "-P", "-c",
         "import broker.api.channel.chunk as c, broker.runtime.channelops as o, broker.api.channel.outbox as b;"
         "print(c.__file__, o.__file__, b.__file__)"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.PIPE, text=True, timeout=60,
    )
    paths = result.stdout.split()
    assert len(paths) == 3 and all(path.endswith(".so") for path in paths), result.stdout


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_channel_path_does_the_same_in_both_builds(roots: tuple[Path, Path], seed: int) -> None:
    source, tree = roots
    interpreted = _run(source, seed, 1500, "channel_scenario")
    compiled = _run(tree, seed, 1500, "channel_scenario")
    assert sum(line.startswith("Deliver(") for line in interpreted) > 500  # publishes and acks went through
    assert any(line.startswith("error ") for line in interpreted)
    for n, (a, b) in enumerate(zip(interpreted, compiled)):
        assert a == b, f"line {n + 1} differs:\ninterpreted: {a}\ncompiled:    {b}"
    assert len(interpreted) == len(compiled)

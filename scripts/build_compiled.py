"""Build the compiled build of ackbus's per-message path (mypyc), or reuse the cached one.

The compiled build is a copy of ``broker/``, ``client/``, ``tests/`` and
``pyproject.toml`` in ``.build/compiled/<key>/``, in which the modules of
:data:`COMPILED` are extension modules (compiled by mypyc from the same source) next
to their ``.py`` files; Python imports an extension module before a source file of
the same name, so that tree runs compiled where it has one and interpreted elsewhere.
``<key>`` is a digest of every source file mypyc reads (``broker/core`` and the
other compiled modules), the module list, and the Python and mypy versions: an
unchanged source reuses the build, only the other files are copied again.

Usage: ``python scripts/build_compiled.py`` prints the tree's path on stdout, or
exits 2 (printing why on stderr) when no build can be made (no C compiler, no mypyc).
``scripts/serve`` and ``scripts/test`` call it; docs/benchmarks.md, "The builds".
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The per-message path: publish -> route -> dedup -> record -> index; deliveries and
#: settling; the client's publish handle, pending window, confirms and event decoding
#: (docs/architecture.md, "The compiled build"). Data modules they share
#: classes with are compiled with them (a compiled class cannot be subclassed by an
#: interpreted one).
COMPILED = [
    "broker/core/publishing.py",
    "broker/core/dedup.py",
    "broker/core/dedupkeys.py",
    "broker/core/log.py",
    "broker/core/queues.py",
    # a queue's timer firing (delays due, expiries) and its parked long-polls woken
    "broker/core/queuetimers.py",
    "broker/core/longpolls.py",
    "broker/core/lanes.py",
    "broker/core/delivery.py",
    "broker/core/confirms.py",
    "broker/core/routing.py",
    "broker/core/topology.py",
    "broker/core/message.py",
    "broker/core/effects.py",
    "broker/core/coordstate.py",
    "broker/core/entities.py",
    "broker/core/paging.py",
    "broker/core/shared.py",
    "broker/core/broker.py",
    # the facade's parts: the log's feedback (every durable report), the timer heap
    # fired, a replicated queue's bounds
    "broker/core/durability.py",
    "broker/core/deadlines.py",
    "broker/core/queuecontrols.py",
    "broker/core/queueinfo.py",
    # the ENQUEUE record written by every publish and read back by every page-in
    "broker/core/records.py",
    "broker/core/pager.py",
    # the WAL's record framing (every record written passes through encode_records)
    "broker/storage/framing.py",
    # the runtime's book of publishes waiting for their confirm (two calls a publish)
    "broker/runtime/confirms.py",
    # a channel's received chunk: its lines split, decoded at once, runs of publishes and
    # acks applied in one call, through the channel's commands
    "broker/api/channel/chunk.py",
    "broker/runtime/channelops.py",
    # a channel's outbox encoded: deliveries as rows of deliveries events, their credit
    "broker/api/channel/outbox.py",
    # the client's publish handle, pending window and confirm handling; its events
    "client/pending.py",
    "client/publisher.py",
    "client/publishing.py",
    # the client's consume path: rows handed out as messages, their streams
    "client/consumer.py",
    "client/consumer_registry.py",
    "client/settling.py",
    "client/codec.py",
    "client/properties.py",
    "client/events.py",
    # the AMQP listener's one-pass reader of publishes and acks (sans-IO)
    "broker/amqp/hotpath.py",
]

#: What is copied into the tree (what the broker, the client and the tests read).
COPIED = ["broker", "client", "tests", "bench", "scripts", "docs", "pyproject.toml"]


def _fail(why: str) -> None:
    print(f"compiled build unavailable: {why}", file=sys.stderr)
    raise SystemExit(2)


def build_key() -> str:
    import mypy.version

    digest = hashlib.sha256()
    digest.update(f"{sys.version}|{mypy.version.__version__}|{sorted(COMPILED)}".encode())
    sources = sorted({*ROOT.glob("broker/core/*.py"), *(ROOT / m for m in COMPILED)})
    for path in sources:
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _copy_sources(tree: Path) -> None:
    """Copy the checkout's files into ``tree`` (the extension modules stay)."""
    for name in COPIED:
        source = ROOT / name
        if source.is_file():
            shutil.copy2(source, tree / name)
            continue
        shutil.copytree(
            source, tree / name, dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.so", ".pytest_cache", ".hypothesis", ".build"),
        )


def main() -> None:
    if shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc") is None:
        _fail("no C compiler")
    if shutil.which("mypyc", path=str(Path(sys.executable).parent)) is None:
        _fail("no mypyc (pip install mypy)")
    key = build_key()
    base = ROOT / ".build" / "compiled"
    tree = base / key
    done = tree / ".complete"
    if not done.exists():
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        _copy_sources(tree)
        print(f"building the compiled build ({len(COMPILED)} modules, mypyc) in {tree}", file=sys.stderr)
        env = {**os.environ, "MYPYC_OPT_LEVEL": os.environ.get("MYPYC_OPT_LEVEL", "3")}
        result = subprocess.run(
            [str(Path(sys.executable).parent / "mypyc"), *COMPILED],
            cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-4000:])
            shutil.rmtree(tree, ignore_errors=True)
            _fail("mypyc failed")
        shutil.rmtree(tree / "build", ignore_errors=True)
        done.write_text(key)
        for old in base.iterdir():  # one build is kept: the current one
            if old != tree:
                shutil.rmtree(old, ignore_errors=True)
    else:
        _copy_sources(tree)
    print(tree)


if __name__ == "__main__":
    main()

"""Named fault points for crash and failure tests.

One job: let a test make the storage code crash or fail at an exact step, and make that
cost nothing when no test asks for it.

Fault points are inactive unless the environment variable ``ACKBUS_FAULTS`` names them
(read once, on first use) or a test activates them with :func:`activate`. They are for
tests only: ``ACKBUS_FAULTS`` is ignored unless ``ACKBUS_FAULTS_ALLOWED=1`` is set as
well, so that a stray variable cannot arm a kill in a production broker (which refuses
to start when it finds ``ACKBUS_FAULTS`` without the second variable; see
:func:`check_environment`). The variable is a comma-separated list of
``name[@skip][:count]``:

* ``skip`` - let the first ``skip`` hits pass (default 0);
* ``count`` - then trigger this many times (default: every hit).

Kill points end the process with SIGKILL, as a power cut or ``kill -9`` would, at exactly
that step (for subprocess crash tests):

``wal.after_write``       the batch is written, not yet fsynced
``wal.before_fsync``      about to fsync the active segment
``wal.after_fsync``       fsynced, ``on_durable`` not yet called
``wal.after_segment_create``  a new segment file exists, the directory is not yet fsynced
``checkpoint.after_tmp_write``  the temporary checkpoint is written, not yet fsynced
``checkpoint.before_log_sync``  fsynced, the log not yet synced through its LSN
``checkpoint.before_rename``    fsynced and the log synced, not yet renamed into place
``checkpoint.after_rename``     renamed, directory not yet fsynced, old ones not deleted
``checkpoint.after_dir_fsync``  in place and durable, the segments it covers not yet deleted
``checkpoint.after_release``    the segments it covers deleted, compaction not yet done

Error points raise ``OSError`` so that the failure paths can be tested; the suffix
names the error (``_error``: ``EIO``, ``_enospc``: ``ENOSPC``, ``_emfile``: ``EMFILE``):

``wal.write_error``, ``wal.write_enospc``       the batch write fails after writing half of it
``wal.fsync_error``, ``wal.fsync_enospc``       the fsync of the active segment fails
``wal.segment_create_error``, ``wal.segment_create_enospc``
                                                creating a segment file fails (rollover, probe)
``wal.preallocate_enospc``                      reserving space ahead of a segment fails
``checkpoint.write_error``, ``checkpoint.write_enospc``
                                                a write to the temporary checkpoint file fails
``checkpoint.fsync_error``, ``checkpoint.fsync_enospc``
                                                its fsync fails
``checkpoint.rename_error``, ``checkpoint.rename_enospc``
                                                renaming it into place fails
``checkpoint.dir_fsync_error``, ``checkpoint.dir_fsync_enospc``
                                                the fsync of the checkpoint directory fails
``reader.open_emfile``                          opening a segment to read records back fails
``reader.read_error``                           reading records back fails

Example: ``ACKBUS_FAULTS=wal.after_write@3`` kills the process after its fourth batch
write; ``ACKBUS_FAULTS=wal.fsync_error:2`` fails the first two fsyncs.

In-process tests can replace the SIGKILL with an exception via :func:`set_kill_handler`.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = [
    "ALLOW_ENV_VAR",
    "ENV_VAR",
    "FaultsNotAllowed",
    "check_environment",
    "KILL_POINTS",
    "ERROR_POINTS",
    "FAULT_POINTS",
    "hit",
    "activate",
    "deactivate",
    "reset",
    "injected",
    "parse_spec",
    "set_kill_handler",
    "active",
]

ENV_VAR: Final = "ACKBUS_FAULTS"
ALLOW_ENV_VAR: Final = "ACKBUS_FAULTS_ALLOWED"

KILL_POINTS: Final = frozenset(
    {
        "wal.after_write",
        "wal.before_fsync",
        "wal.after_fsync",
        "wal.after_segment_create",
        "checkpoint.after_tmp_write",
        "checkpoint.before_log_sync",
        "checkpoint.before_rename",
        "checkpoint.after_rename",
        "checkpoint.after_dir_fsync",
        "checkpoint.after_release",
    }
)
#: Error points and the ``errno`` each raises.
ERROR_POINTS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "wal.write_error": errno.EIO,
        "wal.write_enospc": errno.ENOSPC,
        "wal.fsync_error": errno.EIO,
        "wal.fsync_enospc": errno.ENOSPC,
        "wal.segment_create_error": errno.EIO,
        "wal.segment_create_enospc": errno.ENOSPC,
        "wal.preallocate_enospc": errno.ENOSPC,
        "checkpoint.write_error": errno.EIO,
        "checkpoint.write_enospc": errno.ENOSPC,
        "checkpoint.fsync_error": errno.EIO,
        "checkpoint.fsync_enospc": errno.ENOSPC,
        "checkpoint.rename_error": errno.EIO,
        "checkpoint.rename_enospc": errno.ENOSPC,
        "checkpoint.dir_fsync_error": errno.EIO,
        "checkpoint.dir_fsync_enospc": errno.ENOSPC,
        "reader.open_emfile": errno.EMFILE,
        "reader.read_error": errno.EIO,
    }
)
FAULT_POINTS: Final = KILL_POINTS | ERROR_POINTS.keys()


@dataclass(slots=True)
class _Fault:
    skip: int
    count: int | None  # None: every hit after the skipped ones


_lock = threading.Lock()
_active: dict[str, _Fault] = {}
_env_loaded = False
_kill_handler: Callable[[str], None] | None = None


def parse_spec(spec: str) -> dict[str, tuple[int, int | None]]:
    """Parse an ``ACKBUS_FAULTS`` value into ``{name: (skip, count)}``.

    Raises:
        ValueError: an unknown fault point name or a malformed skip/count, so that a typo
            in a crash test fails loudly instead of silently testing nothing.
    """
    result: dict[str, tuple[int, int | None]] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, count_text = item.partition(":")
        name, _, skip_text = name.partition("@")
        name = name.strip()
        if name not in FAULT_POINTS:
            raise ValueError(
                f"unknown fault point {name!r} in {ENV_VAR}; "
                f"known: {', '.join(sorted(FAULT_POINTS))}"
            )
        try:
            skip = int(skip_text) if skip_text else 0
            count = int(count_text) if count_text else None
        except ValueError:
            raise ValueError(
                f"malformed fault spec {item!r}: expected name[@skip][:count]"
            ) from None
        if skip < 0 or (count is not None and count < 1):
            raise ValueError(f"malformed fault spec {item!r}: skip >= 0, count >= 1")
        result[name] = (skip, count)
    return result


class FaultsNotAllowed(Exception):
    """``ACKBUS_FAULTS`` is set without ``ACKBUS_FAULTS_ALLOWED=1``."""


def check_environment(environ: dict[str, str] | None = None) -> None:
    """Refuse fault points named in the environment unless tests allowed them.

    Raises:
        FaultsNotAllowed: ``ACKBUS_FAULTS`` is set and ``ACKBUS_FAULTS_ALLOWED`` is not 1.
        ValueError: it is allowed but malformed (see :func:`parse_spec`).
    """
    env = os.environ if environ is None else environ
    spec = env.get(ENV_VAR, "")
    if not spec.strip():
        return
    if env.get(ALLOW_ENV_VAR) != "1":
        raise FaultsNotAllowed(
            f"{ENV_VAR} is set ({spec!r}): it arms test-only fault points that kill the "
            f"process or fail its writes. Unset it, or set {ALLOW_ENV_VAR}=1 as well "
            "if this is a test."
        )
    parse_spec(spec)


def _load_env_locked() -> None:
    global _env_loaded
    if _env_loaded:
        return
    _env_loaded = True
    if os.environ.get(ALLOW_ENV_VAR) != "1":
        return
    for name, (skip, count) in parse_spec(os.environ.get(ENV_VAR, "")).items():
        _active.setdefault(name, _Fault(skip, count))


def activate(name: str, *, count: int | None = None, skip: int = 0) -> None:
    """Arm a fault point in this process (after ``skip`` hits, ``count`` times).

    Raises:
        ValueError: unknown name.
    """
    if name not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {name!r}")
    with _lock:
        _load_env_locked()
        _active[name] = _Fault(skip, count)


def deactivate(name: str) -> None:
    """Disarm one fault point."""
    with _lock:
        _load_env_locked()
        _active.pop(name, None)


def reset() -> None:
    """Disarm every fault point (including those from the environment) and restore SIGKILL."""
    global _kill_handler
    with _lock:
        _load_env_locked()
        _active.clear()
        _kill_handler = None


def active() -> dict[str, tuple[int, int | None]]:
    """The armed fault points: ``{name: (skip remaining, count remaining)}``."""
    with _lock:
        _load_env_locked()
        return {name: (f.skip, f.count) for name, f in _active.items()}


@contextmanager
def injected(name: str, *, count: int | None = None, skip: int = 0) -> Iterator[None]:
    """Arm a fault point for the duration of a ``with`` block."""
    activate(name, count=count, skip=skip)
    try:
        yield
    finally:
        deactivate(name)


def set_kill_handler(handler: Callable[[str], None] | None) -> None:
    """Replace SIGKILL for kill points (for in-process tests); None restores SIGKILL.

    The handler receives the point's name and should raise; if it returns, the code
    carries on as if nothing happened.
    """
    global _kill_handler
    with _lock:
        _kill_handler = handler


def hit(name: str) -> None:
    """Pass a fault point: do nothing unless it is armed.

    Raises:
        OSError: at an armed error point, with its ``errno`` (see ``ERROR_POINTS``).
    """
    if not _active and _env_loaded:
        return  # the common case: one dict check
    with _lock:
        _load_env_locked()
        fault = _active.get(name)
        if fault is None:
            return
        if fault.skip > 0:
            fault.skip -= 1
            return
        if fault.count is not None:
            fault.count -= 1
            if fault.count <= 0:
                del _active[name]
        handler = _kill_handler
    err = ERROR_POINTS.get(name)
    if err is not None:
        raise OSError(err, f"{os.strerror(err)} (injected fault {name})")
    if handler is not None:
        handler(name)
        return
    os.kill(os.getpid(), signal.SIGKILL)

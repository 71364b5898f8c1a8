"""Test doubles for the storage layer (like ``trio.testing``: for tests, never production).

One job: :class:`SimulatedDisk`, a :class:`~broker.storage.fs.FileSystem` over real files
that remembers what was made durable and can *lose power*: every byte written after a
file's last fsync is dropped, and so is every creation, rename or deletion in a
directory after that directory's last fsync. It can also slow down or fail fsyncs and
writes, to test group commit and the failure path.

Model (what a careful POSIX file system guarantees, and no more):

* A file's durable content is its content at its last ``sync()`` (``fdatasync``), or at
  a ``FileSystem.truncate`` (which syncs). A file never synced is empty after power loss.
  Space preallocated past the written end counts as zeros, durable with the next sync,
  as ``fallocate`` is on ext4 and XFS.
* A directory's durable entries are those at its last ``sync_dir``. Directories that
  existed before the disk first saw them, and the files in them, count as durable then.
* Directories themselves are assumed durable once created (``makedirs`` fsyncs parents).
* Reads see everything written, as the page cache would.
* ``capacity_bytes`` makes a small disk: a write or preallocation that would take the
  files in the directories the disk knows past it fails with ``ENOSPC`` (what fits of
  a write is written first).
* A power cut may also be *torn* (:meth:`SimulatedDisk.lose_power` with ``keep``):
  any subset of the sector-sized pieces written since the last fsync reaches the disk,
  in any order, as a real disk may leave them.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from .fs import OS_FILE_SYSTEM, FileSystem, WritableFile

__all__ = ["SimulatedDisk", "SimulatedCrash", "SECTOR_BYTES", "KeepPiece"]

#: The piece size of a torn power cut by default: a disk sector.
SECTOR_BYTES = 512

#: ``keep(path, offset)``: does the unsynced piece of ``path`` at ``offset`` reach the disk?
KeepPiece = Callable[[str, int], bool]


class SimulatedCrash(BaseException):
    """Raise it from a fault kill handler to crash in-process instead of SIGKILL.

    A BaseException: like a real crash, ``except Exception`` cleanup does not run.
    """


@dataclass(eq=False)
class _Node:
    """One file (an inode): its current name and its durable content."""

    path: str | None
    durable: bytes = b""
    durable_zeros: int = 0  # preallocated bytes after ``durable`` (zeros), as of the last sync


@dataclass(eq=False)
class _FailPlan:
    count: int = 0
    err: int = errno.EIO


@dataclass(eq=False)
class _Stats:
    file_syncs: int = 0
    dir_syncs: int = 0
    writes: int = 0
    synced_paths: list[str] = field(default_factory=list)


class _SimFile:
    def __init__(self, disk: SimulatedDisk, node: _Node, real: WritableFile, end: int) -> None:
        self._disk = disk
        self._node = node
        self._real = real
        self._dead = False
        self._end = end  # where the next write goes: the end of what was written

    @property
    def path(self) -> str:
        return self._node.path or self._real.path

    def _check(self) -> None:
        self._disk._check_alive()
        if self._dead:
            raise OSError(errno.EBADF, "file handle lost in a simulated power cut")

    def write(self, data: bytes) -> None:
        self._check()
        disk = self._disk
        with disk._lock:
            disk.stats.writes += 1
            plan = disk._write_failures
            fail = plan.count > 0
            if fail:
                plan.count -= 1
        if fail:
            self._real.write(data[: len(data) // 2])
            self._end += len(data) // 2
            raise OSError(plan.err, os.strerror(plan.err))
        room = disk._room(self.path, self._end, len(data))
        if room is not None and room < len(data):
            # a full disk: what fits is written, then ENOSPC (as write(2) does)
            if room > 0:
                self._real.write(data[:room])
                self._end += room
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._real.write(data)
        self._end += len(data)

    def write_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        self.write(b"".join(parts))

    def sync(self) -> None:
        self._check()
        disk = self._disk
        hook = disk.sync_hook
        if hook is not None:
            hook(self.path)
        with disk._lock:
            plan = disk._sync_failures
            if plan.count > 0:
                plan.count -= 1
                raise OSError(plan.err, os.strerror(plan.err))
            disk.stats.file_syncs += 1
            if self._node.path is not None:
                disk.stats.synced_paths.append(self._node.path)
                self._node.durable = _read(self._node.path, self._end)
                self._node.durable_zeros = max(0, os.path.getsize(self._node.path) - self._end)

    def truncate(self, size: int) -> None:
        self._check()
        with self._disk._lock:
            if self._disk._truncate_failures.count > 0:
                self._disk._truncate_failures.count -= 1
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        self._real.truncate(size)
        self._end = size

    def preallocate(self, size: int) -> None:
        self._check()
        room = self._disk._room(self.path, 0, size)
        if room is not None and room < size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._real.preallocate(size)

    def close(self) -> None:
        if not self._dead:
            self._dead = True
            self._real.close()
            with self._disk._lock:
                self._disk._open.discard(self)


def _torn_image(image: bytes, current: bytes, path: str, keep: KeepPiece, piece_bytes: int) -> bytes:
    """``image`` (durable) with the pieces of ``current`` that differ and ``keep`` keeps."""
    out = bytearray(image)
    for offset in range(0, len(current), piece_bytes):
        piece = current[offset : offset + piece_bytes]
        if out[offset : offset + len(piece)] == piece:
            continue  # nothing unsynced here
        if not keep(path, offset):
            continue
        if len(out) < offset:
            out.extend(bytes(offset - len(out)))
        out[offset : offset + len(piece)] = piece
    return bytes(out)


def _read(path: str, limit: int = -1) -> bytes:
    with open(path, "rb") as file:
        return file.read(limit)


class SimulatedDisk:
    """A :class:`FileSystem` over real files that can lose power (see the module doc).

    Attributes you may set:
        sync_hook: called with the path before every file fsync, in the syncing
            thread; block in it to make fsync slow (group-commit tests).
        capacity_bytes: the size of a small disk (see the module docstring).
    """

    def __init__(self, base: FileSystem | None = None) -> None:
        self._base = base if base is not None else OS_FILE_SYSTEM
        self._lock = threading.RLock()
        self._names: dict[str, _Node] = {}
        self._durable_entries: dict[str, dict[str, _Node]] = {}
        self._open: set[_SimFile] = set()
        self._sync_failures = _FailPlan()
        self._write_failures = _FailPlan()
        self._truncate_failures = _FailPlan()
        self.sync_hook: Callable[[str], None] | None = None
        #: bytes the files under the directories the disk knows may take in all
        #: (None: no limit); a write or preallocation past it fails with ENOSPC
        self.capacity_bytes: int | None = None
        self.stats = _Stats()
        self._halted: str | None = None

    # -- space ------------------------------------------------------------------

    def used_bytes(self) -> int:
        """What the files in the directories the disk knows take (their sizes)."""
        total = 0
        with self._lock:
            directories = list(self._durable_entries)
        for directory in directories:
            if not os.path.isdir(directory):
                continue
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if os.path.isfile(path):
                    total += os.path.getsize(path)
        return total

    def _room(self, path: str, start: int, length: int) -> int | None:
        """How many of ``length`` bytes written to ``path`` at ``start`` fit under the
        capacity (None: no limit). Bytes within the file's size (written or
        preallocated blocks) take no new space; each byte past it takes one."""
        capacity = self.capacity_bytes
        if capacity is None:
            return None
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        within = max(0, min(length, size - start))
        free = max(0, capacity - self.used_bytes())
        return within + min(length - within, free)

    # -- crashing -----------------------------------------------------------------

    def kill_handler(self, point: str) -> None:
        """A ``faults.set_kill_handler`` handler: halt the disk, raise SimulatedCrash.

        A process killed at a fault point does nothing more; an in-process test cannot
        stop its other tasks as abruptly, so the disk refuses every later operation
        (raising SimulatedCrash) until :meth:`lose_power` or :meth:`crash_process`.
        """
        self.halt(point)
        raise SimulatedCrash(point)

    def halt(self, reason: str = "halted") -> None:
        """Refuse every operation (raise SimulatedCrash) until the next 'reboot'."""
        self._halted = reason

    def _check_alive(self) -> None:
        if self._halted is not None:
            raise SimulatedCrash(f"disk halted ({self._halted})")

    # -- failure injection ------------------------------------------------------

    def fail_syncs(self, count: int = 1, err: int = errno.EIO) -> None:
        """Make the next ``count`` file fsyncs raise ``OSError(err)``."""
        with self._lock:
            self._sync_failures = _FailPlan(count, err)

    def fail_writes(self, count: int = 1, err: int = errno.ENOSPC) -> None:
        """Make the next ``count`` writes write half their data, then raise ``OSError(err)``."""
        with self._lock:
            self._write_failures = _FailPlan(count, err)

    def fail_truncates(self, count: int = 1) -> None:
        """Make the next ``count`` truncations of open files raise ``OSError(EIO)``."""
        with self._lock:
            self._truncate_failures = _FailPlan(count, errno.EIO)

    # -- power ------------------------------------------------------------------

    def lose_power(self, keep: KeepPiece | None = None, *, piece_bytes: int = SECTOR_BYTES) -> None:
        """Drop everything not made durable, on the real files; open handles die.

        ``keep``: a torn power cut. Unsynced writes are cut into aligned pieces of
        ``piece_bytes`` (a disk's sectors), and each piece for which ``keep(path,
        offset)`` is true reaches the disk, whatever the order they were written in;
        the others do not (see :meth:`power_cut_images`). None: no unsynced byte does.
        """
        with self._lock:
            images = self.power_cut_images(keep, piece_bytes=piece_bytes)
            self._halted = None
            for handle in list(self._open):
                handle._dead = True
                handle._real.close()
            self._open.clear()
            names: dict[str, _Node] = {}
            for directory, entries in self._durable_entries.items():
                if not os.path.isdir(directory):
                    continue
                for name in os.listdir(directory):
                    path = os.path.join(directory, name)
                    if os.path.isfile(path):
                        os.remove(path)
                for name, node in entries.items():
                    path = os.path.join(directory, name)
                    with open(path, "wb") as file:
                        file.write(images[path])
                    node.path = path
                    node.durable = images[path]
                    node.durable_zeros = 0
                    names[path] = node
            for node in self._names.values():
                if node.path not in names:
                    node.path = None
            self._names = names

    def unsynced_pieces(self, *, piece_bytes: int = SECTOR_BYTES) -> list[tuple[str, int]]:
        """``(path, offset)`` of every aligned piece of ``piece_bytes`` that a power cut
        now could leave either way: written since its file's last fsync (the ``keep``
        choices of :meth:`lose_power` that matter), in path and offset order."""
        pieces: list[tuple[str, int]] = []

        def record(path: str, offset: int) -> bool:
            pieces.append((path, offset))
            return False

        with self._lock:
            self.power_cut_images(record, piece_bytes=piece_bytes)
        return sorted(pieces)

    def power_cut_images(
        self, keep: KeepPiece | None = None, *, piece_bytes: int = SECTOR_BYTES
    ) -> dict[str, bytes]:
        """What every file would hold after a power cut now, by path (a file not listed
        would not exist), without cutting anything: the durable content, plus the pieces
        of what was written since that ``keep`` selects (see :meth:`lose_power`).

        A kept piece past the durable end makes the file that long (zeros in between,
        as a file system that persisted the size but not every block shows it); a
        truncation not made durable is undone.
        """
        if piece_bytes < 1:
            raise ValueError("piece_bytes must be >= 1")
        images: dict[str, bytes] = {}
        with self._lock:
            for directory, entries in self._durable_entries.items():
                for name, node in entries.items():
                    path = os.path.join(directory, name)
                    image = node.durable + bytes(node.durable_zeros)
                    if keep is not None and node.path is not None and os.path.isfile(node.path):
                        current = _read(node.path)
                        if current != image:
                            image = _torn_image(image, current, path, keep, piece_bytes)
                    images[path] = image
        return images

    def crash_process(self) -> None:
        """Simulate ``kill -9``: open handles die, nothing written is lost."""
        with self._lock:
            self._halted = None
            for handle in list(self._open):
                handle._dead = True
                handle._real.close()
            self._open.clear()

    def durable_content(self, path: str) -> bytes | None:
        """What ``path`` would hold after a power cut now (None: it would not exist)."""
        path = os.path.abspath(path)
        with self._lock:
            entries = self._durable_entries.get(os.path.dirname(path))
            if entries is None:
                return _read(path) if os.path.isfile(path) else None
            node = entries.get(os.path.basename(path))
            return None if node is None else node.durable + bytes(node.durable_zeros)

    # -- FileSystem ---------------------------------------------------------------

    def _adopt(self, directory: str) -> None:
        """Start tracking a directory: what is there now counts as durable."""
        if directory in self._durable_entries:
            return
        entries: dict[str, _Node] = {}
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if os.path.isfile(path):
                    node = self._names.get(path)
                    if node is None:
                        node = _Node(path, _read(path))
                        self._names[path] = node
                    entries[name] = node
        self._durable_entries[directory] = entries

    def _track(self, path: str) -> str:
        path = os.path.abspath(path)
        self._adopt(os.path.dirname(path))
        return path

    def create(self, path: str) -> WritableFile:
        with self._lock:
            self._check_alive()
            path = self._track(path)
            real = self._base.create(path)
            node = _Node(path)
            old = self._names.get(path)
            if old is not None:
                old.path = None
            self._names[path] = node
            handle = _SimFile(self, node, real, 0)
            self._open.add(handle)
            return handle

    def open_append(self, path: str) -> WritableFile:
        with self._lock:
            self._check_alive()
            path = self._track(path)
            real = self._base.open_append(path)
            node = self._names.get(path)
            if node is None:
                node = _Node(path, b"")
                self._names[path] = node
            handle = _SimFile(self, node, real, os.path.getsize(path))
            self._open.add(handle)
            return handle

    def open_read(self, path: str) -> BinaryIO:
        self._check_alive()
        return self._base.open_read(path)

    def listdir(self, path: str) -> list[str]:
        self._check_alive()
        return self._base.listdir(path)

    def exists(self, path: str) -> bool:
        self._check_alive()
        return self._base.exists(path)

    def getsize(self, path: str) -> int:
        self._check_alive()
        return self._base.getsize(path)

    def makedirs(self, path: str) -> None:
        self._check_alive()
        self._base.makedirs(path)

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            self._check_alive()
            src = self._track(src)
            dst = self._track(dst)
            self._base.rename(src, dst)
            node = self._names.pop(src, None)
            if node is None:
                node = _Node(dst, b"")
            old = self._names.get(dst)
            if old is not None:
                old.path = None
            node.path = dst
            self._names[dst] = node

    def remove(self, path: str) -> None:
        with self._lock:
            self._check_alive()
            path = self._track(path)
            self._base.remove(path)
            node = self._names.pop(path, None)
            if node is not None:
                node.path = None

    def truncate(self, path: str, size: int) -> None:
        with self._lock:
            self._check_alive()
            path = self._track(path)
            self._base.truncate(path, size)
            node = self._names.get(path)
            if node is not None:
                node.durable = _read(path)
                node.durable_zeros = 0

    def sync_dir(self, path: str) -> None:
        with self._lock:
            self._check_alive()
            directory = os.path.abspath(path)
            self._adopt(directory)
            self.stats.dir_syncs += 1
            self._durable_entries[directory] = {
                os.path.basename(name): node
                for name, node in self._names.items()
                if os.path.dirname(name) == directory
            }

"""A replicated queue's log on one node: the file every replica of the queue keeps.

(Over 500 lines: every write and its failure handling must keep the file and the
in-memory entries in step under one lock, so they stay one class.)

Where the replicated log lives
------------------------------

Each replica of a quorum queue (leader and followers alike) keeps the queue's log in
``<data_dir>/replicas/<queue>.log``, apart from the node's WAL. An entry is
``(epoch, offset, op)``: offsets count from 1 and never repeat; ``epoch`` is the etcd
revision at which the leader that wrote the entry won its leadership; ``op`` is what
happened to the queue, in words no node's numbering leaks into (``replica_ops.py``):
a message published (``pub``, its id is its offset), delivered (``dlv``), settled
(``set``), a new leader's first entry (``lead``).

The leader's core holds the queue as a classic queue is held (its WAL, its consumers);
the followers' cores do not hold it at all: their copy is this file, which a follower
turns into a queue in its core only when it becomes the leader (``replication.py``).

On disk an entry is framed ``length u32 | crc32 u32 | JSON [epoch, offset, op]``; a
torn or damaged tail (a crash in the middle of a write) is cut when the file is opened.
:meth:`sync` writes what was appended (one write on the file it keeps open) and
fdatasyncs it in a worker thread: a follower acknowledges an offset only once it is
synced, and the leader counts itself in a majority the same way. A failed write or
fsync counts nothing as synced and keeps the entries for the next sync, which first
cuts the file back to its last whole frame. Truncation (a follower dropping a tail
its new leader does not have: truncation by epoch, as in Kafka's KIP-101/279)
rewrites the file (a ``.tmp`` beside it, fsynced, renamed over it).

**Removal.** When the queue is deleted, or this node leaves its replica set,
:meth:`remove` takes the log's lock, so it waits for a rewrite in a worker thread
(compaction, truncation, a snapshot installed) to end rather than racing it: a rename
landing after the unlink would bring the file back, and a later queue of the same name
would read the deleted queue's entries as its own. A removed log refuses every later
write (:class:`ReplicaLogRemoved`); its file and any ``.tmp`` are gone.

**Incarnation.** Beside the log, ``<queue>.incarnation`` holds the create revision
of the queue's definition key in etcd when the log was opened: a queue deleted and
declared again under the same name (while this node was down, or between two of its
reconciling rounds) has a later one, and its replica starts with an empty log rather
than the deleted queue's (``replication.py``).

**Compaction.** The log stays in memory and on disk, so its prefix is compacted once
every replica holds it (:meth:`compact`): the entries up to an offset are replaced by
one ``snap`` entry at that offset (``replica_ops.snapshot_op``: the live messages and
recent deduplication ids the prefix folds into, and where each epoch started, for
truncation by epoch). A follower whose end lies before a snapshot (behind, wiped,
or new) receives the snapshot entry itself and installs it (:meth:`install`) in
place of whatever it had.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import trio

__all__ = ["Entry", "RenamedNotDurable", "ReplicaLog", "ReplicaLogRemoved", "is_snapshot", "replica_log_path"]

#: (epoch, offset, op)
Entry = tuple[int, int, dict[str, Any]]

_FRAME = struct.Struct("<II")
#: A sync whose bytes are at most this many writes them on the event loop (into the
#: page cache: cheaper than handing them to a thread), and fsyncs in a worker thread.
INLINE_WRITE_MAX_BYTES = 256 * 1024


def replica_log_path(data_dir: Path, queue: str) -> Path:
    return data_dir / "replicas" / (quote(queue, safe="") + ".log")


class RenamedNotDurable(OSError):
    """A rewrite renamed its new content over the log's file, but the folder's fsync
    that makes the rename durable failed: the file holds the new content, and after a
    crash it may hold either. The log keeps the new content (as the file does) and
    writes it whole, durably, at the next sync; nothing new counts as synced until
    then."""


class ReplicaLogRemoved(OSError):
    """The log was removed (its queue deleted, or this node no longer one of its
    replicas): nothing more is written to its file. An ``OSError``, so that a task
    still holding the log (a follower being cancelled, a leader's sync) treats it as
    a write that did not happen."""


def is_snapshot(entry: Entry) -> bool:
    """Whether ``entry`` is a snapshot standing for every entry up to its offset."""
    return entry[2].get("t") == "snap"


def _frame(entry: Entry) -> bytes:
    payload = orjson.dumps(list(entry))
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free(entries: list[Entry]) -> None:
    """Empty ``entries`` a slice at a time, so that a thread freeing a long list lets
    the event loop run between slices (freeing it at once holds the GIL throughout)."""
    while entries:
        del entries[-_FREE_SLICE:]


#: how many entries :func:`_free` frees at a time (a millisecond or so)
_FREE_SLICE = 4096


class ReplicaLog:
    """One queue's replicated log on this node (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[Entry] = []
        #: every entry up to this offset is on this node's disk
        self.synced = 0
        #: epoch -> offset of its first entry in this log, in epoch order
        self.epoch_starts: dict[int, int] = {}
        self._unwritten: list[bytes] = []
        self._lock = trio.Lock()
        self.cut_bytes = 0
        #: the file, open for appending (None: opened at the next write)
        self._fd: int | None = None
        #: the length of the file's whole frames: a failed write is cut back to it
        #: (None: the file's length when it is first opened for writing)
        self._good_size: int | None = None
        #: no compaction is tried up to an offset below this: the last try found its
        #: prefix not worth compacting (:meth:`wants_compaction`)
        self._compact_retry_at = 0
        #: set by :meth:`remove`: every later write is refused
        self.removed = False
        #: a rewrite failed after entries were appended to its new content: the next
        #: sync writes the whole log anew (:meth:`_replace_with`)
        self._rewrite_pending = False

    # ----------------------------------------------------------------- reading

    def open(self) -> None:
        """Read the file (creating its folder), cutting a damaged tail."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        pos = 0
        entries: list[Entry] = []
        while pos + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, pos)
            end = pos + _FRAME.size + length
            payload = data[pos + _FRAME.size : end]
            if end > len(data) or zlib.crc32(payload) != crc:
                break
            epoch, offset, op = orjson.loads(payload)
            if entries and offset != entries[-1][1] + 1:
                break
            entries.append((int(epoch), int(offset), op))
            pos = end
        if pos != len(data):
            self.cut_bytes = len(data) - pos
            with open(self.path, "r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())
        self._close_file()
        self._good_size = pos
        self.entries = []
        self.epoch_starts = {}
        for entry in entries:
            self._remember(entry)
        self.synced = self.end_offset

    @property
    def end_offset(self) -> int:
        """The offset of the last entry (0: empty)."""
        return self.entries[-1][1] if self.entries else 0

    @property
    def first_offset(self) -> int:
        return self.entries[0][1] if self.entries else 1

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def read(self, start: int, limit: int) -> list[Entry]:
        """Up to ``limit`` entries from offset ``start``."""
        if not self.entries or start > self.end_offset:
            return []
        i = max(0, start - self.first_offset)
        return self.entries[i : i + limit]

    def end_of_epoch(self, epoch: int) -> int:
        """KIP-279's answer: the offset of the last entry written in ``epoch`` or an
        earlier one (0: none). A follower whose last epoch is ``epoch`` keeps its
        entries up to there and drops the rest."""
        later = [start for e, start in self.epoch_starts.items() if e > epoch]
        if not later:
            return self.end_offset
        return min(later) - 1

    # ----------------------------------------------------------------- writing

    def _remember(self, entry: Entry) -> None:
        self.entries.append(entry)
        if is_snapshot(entry):
            for epoch, start in entry[2].get("epochs") or ():
                self.epoch_starts.setdefault(int(epoch), int(start))
        if entry[0] not in self.epoch_starts:
            self.epoch_starts[entry[0]] = entry[1]

    def append(self, epoch: int, op: dict[str, Any]) -> int:
        """Append an op in ``epoch`` (a leader); returns its offset. Durable at
        :meth:`sync`."""
        offset = self.end_offset + 1
        entry = (epoch, offset, op)
        self._remember(entry)
        self._unwritten.append(_frame(entry))
        return offset

    def append_entries(self, entries: list[Entry]) -> None:
        """Append entries shipped by the leader (a follower); they must follow on."""
        for entry in entries:
            epoch, offset, op = int(entry[0]), int(entry[1]), entry[2]
            if offset != self.end_offset + 1:
                raise ValueError(f"entry {offset} does not follow {self.end_offset}")
            if epoch < self.last_epoch:
                raise ValueError(f"entry {offset} of epoch {epoch} after epoch {self.last_epoch}")
            fixed = (epoch, offset, op)
            self._remember(fixed)
            self._unwritten.append(_frame(fixed))

    async def sync(self) -> int:
        """Write and fsync what was appended; returns the synced offset. Raises
        OSError: nothing more counts as synced, the file is cut back to its last whole
        frame, and what was to be written stays for the next sync."""
        async with self._lock:
            self._check_not_removed()
            if self._rewrite_pending:
                target = self.end_offset
                data = b"".join(_frame(e) for e in self.entries)
                self._unwritten = []  # (in data; what is appended meanwhile is not)
                await trio.to_thread.run_sync(self._rewrite, data)
                self._rewrite_pending = False
                self.synced = target
                return target
            if not self._unwritten:
                return self.synced
            chunks, self._unwritten = self._unwritten, []
            target = self.end_offset
            data = b"".join(chunks)
            good_size = self._good_size
            try:
                self._file()
                good_size = self._good_size
                if len(data) <= INLINE_WRITE_MAX_BYTES:
                    self._write(data)
                    await trio.to_thread.run_sync(self._fsync)
                else:
                    await trio.to_thread.run_sync(self._write_and_fsync, data)
            except OSError:
                self._unwritten[:0] = chunks  # (before what was appended meanwhile)
                # written perhaps, not synced: cut off when the file is reopened, at the next write
                self._good_size = good_size
                self._close_file()
                raise
            self.synced = max(self.synced, target)
            return self.synced

    def _file(self) -> int:
        """The file open for appending, holding exactly its whole frames (a tail a
        failed write left is cut off first)."""
        if self._fd is None:
            created = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if self._good_size is None:
                    self._good_size = size
                elif size != self._good_size:
                    os.ftruncate(fd, self._good_size)
                if created:
                    _fsync_dir(self.path.parent)  # (the new file's name is durable too)
            except OSError:
                os.close(fd)
                raise
            self._fd = fd
        return self._fd

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        fd = self._file()
        written = 0
        while written < len(data):
            written += os.write(fd, view[written:])
        self._good_size = (self._good_size or 0) + len(data)

    def _fsync(self) -> None:
        fd = self._fd
        if fd is None:
            raise OSError("the replica log file was closed")  # (removed meanwhile)
        if hasattr(os, "fdatasync"):
            os.fdatasync(fd)
        else:  # pragma: no cover - macOS and Windows
            os.fsync(fd)

    def _write_and_fsync(self, data: bytes) -> None:
        self._write(data)
        self._fsync()

    def _close_file(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    async def truncate_after(self, offset: int) -> int:
        """Drop every entry after ``offset`` (rewriting the file); returns how many."""
        async with self._lock:
            self._check_not_removed()
            if offset >= self.end_offset:
                return 0
            kept = [e for e in self.entries if e[1] <= offset]
            dropped = len(self.entries) - len(kept)
            await self._replace_with(kept)
            return dropped

    async def _replace_with(self, entries: list[Entry]) -> None:
        """Make ``entries`` the whole log (the lock held): in memory at once, so that
        an entry appended while the file is rewritten (this node become the leader
        while its cancelled follower's rewrite ends) follows them instead of being
        dropped with what they replace; then on disk. A failed rewrite leaves the log
        as it was when nothing was appended meanwhile; else the next sync rewrites
        the file whole, and nothing counts as synced until then."""
        before = (self.entries, self.epoch_starts, self._unwritten)
        self.entries = []
        self.epoch_starts = {}
        self._unwritten = []
        for entry in entries:
            self._remember(entry)
        end = self.end_offset
        try:
            await trio.to_thread.run_sync(self._rewrite, b"".join(_frame(e) for e in entries))
        except RenamedNotDurable:
            # the file holds the new content already: so does the log, to be written
            # again whole (durably) before anything counts as synced
            self._rewrite_pending = True
            self.synced = 0
            raise
        except OSError:
            if self.end_offset == end:
                self.entries, self.epoch_starts, self._unwritten = before
            else:
                self._rewrite_pending = True
                self.synced = 0
            raise
        self._rewrite_pending = False
        self.synced = end  # (not what was appended meanwhile: it is not written yet)

    @property
    def tmp_path(self) -> Path:
        """Where a rewrite writes the file's next content before renaming it over."""
        return self.path.with_suffix(".tmp")

    @property
    def incarnation_path(self) -> Path:
        """Where the incarnation of the queue this log belongs to is kept."""
        return self.path.with_suffix(".incarnation")

    def read_incarnation(self) -> int:
        """The incarnation written beside the log (0: none, or unreadable: a log
        written before incarnations were kept)."""
        try:
            return int(self.incarnation_path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def write_incarnation(self, incarnation: int) -> None:
        """Record, durably, which incarnation of its queue this log belongs to (before
        any entry of it is written). Raises OSError."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.incarnation_path, "w") as f:
            f.write(f"{incarnation}\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.path.parent)

    def discard_files(self) -> None:
        """Delete the files of a log not opened (one of a deleted queue, found at
        start): the log, a ``.tmp``, its incarnation. Raises OSError."""
        for path in (self.tmp_path, self.path, self.incarnation_path):
            path.unlink(missing_ok=True)

    def _check_not_removed(self) -> None:
        if self.removed:
            raise ReplicaLogRemoved(f"the replica log {self.path} was removed")

    def _rewrite(self, data: bytes) -> None:
        """Replace the file by ``data`` (whole frames), durably. Run with the lock
        held (:meth:`remove` waits for it); a failed rewrite leaves no ``.tmp``."""
        tmp = self.tmp_path
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        self._close_file()  # (it was the replaced file)
        self._good_size = len(data)
        try:
            _fsync_dir(self.path.parent)
        except OSError as exc:
            raise RenamedNotDurable(exc.errno, f"the rename over {self.path} is not durable: {exc.strerror or exc}") from exc

    def wants_compaction(self, upto: int, after: int) -> bool:
        """Whether compacting up to offset ``upto`` is worth trying: at least ``after``
        entries precede it, and, when a shorter prefix was found not worth it (a deep
        queue: most of it live), this one is half as long again. Folding the whole
        prefix at every sync only to decline again would cost time growing with the
        log at each batch; trying again at geometric steps costs a bounded multiple
        of the log's length in all."""
        return upto - self.first_offset >= after and upto >= self._compact_retry_at

    async def compact(self, upto: int, snapshot: Callable[[list[Entry]], dict[str, Any] | None]) -> int:
        """Replace the synced entries up to offset ``upto`` by one snapshot entry
        (``snapshot(prefix)``: its op, or None: not worth it now); returns how many
        entries went. Only for a prefix every replica holds: no truncation reaches
        below it. A prefix found not worth it is tried again only once half as long
        again (:meth:`wants_compaction`). The look at the prefix (``snapshot``: a
        count, a fold) and the framing run in the rewrite's worker thread: for a long
        log they take seconds, which the event loop (every queue's traffic) would
        otherwise stall for."""
        async with self._lock:
            self._check_not_removed()
            upto = min(upto, self.synced)
            first = self.first_offset
            if not self.entries or upto <= first:
                return 0
            i = upto - first
            entries = self.entries  # (appends meanwhile go at its end; nothing else changes it while the lock is held)
            epochs = [[e, s] for e, s in sorted(self.epoch_starts.items()) if s <= upto]
            synced = self.synced
            made: list[Entry] = []

            def fold_and_rewrite() -> bool:
                prefix = entries[: i + 1]
                op = snapshot(prefix)
                if op is None:
                    return False
                made.append((prefix[-1][0], upto, {**op, "t": "snap", "epochs": epochs}))
                written = entries[i + 1 : i + 1 + (synced - upto)]  # the rest is in _unwritten
                self._rewrite(b"".join(_frame(e) for e in [made[0], *written]))
                return True

            try:
                compacted = await trio.to_thread.run_sync(fold_and_rewrite)
            except RenamedNotDurable:
                # the file is compacted, the old one may come back after a crash: both
                # hold every synced entry, and the next sync writes the log whole
                self.entries = [made[0], *self.entries[i + 1 :]]
                self._rewrite_pending = True
                raise
            if not compacted:
                self._compact_retry_at = upto + max(1, (i + 1) // 2)
                return 0
            # (appends made meanwhile are at the end: the index still holds)
            self.entries = [made[0], *self.entries[i + 1 :]]
        # the compacted entries are freed in the worker thread too, a slice at a time
        # (freed here, a long prefix's objects would hold the event loop as its fold did)
        await trio.to_thread.run_sync(_free, entries)
        return i

    async def install(self, snap: Entry) -> None:
        """A follower behind the leader's compacted prefix: the leader's snapshot
        entry replaces everything this log held (durably, before it is acknowledged)."""
        async with self._lock:
            self._check_not_removed()
            await self._replace_with([(int(snap[0]), int(snap[1]), snap[2])])

    async def remove(self) -> None:
        """The queue was deleted (or this node left its replica set): its log goes, file,
        ``.tmp`` and incarnation alike, once a write under way has ended (the lock), and no later
        write brings it back (:class:`ReplicaLogRemoved`). Raises OSError when the
        file could not be deleted (the log is removed all the same)."""
        async with self._lock:
            self.removed = True
            self.entries = []
            self.epoch_starts = {}
            self._unwritten = []
            self.synced = 0
            self._close_file()
            self._good_size = 0
            self.discard_files()

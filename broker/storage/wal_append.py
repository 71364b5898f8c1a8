"""The write-ahead log's append buffer: records numbered and waiting for the writer.

One job: LSN bookkeeping and the bytes of the next batch. :meth:`AppendBuffer.append`
frames records (``framing.py``), gives them consecutive LSNs and keeps them; the
writer (``wal_commit.py``) takes everything buffered as one :class:`Batch`, puts a
batch back if it was cancelled before its write began, or drops what is buffered in the
failed state. An LSN, once assigned here, is never reused, even if its record could not
be written.

Only the event loop touches it (the writer's IO thread gets a :class:`Batch`, never
the buffer), so it needs no lock. ``append`` is the hottest call of the storage layer:
it does per record only what framing needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .framing import FRAME_OVERHEAD_BYTES, encode_records

__all__ = ["AppendBuffer", "Batch"]


@dataclass(slots=True)
class Batch:
    """Everything that was buffered, taken at once: one write (one group or more)."""

    #: the records' frames, back to back
    data: bytes
    #: LSNs ``first..last`` are in it
    first: int
    last: int
    #: ``len(data)``
    nbytes: int
    #: frame size of each record (for the reader's index and the group split)
    sizes: list[int]
    #: ``[start, end)`` index ranges of records to write in one group (a commit)
    together: list[tuple[int, int]]
    #: some record in it is not lazy: under ``always`` the batch is fsynced
    wants_sync: bool


class AppendBuffer:
    """Records appended since the last batch was taken, and the LSN counter.

    The buffered records are exactly LSNs ``first .. last_lsn`` (none when ``first``
    is ``last_lsn + 1``).
    """

    __slots__ = (
        "_frame_sizes",
        "_max_record_bytes",
        "_together",
        "chunks",
        "first",
        "last_lsn",
        "nbytes",
        "wants_sync",
    )

    def __init__(self, next_lsn: int, max_record_bytes: int) -> None:
        self._max_record_bytes = max_record_bytes
        #: LSN of the last record appended (0 if none ever was)
        self.last_lsn = next_lsn - 1
        #: LSN of the first buffered record
        self.first = next_lsn
        #: the buffered frames, one bytes object per append; non-empty while records wait
        self.chunks: list[bytes] = []
        self._frame_sizes: list[int] = []
        self._together: list[tuple[int, int]] = []
        #: bytes buffered
        self.nbytes = 0
        #: some buffered record is not lazy: under "always" the next batch is fsynced
        self.wants_sync = False

    @property
    def buffered_records(self) -> int:
        return self.last_lsn - self.first + 1

    def append(self, records: Sequence[tuple[int, bytes]], lazy: bool, together: bool) -> int:
        """Frame and number ``records``; return how many were buffered.

        Raises (nothing buffered, no LSN assigned, if any record is rejected):
            ValueError: a record type outside 0..255.
            RecordTooLarge: a record over ``max_record_bytes``.
        """
        data, count = encode_records(records, max_record_bytes=self._max_record_bytes)
        if count:
            if together and count > 1:
                start = len(self._frame_sizes)
                self._together.append((start, start + count))
            self.chunks.append(data)
            self._frame_sizes.extend([len(payload) + FRAME_OVERHEAD_BYTES for _t, payload in records])
            self.nbytes += len(data)
            self.last_lsn += count
            if not lazy:
                self.wants_sync = True
        return count

    def take(self) -> Batch:
        """Everything buffered, as one batch; the buffer is empty afterwards."""
        chunks = self.chunks
        last = self.last_lsn
        batch = Batch(
            chunks[0] if len(chunks) == 1 else b"".join(chunks),
            self.first,
            last,
            self.nbytes,
            self._frame_sizes,
            self._together,
            self.wants_sync,
        )
        self._clear(last)
        return batch

    def put_back(self, batch: Batch) -> None:
        """Return a taken batch that was never written, ahead of what was appended since
        (so cancellation never loses a record)."""
        self.chunks.insert(0, batch.data)
        shift = len(batch.sizes)
        self._together = batch.together + [(lo + shift, hi + shift) for lo, hi in self._together]
        self._frame_sizes[:0] = batch.sizes
        self.nbytes += batch.nbytes
        self.first = batch.first
        self.wants_sync = self.wants_sync or batch.wants_sync

    def drop(self) -> tuple[int, int] | None:
        """Forget everything buffered (the failed state: it is not written); the LSN
        range it held, or None if nothing was."""
        if not self.chunks:
            return None
        first, last = self.first, self.last_lsn
        self._clear(last)
        return first, last

    def _clear(self, last: int) -> None:
        self.chunks = []
        self._frame_sizes = []
        self._together = []
        self.nbytes = 0
        self.first = last + 1
        self.wants_sync = False

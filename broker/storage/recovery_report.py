"""What recovery found and did: the report, and the findings it is built from.

One job: the account of a recovery. While the segments are read (``recovery.py``) and
their damage is handled (``recovery_tail.py``), every truncation, voided batch, removed
and moved-aside file is noted in one :class:`Findings`; once the last record was read
it becomes the immutable :class:`RecoveryReport` the caller (and the operator's log)
sees.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Findings", "RecoveryReport", "TruncatedTail", "VoidedRecords"]


@dataclass(frozen=True, slots=True)
class TruncatedTail:
    """Bytes cut from the end of a segment: a torn tail, or (``repaired``) a salvage."""

    path: str
    offset: int
    bytes_dropped: int
    #: records (partial or whole) in the dropped bytes, as far as can be told: for a torn
    #: tail 0 (zeros), 1 (a segment of the previous format), or the records the intact
    #: group headers in it announce (at least 1)
    records_dropped: int
    reason: str
    repaired: bool = False
    #: where a repair saved the dropped bytes
    saved_to: str | None = None


@dataclass(frozen=True, slots=True)
class VoidedRecords:
    """Leftovers of a failed batch discarded because a later segment marks them void."""

    path: str
    offset: int
    first_lsn: int
    bytes_dropped: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery found and did; available once the WAL records were all read."""

    checkpoint_lsn: int
    checkpoint_path: str | None
    segments_read: int
    records_replayed: int
    last_lsn: int
    next_lsn: int
    truncated: tuple[TruncatedTail, ...]
    voided: tuple[VoidedRecords, ...]
    #: leftover temporary files and empty torn segments removed
    removed_files: tuple[str, ...]
    #: files a repair moved aside (``*.dropped``)
    dropped_files: tuple[str, ...]


class Findings:
    """The changes recovery made to the log's files so far, in the order made."""

    __slots__ = ("dropped", "moved_aside", "removed", "truncated", "voided")

    def __init__(self, removed: list[str]) -> None:
        self.truncated: list[TruncatedTail] = []
        self.voided: list[VoidedRecords] = []
        #: files deleted (leftover temporary files, segments holding nothing to keep)
        self.removed = removed
        #: files a repair wrote or renamed (``*.dropped``)
        self.dropped: list[str] = []
        #: segments a repair renamed aside (their old paths)
        self.moved_aside: set[str] = set()

    def report(
        self,
        *,
        checkpoint_lsn: int,
        checkpoint_path: str | None,
        segments_read: int,
        records_replayed: int,
        last_lsn: int,
    ) -> RecoveryReport:
        return RecoveryReport(
            checkpoint_lsn=checkpoint_lsn,
            checkpoint_path=checkpoint_path,
            segments_read=segments_read,
            records_replayed=records_replayed,
            last_lsn=last_lsn,
            next_lsn=last_lsn + 1,
            truncated=tuple(self.truncated),
            voided=tuple(self.voided),
            removed_files=tuple(self.removed),
            dropped_files=tuple(self.dropped),
        )

"""What damage in the last segment means: a torn tail, or corruption. Pure: no IO.

One job: given the bytes of a segment from the first place that does not decode to its
end, decide whether a crash can have left them (a *torn tail*: cut off, nothing lost
that was acknowledged) or not (*corruption*: recovery stops). ``recovery_tail.py`` reads
the bytes, applies the verdict and talks to the operator; damage in a segment that is not
the last one is always corruption (every segment is fsynced before the WAL writes to the
next) and never reaches this module.

The rules, by segment format (``segment.py``):

* **Write groups (version 2).** A power cut can persist any part of what was written
  since the last fsync, in any order of sectors: a damaged group followed by valid ones
  is what it leaves. The damaged group (first LSN ``f``) is a torn write unless a group
  after it carries ``synced_lsn >= f``: that group was written after an fsync of this
  file that covered the damaged one, whose bytes have changed since (``group.py``).
  Nothing after a torn group was covered by an fsync either, so under ``fsync=always``
  none of it was acknowledged.
* **Bare frames (version 1).** Without that evidence, any CRC-valid frame after the
  damage makes it corruption (``framing.find_valid_frame``).
* **Undecidable.** When the scan for evidence spends its budget (a large tail of
  adversarial data), etcd's rule decides from the damaged record alone: short or zeroed,
  or a CRC failure containing a zeroed 512-byte sector, is torn; anything else is
  corruption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .framing import (
    FRAME_HEADER_BYTES,
    FrameProblem,
    ProblemKind,
    ScanGaveUp,
    find_valid_frame,
)
from .group import count_group_records, find_sync_evidence

__all__ = ["Verdict", "judge_frames", "judge_groups", "looks_torn", "count_frames"]

_SECTOR_BYTES: Final = 512
_ZERO_SECTOR: Final = bytes(_SECTOR_BYTES)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A torn tail (``corruption`` is None) or corruption (why, for the operator).

    ``fallback``: the scan for evidence gave up and etcd's rule decided (why it looks
    torn), worth a warning of its own.
    """

    corruption: str | None
    fallback: str | None = None


def judge_groups(
    problem: FrameProblem, rest: bytes, offset: int, first_lsn: int
) -> Verdict:
    """Judge damage in a segment of write groups: ``rest`` is the segment from the
    damaged group (at file offset ``offset``, first LSN ``first_lsn``) to its end."""
    try:
        evidence = find_sync_evidence(rest, 1, first_lsn)
    except ScanGaveUp as exc:
        return _undecidable(problem, rest, offset, exc, "groups")
    if evidence is not None:
        return Verdict(
            f"{problem.kind.value} group ({problem.detail}), followed by a group at offset "
            f"{offset + evidence.offset} written after the records up to LSN "
            f"{evidence.synced_lsn} were fsynced: the damaged group (from LSN {first_lsn}) "
            "had been fsynced, so this is not a write cut short by a crash"
        )
    return Verdict(None)


def judge_frames(problem: FrameProblem, rest: bytes, offset: int, max_record_bytes: int) -> Verdict:
    """Judge damage in a segment of bare frames (version 1): ``rest`` is the segment
    from the damaged frame (at file offset ``offset``) to its end."""
    try:
        found = find_valid_frame(rest, 1, max_record_bytes=max_record_bytes)
    except ScanGaveUp as exc:
        return _undecidable(problem, rest, offset, exc, "records")
    if found is not None:
        return Verdict(
            f"{problem.kind.value} record ({problem.detail}) followed by a valid record "
            f"at offset {offset + found}"
        )
    return Verdict(None)


def _undecidable(
    problem: FrameProblem, rest: bytes, offset: int, exc: ScanGaveUp, what: str
) -> Verdict:
    why = looks_torn(problem, rest, offset)
    if why is None:
        return Verdict(
            f"{problem.kind.value} record ({problem.detail}); could not rule out valid "
            f"{what} after it (the scan gave up at offset {offset + exc.offset})"
        )
    return Verdict(None, why)


def looks_torn(problem: FrameProblem, rest: bytes, offset: int) -> str | None:
    """etcd's torn-write test for one damaged frame or group: why it looks torn, or None.

    A group's length field counts like a frame's (``group.py``), so the span is found
    the same way for both.
    """
    if problem.kind in (ProblemKind.SHORT, ProblemKind.ZEROED):
        return f"it is {problem.kind.value}"
    if problem.kind is ProblemKind.CRC_MISMATCH:
        length = int.from_bytes(rest[:4], "little")
        span = rest[: FRAME_HEADER_BYTES + length]
        # whole file sectors inside the record that are all zeros: never written
        start = -offset % _SECTOR_BYTES
        for pos in range(start, len(span) - _SECTOR_BYTES + 1, _SECTOR_BYTES):
            if span[pos : pos + _SECTOR_BYTES] == _ZERO_SECTOR:
                return "it contains a zeroed sector"
    return None


def count_frames(data: bytes, max_record_bytes: int, *, grouped: bool) -> int:
    """How many records ``data`` holds: what a repair or a torn tail throws away, for
    the log (a lower bound: a damaged group header or a scan that gives up hides some)."""
    if grouped:
        return count_group_records(data)
    count = 0
    try:
        position = find_valid_frame(data, 0, max_record_bytes=max_record_bytes)
        while position is not None:
            count += 1
            length = int.from_bytes(data[position : position + 4], "little")
            position = find_valid_frame(
                data, position + FRAME_HEADER_BYTES + length, max_record_bytes=max_record_bytes
            )
    except ScanGaveUp:
        pass  # a lower bound is good enough for the log message
    return count

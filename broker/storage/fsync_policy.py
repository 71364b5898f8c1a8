"""The WAL's fsync policy: when it fsyncs, and therefore when it reports records durable.

``always`` reports after the fsync (the only policy that survives power loss);
``interval=N`` reports after the write and fsyncs at most every N ms; ``never`` reports
after the write and fsyncs only on ``sync()``, on close and when a segment is retired
(see ``wal.py``). One parser, :func:`parse_fsync_policy`, for every place a policy is
given as text (flags, environment, TOML).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import InvalidConfiguration

__all__ = ["FsyncPolicy", "parse_fsync_policy"]


@dataclass(frozen=True, slots=True)
class FsyncPolicy:
    """When the WAL fsyncs, and therefore when it reports records durable.

    Build one with :meth:`always`, :meth:`never`, :meth:`every` or
    :func:`parse_fsync_policy`; ``str(policy)`` gives the text form back.
    """

    mode: Literal["always", "interval", "never"]
    interval_ms: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("always", "interval", "never"):
            raise InvalidConfiguration(f"unknown fsync policy mode {self.mode!r}")
        if self.mode == "interval" and self.interval_ms < 1:
            raise InvalidConfiguration(
                f"fsync interval must be a positive number of milliseconds, got {self.interval_ms}"
            )

    @classmethod
    def always(cls) -> FsyncPolicy:
        """fsync every batch before reporting it durable (safe against power loss)."""
        return cls("always")

    @classmethod
    def never(cls) -> FsyncPolicy:
        """Report after the write; fsync only on sync/close/rollover. UNSAFE on power loss."""
        return cls("never")

    @classmethod
    def every(cls, interval_ms: int) -> FsyncPolicy:
        """Report after the write; fsync at most every ``interval_ms``. Loses up to that
        much acknowledged data on power loss."""
        return cls("interval", interval_ms)

    @property
    def interval_s(self) -> float:
        """The interval in seconds (0 unless mode is interval)."""
        return self.interval_ms / 1000.0

    def __str__(self) -> str:
        return f"interval={self.interval_ms}" if self.mode == "interval" else self.mode


def parse_fsync_policy(text: str | int | FsyncPolicy) -> FsyncPolicy:
    """Parse ``"always"``, ``"never"`` or ``"interval=<ms>"`` (an int means interval ms).

    Raises:
        InvalidConfiguration: (a ``ValueError``) anything else, with the accepted forms.
    """
    if isinstance(text, FsyncPolicy):
        return text
    if isinstance(text, int) and not isinstance(text, bool):
        return FsyncPolicy.every(text)
    if not isinstance(text, str):
        raise InvalidConfiguration(f"fsync policy must be a string, got {type(text).__name__}")
    value = text.strip().lower()
    if value in ("always", "never"):
        return FsyncPolicy(value)  # type: ignore[arg-type]
    key, sep, number = value.partition("=")
    if sep and key.strip() == "interval":
        try:
            interval_ms = int(number.strip())
        except ValueError:
            interval_ms = 0
        if interval_ms >= 1:
            return FsyncPolicy.every(interval_ms)
    raise InvalidConfiguration(
        f"invalid fsync policy {text!r}: must be always, never, or interval=<ms> "
        "with a whole number of milliseconds >= 1, e.g. interval=50"
    )

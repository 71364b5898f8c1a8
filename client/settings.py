"""Client settings: one frozen dataclass, validated once, shared by a connection and
the channels it opens (a channel may override some fields)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .backoff import ReconnectPolicy

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """Tunables of a connection and its channels.

    Attributes:
        reconnect: retry schedule for opening channels and for reconnecting them.
        connect_timeout_s: bound on one attempt to open a channel (TCP connect, HTTP
            exchange, ``open`` event).
        request_timeout_s: bound on a REST call and on a channel operation's reply
            (declare, bind, consume, cancel).
        max_pending: most publishes buffered unconfirmed per channel; a publish beyond
            it waits (backpressure).
        max_pending_bytes: most encoded bytes buffered unconfirmed per channel (a single
            larger publish is still accepted when nothing else is pending).
        publish_timeout_s: default ``timeout_s`` of :meth:`Channel.publish` (``None``:
            wait as long as the reconnect policy keeps trying).
        close_timeout_s: how long closing a channel waits for pending confirms.
        max_line_bytes: longest NDJSON event line accepted from the broker.
    """

    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 30.0
    max_pending: int = 1000
    max_pending_bytes: int = 64 * 1024 * 1024
    publish_timeout_s: float | None = None
    close_timeout_s: float = 10.0
    max_line_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        if self.max_pending_bytes < 1:
            raise ValueError("max_pending_bytes must be >= 1")
        for name in ("connect_timeout_s", "request_timeout_s", "close_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.publish_timeout_s is not None and self.publish_timeout_s <= 0:
            raise ValueError("publish_timeout_s must be > 0 or None")

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (``None`` values are ignored).

        Raises:
            TypeError: an unknown field.
        """
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

"""A channel's sink for tests: it keeps every effect the runtime hands the channel."""

from __future__ import annotations

from broker.core import Deliver, Effect

__all__ = ["RecordingSink"]


class RecordingSink:
    """Stands where a channel's session would: ``push`` keeps the effect, the rest of
    the sink protocol does nothing."""

    def __init__(self) -> None:
        self.effects: list[Effect] = []

    def push(self, effect: Effect) -> None:
        self.effects.append(effect)

    def closing(self, reason: str) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def flush_nowait(self) -> bool:
        return False

    def bodies(self) -> list[bytes]:
        """The bodies of the deliveries pushed so far, in order."""
        return [e.message.body for e in self.effects if isinstance(e, Deliver)]

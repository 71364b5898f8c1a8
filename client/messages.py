"""Small types the client's modules share, kept apart so that none of them imports
another only to name a type: the awaited :class:`Reply` to an op."""

from __future__ import annotations

from typing import Any

import anyio

__all__ = ["Reply"]


class Reply:
    """The awaited answer (``ok``/``consume_ok``/``cancel_ok``/``error``) to one op."""

    def __init__(self, op: str) -> None:
        self.op = op
        self._done = anyio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any) -> None:
        if not self._done.is_set():
            self._value = value
            self._done.set()

    def fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def wait(self) -> Any:
        """The reply.

        Raises:
            ChannelClosedByBroker: the broker answered with ``error``.
            SessionEnded: the session ended without an answer.
        """
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value

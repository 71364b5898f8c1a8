"""Where a channel stands: its state, why it failed, and its current session.

:class:`ChannelStatus` is the one piece of state every part of a channel reads: the
publisher and the settler write to the current session, requests and consumers wait
for a ready one, the supervisor (:mod:`client.supervisor`) sets it and moves the state
from ``opening`` to ``open``, the channel's close moves it on to ``closing``,
``closed`` or ``failed``. It does no IO; every change pulses :meth:`wait_changed`'s
event so that waiters look again.
"""

from __future__ import annotations

from typing import Literal

import anyio

from .errors import ClientClosed, ClientError, ConnectionLost
from .session import SessionLink

__all__ = ["ChannelStatus", "State"]

State = Literal["opening", "open", "closing", "closed", "failed"]


class ChannelStatus:
    """A channel's state, its failure, and the session it runs on right now."""

    __slots__ = ("state", "failure", "session", "_changed")

    def __init__(self) -> None:
        self.state: State = "opening"
        #: Why the channel failed (set with the ``failed`` state).
        self.failure: ClientError | None = None
        #: The session being recovered or served right now, if any.
        self.session: SessionLink | None = None
        self._changed = anyio.Event()

    @property
    def connected(self) -> bool:
        """A session is live and ready right now."""
        session = self.session
        return session is not None and session.ready and session.alive

    def pulse(self) -> None:
        """Wake everybody waiting in :meth:`wait_changed`."""
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_changed(self) -> None:
        """Wait for the next :meth:`pulse`."""
        await self._changed.wait()

    def fail(self, message: str, cause: BaseException | None) -> bool:
        """Enter the ``failed`` state with a :class:`ConnectionLost` saying ``message``;
        return False (and change nothing) when already closed or failed."""
        if self.state in ("closed", "failed"):
            return False
        failure = ConnectionLost(message)
        failure.__cause__ = cause
        self.failure = failure
        self.state = "failed"
        return True

    def error(self) -> ClientError:
        """A fresh exception saying why the channel cannot be used."""
        if self.state == "failed" and self.failure is not None:
            error = ConnectionLost(str(self.failure))
            error.__cause__ = self.failure.__cause__
            return error
        if self.state in ("closed", "closing"):
            return ClientClosed(f"the channel is {self.state}")
        return ConnectionLost("the channel is not open")

    def check_usable(self) -> None:
        """Raises: ConnectionLost, ClientClosed (see :meth:`error`) unless the channel
        is opening or open."""
        if self.state not in ("opening", "open"):
            raise self.error()

    async def wait_opened(self) -> None:
        """Wait for the first ready session. Raises: ConnectionLost, ClientClosed."""
        while self.state == "opening":
            await self._changed.wait()
        self.check_usable()

    async def wait_ready(self) -> SessionLink:
        """The current session once it is recovered and not draining.

        Raises:
            ConnectionLost, ClientClosed: the channel became unusable first.
        """
        while True:
            self.check_usable()
            session = self.session
            if session is not None and session.ready and session.alive and not session.draining:
                return session
            await self._changed.wait()

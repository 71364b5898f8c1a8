"""Consumer tags: the one answer to "is this consumer tag taken on this channel".

A channel's consumer tags name one consumer each, whatever its kind, as AMQP asks
(a cancel names one consumer; two under one tag would leave one behind). The kinds:

- the core's queue consumers (``ChannelState.consumers``, delivery.py);
- the channel's direct reply-to consumer (``ChannelState.reply_consumer``,
  directreply.py);
- consumers a front end keeps and the core does not: in cluster mode a consumer of
  another node's queue relayed to this channel, or one of a quorum queue waiting
  for its next leader (broker/api/channel/relayed.py, for HTTP and AMQP channels
  alike). These *hold* their tag here (:meth:`ConsumerTags.hold`) from their consume
  until they end (:meth:`ConsumerTags.release`).

Every consume of every kind asks :meth:`ConsumerTags.check_free` (or ``hold``) and
nothing else, so a new kind of consumer is one more holder here, not one more check
in each front end. A cancelled consumer's tag is free at once (its unacked
deliveries are settled by delivery tag, not by consumer tag). The check runs at
consume time only: nothing here is on the per-message path.
"""

from __future__ import annotations

from .entities import ChannelState
from .errors import ChannelError, InvalidArgument

__all__ = ["ConsumerTagInUse", "ConsumerTags"]


class ConsumerTagInUse(ChannelError):
    """A consume named a tag another consumer of the channel has (``not_allowed``);
    ``tag`` is that tag, for a front end that words the refusal its own way (AMQP's
    530 ``attempt to reuse consumer tag``)."""

    def __init__(self, tag: str, message: str | None = None) -> None:
        super().__init__(message or f"consumer tag {tag!r} is already in use on this channel", code="not_allowed")
        self.tag = tag


class ConsumerTags:
    """Every consumer tag taken on each channel of ``channels`` (the core's open
    channels, owned by delivery.py), and the tags held for consumers the core does
    not keep (see the module docstring)."""

    def __init__(self, channels: dict[int, ChannelState]) -> None:
        self._channels = channels
        #: channel id -> the tags its front end's consumers hold
        self._held: dict[int, set[str]] = {}

    def taken(self, ch: ChannelState, tag: str) -> bool:
        """Whether a consumer of ``ch``, of any kind, has ``tag``."""
        reply = ch.reply_consumer
        if tag in ch.consumers or (reply is not None and reply[0] == tag):
            return True
        held = self._held.get(ch.id)
        return held is not None and tag in held

    def check_free(self, ch: ChannelState, tag: str) -> None:
        """Raises ConsumerTagInUse when ``tag`` is taken on ``ch``."""
        if self.taken(ch, tag):
            raise ConsumerTagInUse(tag)

    def is_taken(self, channel_id: int, tag: str) -> bool:
        """:meth:`taken` by channel id (False when the channel is not open)."""
        ch = self._channels.get(channel_id)
        return ch is not None and self.taken(ch, tag)

    def hold(self, channel_id: int, tag: str) -> None:
        """Take ``tag`` on the channel for a consumer the core does not keep, until
        :meth:`release`. Raises ConsumerTagInUse, ChannelError (the channel is not
        open), InvalidArgument (an empty tag)."""
        ch = self._channels.get(channel_id)
        if ch is None or ch.closed:
            raise ChannelError(f"channel {channel_id} is not open")
        if not tag:
            raise InvalidArgument("a consumer tag to hold must not be empty")
        self.check_free(ch, tag)
        self._held.setdefault(channel_id, set()).add(tag)

    def release(self, channel_id: int, tag: str) -> None:
        """The consumer that held ``tag`` ended: the tag is free (unless the core has a
        consumer of its own under it). Idempotent; nothing for a closed channel."""
        held = self._held.get(channel_id)
        if held is not None:
            held.discard(tag)
            if not held:
                del self._held[channel_id]

    def forget_channel(self, channel_id: int) -> None:
        """The channel closed: its held tags go with it."""
        self._held.pop(channel_id, None)

"""A channel's consumer tags in the core (consumertags.py): one book of every tag
taken on a channel, whatever the consumer's kind — a queue consumer's
(``consume``), the direct reply-to consumer's (``reply_consume``), and a tag held
for a consumer the core does not keep (``hold_consumer_tag``: a front end's relayed
consumer of another node's queue, or one waiting for its quorum queue's next
leader). Each kind is refused a tag any kind has, with ``ConsumerTagInUse``
(``not_allowed``), and nothing of the refused consume is applied."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.core import (
    Broker,
    ChannelError,
    ConsumerTagInUse,
    InvalidArgument,
    PreconditionFailed,
)

from .helpers import Harness

IN_USE = "consumer tag 't' is already in use on this channel"

#: each kind of consumer taking tag "t" on channel ``ch``
KINDS: dict[str, Callable[[Broker, int], object]] = {
    "queue": lambda b, ch: b.consume(ch, "q", consumer_tag="t"),
    "reply": lambda b, ch: b.reply_consume(ch, "t", no_ack=True, secret="s"),
    "held": lambda b, ch: b.hold_consumer_tag(ch, "t"),
}


def _harness() -> tuple[Harness, int]:
    h = Harness()
    h.queue("q", durable=False)
    return h, h.channel()


def _taken_by(h: Harness, ch: int) -> tuple[list[str], bool, bool]:
    """(queue consumers' tags, whether there is a reply consumer, whether "t" is taken)."""
    views = h.b.views
    return views.consumer_tags(ch), views.reply_address(ch) is not None, views.consumer_tag_taken(ch, "t")


@pytest.mark.parametrize("holder", list(KINDS))
@pytest.mark.parametrize("taker", list(KINDS))
def test_a_tag_any_kind_has_is_refused_to_every_kind(holder: str, taker: str) -> None:
    h, ch = _harness()
    KINDS[holder](h.b, ch)
    before = _taken_by(h, ch)
    assert before[2]
    expected: type[Exception] = ConsumerTagInUse
    if (holder, taker) == ("reply", "reply"):
        expected = PreconditionFailed  # RabbitMQ's "reply consumer already set"
    with pytest.raises(expected) as refused:
        KINDS[taker](h.b, ch)
    if expected is ConsumerTagInUse:
        assert (refused.value.code, refused.value.message) == ("not_allowed", IN_USE)
        error = refused.value
        assert isinstance(error, ConsumerTagInUse) and isinstance(error, ChannelError) and error.tag == "t"
    assert _taken_by(h, ch) == before  # nothing of the refused one applied
    assert h.b.queues["q"].totals.consumers == (1 if holder == "queue" else 0)


@pytest.mark.parametrize("holder", list(KINDS))
def test_a_tag_is_free_again_once_its_consumer_ends(holder: str) -> None:
    h, ch = _harness()
    end: dict[str, Callable[[], object]] = {
        "queue": lambda: h.b.cancel(ch, "t"),
        "reply": lambda: h.b.reply_cancel(ch, "t"),
        "held": lambda: h.b.release_consumer_tag(ch, "t"),
    }
    for taker in KINDS:
        KINDS[holder](h.b, ch)
        end[holder]()
        assert not h.b.views.consumer_tag_taken(ch, "t")
        KINDS[taker](h.b, ch)
        assert h.b.views.consumer_tag_taken(ch, "t")
        end[taker]()


def test_a_cancelled_consumers_tag_is_free_while_its_deliveries_are_unacked() -> None:
    h, ch = _harness()
    h.b.consume(ch, "q", consumer_tag="t", prefetch=10)
    h.b.publish(ch, "", "q", b"m", None)
    (delivered,) = h.delivers(h.step())
    h.b.cancel(ch, "t")
    assert h.b.views.unacked_tags(ch, [delivered.delivery_tag]) == [delivered.delivery_tag]
    assert h.b.consume(ch, "q", consumer_tag="t") == "t"  # RabbitMQ: a cancelled tag may be reused
    assert h.b.ack(ch, delivered.delivery_tag) == 1  # the old delivery settles by its own tag


def test_tags_are_per_channel_and_a_closed_channel_forgets_its_held_tags() -> None:
    h, ch = _harness()
    other = h.channel()
    h.b.hold_consumer_tag(ch, "t")
    assert h.b.consume(other, "q", consumer_tag="t") == "t"
    h.b.close_channel(ch)
    assert not h.b.views.consumer_tag_taken(ch, "t")
    h.b.release_consumer_tag(ch, "t")  # (a relay ending after its channel: nothing to do)
    with pytest.raises(ChannelError, match="not open"):
        h.b.hold_consumer_tag(ch, "t")
    with pytest.raises(InvalidArgument):
        h.b.hold_consumer_tag(other, "")


def test_releasing_a_held_tag_leaves_a_core_consumers_tag_taken() -> None:
    """A quorum queue's consumer resumed in the core (relay_resume.py): the hold is
    released as the core's consumer takes the tag; a later release (idempotent)
    does not free the core consumer's tag."""
    h, ch = _harness()
    h.b.hold_consumer_tag(ch, "t")
    h.b.release_consumer_tag(ch, "t")
    h.b.consume(ch, "q", consumer_tag="t")
    h.b.release_consumer_tag(ch, "t")
    assert h.b.views.consumer_tag_taken(ch, "t")
    with pytest.raises(ConsumerTagInUse):
        h.b.hold_consumer_tag(ch, "t")


def test_a_generated_tag_passes_over_one_a_client_chose() -> None:
    h, ch = _harness()
    h.b.hold_consumer_tag(ch, "ctag-b0-1")
    h.b.reply_consume(ch, "ctag-b0-2", no_ack=True, secret="s")
    h.b.consume(ch, "q", consumer_tag="ctag-b0-3")
    assert h.b.consume(ch, "q") == "ctag-b0-4"

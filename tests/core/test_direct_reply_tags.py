"""Direct reply-to in the core (directreply.py with delivery.py): a channel's
consumer tags name one consumer each, its reply consumer's included, whichever came
first (the AMQP listener's ``basic.consume`` and the HTTP channel's ``consume`` both
end here)."""

from __future__ import annotations

import pytest

from broker.core import ChannelError

from .helpers import Harness


def test_a_queue_consumer_cannot_take_the_reply_consumers_tag() -> None:
    h = Harness()
    ch = h.channel()
    h.b.reply_consume(ch, "t", no_ack=True, secret="s")
    h.b.declare_queue("q")
    with pytest.raises(ChannelError, match="already in use") as refused:
        h.b.consume(ch, "q", consumer_tag="t")
    assert refused.value.code == "not_allowed"
    assert h.b.views.consumer_tags(ch) == []
    # another tag is fine, and the reply consumer is untouched
    assert h.b.consume(ch, "q", consumer_tag="u") == "u"
    assert h.b.reply_cancel(ch, "t") is True

"""Nothing follows a channel's final event (``close_ok`` or ``error``).

Between the final event and the channel's close in the core, its unacked deliveries
are still the core's; an ack timeout expiring then used to put an ``expired`` event
after the final one (seen at ack timeouts of a few ms).
"""

from __future__ import annotations

from typing import Any

from broker.api.channel import ServedChannel
from broker.core import DeliveryExpired
from broker.runtime import BrokerRuntime, RuntimeOptions


class _Response:
    def can_send_nowait(self) -> bool:
        return False


def _session() -> tuple[BrokerRuntime, ServedChannel]:
    runtime = BrokerRuntime(RuntimeOptions(data_dir=None))
    channel_id = runtime.core.open_channel()
    session = ServedChannel(runtime, channel_id, _Response())
    runtime.add_sink(channel_id, session)
    return runtime, session


def _events(session: ServedChannel) -> list[Any]:
    return [e if isinstance(e, dict) else type(e).__name__ for e in session.outbox]


async def test_an_ack_timeout_expiring_after_close_ok_sends_nothing() -> None:
    runtime, session = _session()
    runtime.core.declare_queue("q")
    runtime.core.publish(session.channel_id, "", "q", b"x", None)
    runtime.core.consume(session.channel_id, "q", consumer_tag="c", ack_timeout_s=0.005)
    runtime.pump()
    session.send_final({"ev": "close_ok"})
    runtime._to_channel(DeliveryExpired(session.channel_id, "c", 1))
    assert _events(session)[-1] == {"ev": "close_ok"}


async def test_an_ack_timeout_expiring_after_an_error_sends_nothing() -> None:
    runtime, session = _session()
    session.send_final({"ev": "error", "error": "unknown_op", "message": "unknown op 'x'"})
    runtime._to_channel(DeliveryExpired(session.channel_id, "c", 1))
    assert _events(session)[-1]["ev"] == "error"
    assert session.channel_id not in runtime.sinks

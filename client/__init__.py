"""ackbus client library: one code base for trio and asyncio (through anyio), and a
blocking face for threads and scripts (:func:`connect_blocking`).

    async with client.connect("http://127.0.0.1:8080") as conn:
        async with conn.channel() as ch:
            await ch.declare_queue("jobs")
            await ch.publish("", "jobs", b"hello")          # returns once confirmed
            async with ch.consume("jobs", prefetch=10) as messages:
                async for msg in messages:
                    ...
                    await msg.ack()

See docs/client.md for the guide: confirms, pipelining, reconnect guarantees, graceful
shutdown and the ``ackbus`` CLI. The library logs to the ``ackbus.client`` logger
(connects, failed attempts with their cause and the next delay, recoveries, nacks).
"""

from ._version import __version__
from .backoff import ReconnectPolicy
from .blocking import (
    BlockingChannel,
    BlockingConnection,
    BlockingMessageStream,
    connect_blocking,
)
from .channel import Channel, ChannelStatistics, QueueDeclared
from .codec import Properties, ReturnedMessage
from .connection import DEFAULT_URL, Connection, connect
from .consumer import Death, Message, MessageStream
from .errors import (
    BrokerError,
    BrokerRequestError,
    ChannelClosedByBroker,
    ClientClosed,
    ClientError,
    ConfirmTimeout,
    ConnectionLost,
    ConsumerCancelled,
    MessageAlreadySettled,
    ProtocolError,
    PublishFailed,
    PublishNacked,
    PublishRefused,
    PublishReturned,
    SomePublishesFailed,
    TLSRefused,
)
from .locks import HeldLock, LockHeld, LockLost
from .publisher import PendingPublish
from .rest import LeasedMessage, QueueInfo
from .schedules import Schedules
from .settings import Settings
from .shutdown import GracefulShutdown, open_graceful_shutdown

__all__ = [
    "__version__",
    "DEFAULT_URL",
    "connect",
    "Connection",
    "connect_blocking",
    "BlockingConnection",
    "BlockingChannel",
    "BlockingMessageStream",
    "Channel",
    "ChannelStatistics",
    "QueueDeclared",
    "PendingPublish",
    "MessageStream",
    "Message",
    "Death",
    "Properties",
    "ReturnedMessage",
    "QueueInfo",
    "LeasedMessage",
    "Settings",
    "ReconnectPolicy",
    "GracefulShutdown",
    "open_graceful_shutdown",
    "ClientError",
    "ConnectionLost",
    "TLSRefused",
    "ClientClosed",
    "ProtocolError",
    "ConfirmTimeout",
    "PublishFailed",
    "PublishNacked",
    "PublishReturned",
    "PublishRefused",
    "SomePublishesFailed",
    "BrokerError",
    "ChannelClosedByBroker",
    "BrokerRequestError",
    "ConsumerCancelled",
    "MessageAlreadySettled",
    "HeldLock",
    "LockHeld",
    "LockLost",
    "Schedules",
]

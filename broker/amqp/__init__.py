"""The AMQP 0-9-1 listener: RabbitMQ's clients (pika, aio-pika, kombu/Celery's
``amqp://``) on the same core as the HTTP API (docs/amqp.md).

In h11's layering: ``frames.py`` and ``tables.py`` are the sans-IO codec (bytes in,
frames and methods out, and back), ``connection.py`` the connection's state machine
(handshake, tune, heartbeats, channels, framing errors; no sockets; its events in
``events.py``), ``session.py`` and ``methods.py`` what the methods mean for the
broker, ``bridge.py`` the one place it meets the runtime, and ``server.py`` the trio IO
at the edge.
"""

from broker.amqp.connection import AMQPConnection, TuneLimits
from broker.amqp.frames import PROTOCOL_HEADER, FrameError, FrameReader
from broker.amqp.server import AMQPServer, server_properties

__all__ = [
    "AMQPConnection",
    "AMQPServer",
    "FrameError",
    "FrameReader",
    "PROTOCOL_HEADER",
    "TuneLimits",
    "server_properties",
]

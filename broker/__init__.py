"""ackbus broker: an AMQP-style message broker on trio and h11."""

__version__ = "0.1.0"

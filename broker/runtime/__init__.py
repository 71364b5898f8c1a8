"""The runtime: carries out the core's effects with trio.

It owns the sans-IO core, the write-ahead log, the timers and the checkpoint schedule,
and glues recovery together at start. It imports the core and storage, never the HTTP
server or the API layer: those call into it.
"""

from broker.runtime.runtime import BrokerRuntime, ChannelSink, RuntimeOptions

__all__ = ["BrokerRuntime", "ChannelSink", "RuntimeOptions"]

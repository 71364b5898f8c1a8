"""The listeners a broker serves (protocol, address, port), for the management API's
``listeners`` fields and its ``port-listener`` and ``protocol-listener`` health checks.

The API's routes are built before the broker binds its sockets, and only the app
knows which ones it bound: the app owns the book, hands it to the routes and records
each socket in it (``listeners.add("amqp", "127.0.0.1", 5672)``) once it listens.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Listener", "Listeners"]


class Listener:
    """One bound socket: its protocol (``http``, ``https``, ``amqp``, ``amqps``), address and port."""

    __slots__ = ("address", "port", "protocol")

    def __init__(self, protocol: str, address: str, port: int) -> None:
        self.protocol = protocol
        self.address = address
        self.port = port

    def json(self, node: str) -> dict[str, Any]:
        """RabbitMQ's shape of a listener (``/api/overview``'s ``listeners``)."""
        return {"node": node, "protocol": self.protocol, "ip_address": self.address, "port": self.port}


class Listeners:
    """The listeners of one broker, in the order they were bound."""

    def __init__(self) -> None:
        self._items: list[Listener] = []

    def add(self, protocol: str, address: str, port: int) -> None:
        """Record a listener (a repeated one is recorded once)."""
        for item in self._items:
            if (item.protocol, item.address, item.port) == (protocol, address, port):
                return
        self._items.append(Listener(protocol, address, port))

    def all(self) -> list[Listener]:
        return list(self._items)

    def ports(self) -> list[int]:
        return sorted({item.port for item in self._items})

    def protocols(self) -> list[str]:
        return sorted({item.protocol for item in self._items})


"""A kombu transport for ackbus: Celery (and any kombu program) on ackbus.

    import client.kombu_transport          # registers the ackbus:// scheme with kombu
    app = Celery("tasks", broker="ackbus://127.0.0.1:8080//")

The mapping (docs/celery.md has the user's view and the limits):

- Exchanges, queues and bindings are ackbus's own: kombu's declarations become REST
  declarations, and the broker routes (direct, topic, fanout, headers), so every
  process sees the same topology. An ``exclusive`` kombu queue is declared as a plain
  one (ackbus's REST queues cannot be exclusive to a connection).
- A publish goes through an ackbus channel of the blocking client and returns once the
  broker confirmed it (a nack raises ``PublishNacked``). A task with an ``eta`` in the
  future (``countdown``, ``retry``) is published with that delay: the broker holds it,
  durably, and delivers it when due. The resend-after-reconnect
  with the same message id makes a publish that was in flight during a broker crash
  land once.
- A consumer long-polls ``POST /get`` over all its queues at once
  (``polling_timeout`` seconds, no busy loop), leasing each message for
  ``visibility_timeout`` seconds: that is the ack timeout. A message not acked within
  it (a worker killed, a task running longer) goes back to its queue and is delivered
  again, as with SQS or kombu's Redis transport.
- ``basic_ack`` acks the lease; ``basic_reject``/``nack`` with ``requeue`` puts the
  message back at its place in the queue, without it dead-letters it (the queue's
  ``x-dead-letter-exchange``) or drops it. Unacked messages at a warm shutdown are
  put back the same way (never republished as copies). A ``no_ack`` consumer's
  messages (Celery's ``rpc://`` result backend) are acked as they arrive: kombu never
  acks them, and a lease left alone would bring them back.
- The kombu message (headers, properties, encoded body) travels as the JSON body of
  the ackbus message, as with kombu's other virtual transports.

Delivery is at-least-once: a message whose ack was lost (the broker crashed after the
task ran but before the ack was durable, or the lease expired) runs again.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import logging
from queue import Empty
from typing import Any

from . import blocking
from .consumer import MAX_DELAY_S
from .errors import BrokerRequestError, ClientError, ConnectionLost, PublishFailed

__all__ = ["Channel", "Transport", "register"]

DEFAULT_PORT = 8080

# kombu is an optional dependency (the ``celery`` extra) and untyped: loaded as Any.
_kombu_transport: Any = importlib.import_module("kombu.transport")
virtual: Any = importlib.import_module("kombu.transport.virtual")

log = logging.getLogger("ackbus.client.kombu")


def register() -> None:
    """Make ``ackbus://`` URLs resolve to this transport (done on import)."""
    _kombu_transport.TRANSPORT_ALIASES["ackbus"] = "client.kombu_transport:Transport"


class Channel(virtual.Channel):  # type: ignore[misc]
    """One kombu channel: a blocking ackbus connection (and a publishing channel)."""

    #: seconds a message stays leased to this consumer before the broker takes it back
    visibility_timeout: float = 1800.0
    #: seconds one ``POST /get`` long-poll waits for a message
    polling_timeout: float = 1.0
    #: messages fetched per long-poll at most (bounded by the prefetch count too)
    max_fetch: int = 10

    do_restore = True
    supports_fanout = False  # ackbus routes fanout exchanges itself

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        options = connection.client.transport_options
        for name in ("visibility_timeout", "polling_timeout", "max_fetch"):
            if name in options:
                setattr(self, name, type(getattr(self, name))(options[name]))
        self._stack = contextlib.ExitStack()
        self._conn: Any = self._stack.enter_context(
            blocking.connect_blocking(broker_url(connection.client), **_client_options(options))
        )
        self._publisher: Any = None
        self._no_ack_consumers: dict[Any, str] = {}  # consumer tag -> queue
        # "Connected" must mean it: kombu retries a failed connect with its own
        # backoff (broker_connection_retry), where a channel that fails on first use
        # makes Celery's consumer restart in a tight loop until it gives up.
        try:
            if not self._conn.healthy():
                raise ConnectionLost(f"the broker at {broker_url(connection.client)} is not ready")
        except BaseException:
            self._stack.close()
            raise

    # --- topology: ackbus's own -------------------------------------------------------

    def exchange_declare(
        self, exchange: str | None = None, type: str = "direct", durable: bool = False,
        auto_delete: bool = False, arguments: Any = None, nowait: bool = False, passive: bool = False,
    ) -> None:
        super().exchange_declare(exchange, type, durable, auto_delete, arguments, nowait, passive)
        name = exchange or f"amq.{type or 'direct'}"
        if passive or name.startswith("amq."):
            return
        _ignore_conflict(lambda: self._conn.declare_exchange(
            name, type or "direct", durable=bool(durable), auto_delete=bool(auto_delete),
            arguments=_arguments(arguments),
        ))

    def exchange_delete(self, exchange: str, if_unused: bool = False, nowait: bool = False) -> None:
        self.state.exchanges.pop(exchange, None)
        _ignore_missing(lambda: self._conn.delete_exchange(exchange))

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        _ignore_conflict(lambda: self._conn.declare_queue(
            queue, durable=bool(kwargs.get("durable", True)), auto_delete=bool(kwargs.get("auto_delete", False)),
            arguments=_arguments(kwargs.get("arguments")),
        ))

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        try:
            self._conn.queue_info(queue)
        except BrokerRequestError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def queue_bind(self, queue: str, exchange: str | None = None, routing_key: str = "",
                   arguments: Any = None, **kwargs: Any) -> None:
        exchange = exchange or "amq.direct"
        if exchange not in self.state.exchanges:
            self.state.exchanges[exchange] = {"type": "direct", "durable": True, "auto_delete": False,
                                              "arguments": {}, "table": []}
        super().queue_bind(queue, exchange, routing_key, arguments, **kwargs)
        self._conn.bind(exchange, queue, routing_key=routing_key or "", arguments=_arguments(arguments))

    def queue_unbind(self, queue: str, exchange: str | None = None, routing_key: str = "",
                     arguments: Any = None, **kwargs: Any) -> None:
        super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)
        _ignore_missing(lambda: self._conn.unbind(exchange or "amq.direct", queue, routing_key=routing_key or ""))

    def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any) -> Any:
        if if_empty and self._size(queue):
            return None
        self.state.queue_bindings_delete(queue)
        _ignore_missing(lambda: self._conn.delete_queue(queue))
        return None

    def _size(self, queue: str) -> int:
        try:
            return int(self._conn.queue_info(queue).messages_ready)
        except BrokerRequestError as exc:
            if exc.status == 404:
                return 0
            raise

    def _purge(self, queue: str) -> int:
        return int(self._conn.purge_queue(queue))

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        _ignore_missing(lambda: self._conn.delete_queue(queue))

    # --- publishing: through a confirmed channel ---------------------------------------

    def basic_publish(self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any) -> None:
        self._inplace_augment_message(message, exchange, routing_key)
        props = message.get("properties") or {}
        properties: dict[str, Any] = {"content_type": "application/json", "delivery_mode": 2}
        priority = props.get("priority")
        if isinstance(priority, int) and priority > 0:
            properties["priority"] = priority
        body = json.dumps(message).encode("utf-8")
        self._publishing_channel().publish(
            exchange or "", routing_key or "", body, properties=properties,
            delay_s=_eta_delay(message.get("headers")),
        )

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        body = json.dumps(message).encode("utf-8")
        self._publishing_channel().publish("", queue, body, properties={"content_type": "application/json"})

    def _publishing_channel(self) -> Any:
        if self._publisher is None:
            self._publisher = self._stack.enter_context(self._conn.channel())
        return self._publisher

    # --- consuming: leased long-polls ---------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, callback: Any, consumer_tag: Any, **kwargs: Any) -> Any:
        result = super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)
        if no_ack:  # (Celery's rpc:// result consumer) nothing will ack: settled on arrival
            self._no_ack_consumers[consumer_tag] = queue
        return result

    def basic_cancel(self, consumer_tag: Any) -> Any:
        self._no_ack_consumers.pop(consumer_tag, None)
        return super().basic_cancel(consumer_tag)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack:
            lease = message.delivery_info.get("ackbus_lease")
            if lease is not None:
                self._settle((lease[0], lease[1]), ack=True)
        return message

    def _get_many(self, queues: Any, timeout: float | None = None) -> None:
        queues = list(dict.fromkeys(queues))
        if not queues:
            raise Empty()
        wait = self.polling_timeout if timeout is None else max(0.0, min(timeout, self.polling_timeout))
        room = self.qos.can_consume_max_estimate()
        count = self.max_fetch if room is None else max(1, min(room, self.max_fetch))
        messages = self._conn.get_any(queues, max_messages=count, wait_s=wait, lease_s=self.visibility_timeout)
        if not messages:
            raise Empty()
        self._settle_no_ack(messages)
        for leased in messages:
            self.connection._deliver(self._payload(leased), leased.queue)

    def _settle_no_ack(self, messages: list[Any]) -> None:
        """Ack at once the leases of messages for no_ack consumers: kombu never acks
        those, and left leased they would come back when the lease ran out."""
        no_ack_queues = set(self._no_ack_consumers.values())
        by_queue: dict[str, list[str]] = {}
        for leased in messages:
            if leased.queue in no_ack_queues:
                by_queue.setdefault(leased.queue, []).append(leased.lease_id)
        for queue, lease_ids in by_queue.items():
            try:
                self._conn.ack_leases(queue, lease_ids)
            except BrokerRequestError as exc:
                if exc.status not in (404, 409, 410):
                    raise

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        messages = self._conn.get(queue, max_messages=1, wait_s=0, lease_s=self.visibility_timeout)
        if not messages:
            raise Empty()
        return self._payload(messages[0])

    def _payload(self, leased: Any) -> dict[str, Any]:
        try:
            payload: dict[str, Any] = json.loads(leased.body)
        except ValueError:
            # Not published by kombu: hand the raw body over as a message.
            payload = self.prepare_message(leased.body.decode("utf-8", "replace"),
                                           content_type=leased.properties.content_type)
            payload["properties"].setdefault("delivery_tag", leased.lease_id)
            payload["properties"]["body_encoding"] = None
        props = payload.setdefault("properties", {})
        info = props.setdefault("delivery_info", {})
        info["ackbus_lease"] = (leased.queue, leased.lease_id)
        info.setdefault("exchange", leased.exchange)
        info.setdefault("routing_key", leased.routing_key)
        payload["redelivered"] = bool(leased.redelivered)
        return payload

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        lease = self._lease_of(delivery_tag)
        try:
            if lease is not None:
                self._settle(lease, ack=True)
        finally:
            # Forgotten locally even when the ack could not be sent (the broker is
            # gone: the lease went with it and the message comes back, at least once);
            # otherwise the prefetch window stays full and the consumer stops.
            super().basic_ack(delivery_tag, multiple)

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        lease = self._lease_of(delivery_tag)
        try:
            if lease is not None:
                self._settle(lease, ack=False, requeue=requeue)
        finally:
            self.qos.ack(delivery_tag)  # forget it locally: the broker did the requeue

    def _restore(self, message: Any) -> None:
        """Unacked at shutdown (or ``recover``): back to its queue's place, by lease."""
        lease = message.delivery_info.get("ackbus_lease")
        if lease is not None:
            self._settle(lease, ack=False, requeue=True)

    def _lease_of(self, delivery_tag: Any) -> tuple[str, str] | None:
        try:
            message = self.qos.get(delivery_tag)
        except KeyError:
            return None
        lease = message.delivery_info.get("ackbus_lease")
        return (lease[0], lease[1]) if lease else None

    def _settle(self, lease: tuple[str, str], *, ack: bool, requeue: bool = True) -> None:
        queue, lease_id = lease
        try:
            if ack:
                self._conn.ack_leases(queue, [lease_id])
            else:
                self._conn.nack_leases(queue, [lease_id], requeue=requeue)
        except BrokerRequestError as exc:
            if exc.status not in (404, 409, 410):
                raise
            # the lease expired: the broker already put the message back (at-least-once)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._stack.close()


class Transport(virtual.Transport):  # type: ignore[misc]
    """kombu's entry point for ``ackbus://host:port//``."""

    Channel = Channel
    default_port = DEFAULT_PORT
    driver_type = "ackbus"
    driver_name = "ackbus"
    # The worker sleeps this long between empty rounds; the long-poll already waited.
    polling_interval = 0.0
    connection_errors = (*virtual.Transport.connection_errors, ConnectionLost)
    channel_errors = (*virtual.Transport.channel_errors, BrokerRequestError, PublishFailed, ClientError)

    def driver_version(self) -> str:
        from ._version import __version__

        return __version__


def broker_url(client: Any) -> str:
    """The ackbus HTTP URL of a kombu connection (``transport_options['url']`` wins)."""
    url = client.transport_options.get("url")
    if url:
        return str(url)
    scheme = "https" if client.ssl else "http"
    host = client.hostname or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{client.port or DEFAULT_PORT}"


def _eta_delay(headers: Any) -> float | None:
    """Seconds until a Celery task's ``eta`` header (countdowns and retries), if in the
    future: the broker holds the message that long (durably), so the worker does not
    keep it unacked under its lease meanwhile."""
    eta = headers.get("eta") if isinstance(headers, dict) else None
    if not isinstance(eta, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(eta)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)  # Celery's naive ETAs are UTC
    delay = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    return min(delay, MAX_DELAY_S) if delay > 0 else None


def _client_options(options: dict[str, Any]) -> dict[str, Any]:
    """Settings of the ackbus client taken from the transport options."""
    out: dict[str, Any] = {}
    for name in ("request_timeout_s", "connect_timeout_s", "publish_timeout_s", "max_pending"):
        if name in options:
            out[name] = options[name]
    return out


def _arguments(arguments: Any) -> dict[str, Any]:
    return dict(arguments or {})


def _ignore_conflict(call: Any) -> None:
    """A declaration that conflicts with what exists keeps what exists (as kombu's
    own transports do), and says so."""
    try:
        call()
    except BrokerRequestError as exc:
        if exc.status not in (406, 409):
            raise
        log.warning("kept the existing declaration: %s", exc)


def _ignore_missing(call: Any) -> None:
    try:
        call()
    except BrokerRequestError as exc:
        if exc.status != 404:
            raise


register()

"""What AMQP methods mean for the broker: one session per connection, one core channel
per AMQP channel.

The connection state machine (``connection.py``) hands over events; the session turns
them into the ``Broker`` facade's commands (declares, publishes, consumes, acks, qos,
tx, confirms), after the same permission checks as the HTTP API
(``broker.api``'s ``Access.require``), and turns the core's effects for its channels
(deliveries, confirms, returns, cancellations) into frames. A core error becomes a
channel exception with RabbitMQ's reply code (``replies.py``); one the spec makes a
connection exception (5xx) closes the connection.

It never touches sockets: it writes into the connection's output buffer and tells the
IO layer (``server.py``) through ``wake``, or, for deliveries queued while the runtime
pumps, through the pump's end (``credit.py``).

Why one module of ~600 lines: the channels (the runtime's sinks), the login, the
back-pressure and the per-message methods all read and write one connection's state
(the other methods: ``methods.py``; consumers and gets relayed from other nodes: ``relays.py``;
what a publish's properties mean: ``properties.py``).
"""

from __future__ import annotations

import collections
import logging
import secrets
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from pamqp import commands

from broker.amqp.bridge import RuntimeBridge
from broker.amqp.connection import AMQPConnection
from broker.amqp.credit import DeliveryCredit
from broker.amqp.events import (
    Acks,
    Content,
    Login,
    Method,
)
from broker.amqp.frames import (
    Ack,
    Nack,
    Reject,
    encode_cancel,
    encode_confirm,
    encode_deliver,
    encode_return,
    encode_sent_properties,
)
from broker.amqp.properties import received_properties
from broker.amqp.replies import (
    ACCESS_REFUSED,
    CONNECTION_FORCED,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    REFUSED_TARGETS,
    is_connection_error,
    refusal_text,
    reply_for,
)
from broker.api import ALLOW_ALL, Access, LocalQuorumConsumers, RelayedConsumers
from broker.core import (
    Confirm,
    ConsumerCancelled,
    Deliver,
    DeliveryExpired,
    ErrorReply,
    Return,
    Unavailable,
    delivery_cost,
)

__all__ = ["AMQPChannel", "AMQPException", "AMQPSession", "DEFAULT_EXCHANGE_ALIAS", "exchange_alias"]

log = logging.getLogger("ackbus.amqp")

DEFAULT_EXCHANGE_ALIAS = "amq.default"
#: Bytes of publishes waiting for their confirm past which the connection stops
#: reading (as ``broker/api/channel.py`` does): a publisher faster than fsync is slowed.
UNCONFIRMED_MAX_BYTES = 16 << 20
#: Bytes waiting in the output buffer past which the connection stops reading.
OUTPUT_MAX_BYTES = 4 << 20


class AMQPException(Exception):
    """A channel exception (``code`` < 500) or a connection exception."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id


def exchange_alias(name: str) -> str:
    """The exchange ``name`` names (``amq.default`` is the default exchange, \"\")."""
    return "" if name == DEFAULT_EXCHANGE_ALIAS else name


def _cancel(channel_id: int, consumer_tag: str, core: Any) -> None:
    core.cancel(channel_id, consumer_tag)


def _text(value: Any, limit: int) -> str | None:
    """A client property shown as text, cut to ``limit`` characters; None when
    absent, empty or not a string."""
    if not isinstance(value, str):
        return None
    return value[:limit] or None


class _NoEvent:
    """Stands in for the IO layer's event until it sets its own."""

    def set(self) -> None:
        pass


class AMQPChannel:
    """One open AMQP channel: a core channel and the runtime's sink for its events."""

    kind = "amqp"

    def __init__(self, session: AMQPSession, number: int) -> None:
        self.session = session
        self.number = number
        self.core_id = 0
        self.remote = session.remote
        self.user_agent = session.user_agent
        self.connection_name = session.connection_name
        self.principal = session.principal
        self.opened_at = time.time()
        self.confirm = False
        #: Publishes before confirm.select: the core counts them, AMQP does not.
        self.confirm_offset = 0
        self.tx = False
        self.published = 0
        self.last_queue = ""
        #: Cluster mode: its consumers and gets of other nodes' queues (``relays.py``).
        self.relayed: RelayedConsumers | None = None
        #: Cluster mode: its consumers here of quorum queues (``relays.quorum_of``).
        self.quorum: LocalQuorumConsumers | None = None
        #: (publish tag, charged bytes) of publishes not yet confirmed, in tag order.
        self.unconfirmed: collections.deque[tuple[int, int]] = collections.deque()
        self.unconfirmed_bytes = 0
        #: Delivery credit of deliveries queued for the socket, granted once sent.
        self.credit = 0
        self.closed = False
        #: The newest delivery tag handed out on this channel.
        self.max_tag = 0
        self.close_reason = "closed by an operator"
        #: The last delivered message's properties and their encoding (see push).
        self._last_properties: Any = None
        self._last_encoded = b"\x00\x00"

    # ChannelSink ----------------------------------------------------------------

    def push(self, effect: Any) -> None:
        """Called by the runtime's pump, which may run in another connection's task:
        a failure here must end this channel only, never that task."""
        try:
            self._push(effect)
        except Exception:
            log.exception("amqp channel failed on an event", extra={"fields": {"channel": self.number}})
            self.session.fail_later(self, 541, "INTERNAL_ERROR - the broker could not send an event")

    def _push(self, effect: Any) -> None:
        s = self.session
        conn = s.conn
        kind = type(effect)
        if kind is Deliver:
            self.max_tag = effect.delivery_tag
            msg = effect.message
            body = msg.body
            properties = msg.properties
            if properties is self._last_properties:
                # messages share one properties dict when they have no message id: encode once
                props = self._last_encoded
            else:
                props = encode_sent_properties(properties, conn.frame_max)
                self._last_properties, self._last_encoded = properties, props
            conn.send_raw(
                encode_deliver(
                    self.number, effect.consumer_tag, effect.delivery_tag, effect.redelivered,
                    msg.exchange, msg.routing_key, props, body, conn.frame_max,
                )
            )
            self.credit += delivery_cost(body)
            s.credit.delivered()  # sent at the pump's end, without waking the writer
            return
        elif kind is Confirm:
            self._settle_unconfirmed(effect.delivery_tag)
            s.confirmed.set()
            reason = effect.reason
            if reason is not None and not effect.ack and reason.startswith(REFUSED_TARGETS):
                # a publish to a missing or internal exchange: RabbitMQ's channel error
                code, _sep, text = reason.partition(": ")
                s.fail_later(self, NOT_FOUND if code == "not_found" else ACCESS_REFUSED, refusal_text(code, text))
                return
            if self.confirm:
                tag = effect.delivery_tag - self.confirm_offset
                if tag > 0:
                    conn.send_raw(encode_confirm(self.number, tag, effect.multiple, effect.ack))
        elif kind is Return:
            msg = effect.message
            props = encode_sent_properties(msg.properties, conn.frame_max)
            text = "NO_ROUTE" if effect.reply_code == 312 else effect.reason
            conn.send_raw(
                encode_return(self.number, effect.reply_code, text, msg.exchange, msg.routing_key, props, msg.body,
                              conn.frame_max)
            )
        elif kind is ConsumerCancelled:
            # (a quorum queue's consumer whose leader stepped down goes on from the next one)
            goes_on = self.quorum is not None and self.quorum.cancelled(effect.consumer_tag, effect.reason)
            if not goes_on and s.cancel_notify:
                conn.send_raw(encode_cancel(self.number, effect.consumer_tag))
        elif kind is DeliveryExpired:
            s.fail_later(
                self, PRECONDITION_FAILED,
                f"delivery acknowledgement on channel {self.number} timed out (delivery tag {effect.delivery_tag})",
            )
        s.wake()

    def _settle_unconfirmed(self, tag: int) -> None:
        unconfirmed = self.unconfirmed
        while unconfirmed and unconfirmed[0][0] <= tag:
            _tag, charge = unconfirmed.popleft()
            self.unconfirmed_bytes -= charge
            self.session.unconfirmed_bytes -= charge

    def closing(self, reason: str) -> None:
        """The broker shuts down (the whole connection closes: :meth:`AMQPSession.closing`),
        or an operator closes this channel (then :meth:`shutdown` follows and acts)."""
        if self.session.bridge.shutting_down:
            self.session.closing(reason)
        else:
            self.close_reason = reason

    def shutdown(self) -> None:
        """Stop taking operations: the whole connection when the broker shuts down,
        this channel alone when an operator closed it (``DELETE /channels/{id}``)."""
        s = self.session
        if s.bridge.shutting_down:
            s.closing("broker shutting down")
        else:
            s.fail_later(self, CONNECTION_FORCED, f"CONNECTION_FORCED - closed by an operator: {self.close_reason}")


class AMQPSession:
    """The broker side of one AMQP connection (see the module docstring)."""

    def __init__(
        self,
        conn: AMQPConnection,
        bridge: RuntimeBridge,
        *,
        remote: str | None,
        loopback: bool,
        login: Callable[[str, str, str | None], Any],
        has_users: Callable[[], bool],
        wake: Callable[[], None],
    ) -> None:
        self.conn = conn
        self.bridge = bridge
        self.views = bridge.views
        self.remote = remote
        self.loopback = loopback
        self._login = login
        self._has_users = has_users
        self.wake = wake
        #: the client library and its version ("product/version"), and the name the
        #: client gave its connection (RabbitMQ's client-provided name,
        #: ``connection_name``): what GET /channels lists beside its address
        self.user_agent: str | None = None
        self.connection_name: str | None = None
        self.principal: Any = None
        self.access: Access = ALLOW_ALL
        self.release_user: Callable[[], None] | None = None
        self.channels: dict[int, AMQPChannel] = {}
        #: The core's connection that owns this connection's exclusive queues (opened
        #: with the first channel, closed by ``release_all``).
        self.connection_id: int | None = None
        self.unconfirmed_bytes = 0
        #: When queued output goes out, and the delivery credit it gives back.
        self.credit = DeliveryCredit(bridge, lambda: self.channels.values(), wake)
        self.cancel_notify = False
        #: Whether this connection's publishes are deduplicated by ``message_id``: only
        #: when it asked (client property ``x-deduplicate: true``); RabbitMQ never does.
        self.deduplicate = False
        self.closing_reason: str | None = None
        self.blocked = False
        #: When this connection's publishes started waiting in the current alarm.
        self.blocked_since: float | None = None
        #: Channels to close at the next step (errors found while pumping).
        self._failures: list[tuple[AMQPChannel, int, str]] = []
        self._counter = 0
        #: Set by the IO layer: stop reading frames (the broker shuts down).
        self.stop_reading: Callable[[], None] = lambda: None
        #: Set whenever confirms arrive (the shutdown drain waits on it).
        self.confirmed: Any = _NoEvent()
        #: Set by the IO layer: the nursery (trio's) relayed consumers' tasks run in.
        self.tasks: Any = None

    # -- events -------------------------------------------------------------------

    def handle_nowait(self, event: Any) -> bool:
        """Carry out a per-message event (a publish, an ack, a nack, a reject) in the
        caller's step, without a coroutine; False for any other event (then
        ``methods.handle``)."""
        kind = type(event)
        if kind is Acks:
            if getattr(self.channels.get(event.channel), "relayed", None):
                return False  # (methods.handle: one by one, as below)
            self.guard(event.channel, self.bridge.ack_run, event.tags, 60, 80)
            return True
        if kind is Content:
            if self.bridge.flow_blocked:
                return False  # it waits (methods.handle: publish_when_allowed)
            self.guard(event.channel, self.publish, event, 60, 40)
            return True
        if kind is Method:
            mtype = type(event.method)
            if mtype in (Ack, Nack, Reject) and getattr(self.channels.get(event.channel), "relayed", None):
                return False  # settles may go to other nodes (methods.handle awaits them)
            if mtype is Ack:
                self.guard(event.channel, self.ack, event.method, 60, 80)
                return True
            if mtype is Nack:
                self.guard(event.channel, self.nack, event.method, 60, 120)
                return True
            if mtype is Reject:
                self.guard(event.channel, self.reject, event.method, 60, 90)
                return True
        return False

    def guard(self, number: int, fn: Callable[[AMQPChannel, Any], None], arg: Any, class_id: int, method_id: int) -> None:
        ch = self.channels.get(number)
        if ch is None:
            return
        try:
            fn(ch, arg)
        except (AMQPException, ErrorReply) as exc:
            self.raise_on(ch, exc, class_id, method_id)

    def raise_on(self, ch: AMQPChannel, exc: AMQPException | ErrorReply, class_id: int, method_id: int) -> None:
        if isinstance(exc, AMQPException):
            code, text = exc.code, exc.text
        else:
            code, text = reply_for(exc), exc.message
        if is_connection_error(code):
            self.conn.close(code, text, class_id, method_id)
            self.release_all(f"connection error {code}")
            return
        self.bridge.flush()  # what the channel did before the error still goes out
        self.channels.pop(ch.number, None)
        self.conn.close_channel(ch.number, code, text, class_id, method_id)
        self.release(ch, f"channel error {code}")
        log.info("amqp channel error", extra={"fields": {"channel": ch.number, "code": code, "text": text[:200]}})

    def fail_later(self, ch: AMQPChannel, code: int, text: str) -> None:
        """Close ``ch`` with ``code`` at the next step (found while pumping)."""
        self._failures.append((ch, code, text))
        self.wake()

    def run_failures(self) -> None:
        while self._failures:
            ch, code, text = self._failures.pop(0)
            if self.channels.get(ch.number) is ch:
                self.channels.pop(ch.number)
                self.conn.close_channel(ch.number, code, text)
                self.release(ch, f"channel error {code}")

    # -- login and channels ---------------------------------------------------------

    async def authenticate(self, event: Login) -> None:
        props = event.client_properties
        self.user_agent = _text(props.get("product"), 128)
        version = _text(props.get("version"), 64)
        if self.user_agent is not None and version is not None:
            self.user_agent = f"{self.user_agent}/{version}"
        self.connection_name = _text(props.get("connection_name"), 255)
        caps = props.get("capabilities")
        self.cancel_notify = isinstance(caps, dict) and bool(caps.get("consumer_cancel_notify"))
        self.deduplicate = props.get("x-deduplicate") is True
        if not self._has_users():
            # As RabbitMQ's guest: guest/guest, from loopback only.
            if event.username == "guest" and event.password == "guest" and self.loopback:
                self.conn.accept_login("guest")
                return
            log.warning("amqp login refused", extra={"fields": {"remote": self.remote, "user": event.username[:64]}})
            self.conn.refuse_login(event.mechanism)
            return
        result = await self._login(event.username, event.password, self.remote)
        if result is None:
            self.conn.refuse_login(event.mechanism)
            return
        if isinstance(result, str):  # a refusal with a reason (a per-user cap)
            self.conn.refuse_login(event.mechanism, f"ACCESS_REFUSED - {result}")
            return
        self.principal, release = result
        self.principal.open_session(self)
        principal = self.principal

        def release_user() -> None:
            principal.close_session(self)
            release()

        self.release_user = release_user
        self.access = self.principal.access
        self.conn.accept_login(self.principal.username)

    async def open_channel(self, number: int) -> None:
        ch = AMQPChannel(self, number)
        try:
            if self.connection_id is None:
                self.connection_id = self.bridge.open_connection()
            ch.core_id = self.bridge.open_channel(ch, self.principal, self.connection_id)
        except ErrorReply as exc:
            # RabbitMQ refuses a channel past a limit with a connection exception
            if isinstance(exc, Unavailable) and exc.code in ("not_ready", "shutting_down"):
                self.conn.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {exc.message}", 20, 10)
            else:
                self.conn.close(NOT_ALLOWED, f"NOT_ALLOWED - {exc.message}", 20, 10)
            self.release_all("channel refused")
            return
        self.channels[number] = ch
        self.conn.channel_open_ok(number)

    def release(self, ch: AMQPChannel, reason: str) -> None:
        if ch.closed:
            return
        ch.closed = True
        self.unconfirmed_bytes -= ch.unconfirmed_bytes
        if ch.relayed is not None:  # the owners requeue what they delivered unacked
            ch.relayed.close_all()
        self.bridge.close_channel(ch.core_id, self.principal, reason)

    def release_all(self, reason: str) -> None:
        """The connection is over: close every core channel once."""
        channels, self.channels = self.channels, {}
        for ch in channels.values():
            self.release(ch, reason)
        if self.connection_id is not None:
            self.bridge.close_connection(self.connection_id)  # its exclusive queues go
            self.connection_id = None
        if self.release_user is not None:
            self.release_user()
            self.release_user = None

    # Revocable (broker/api/auth.py) ----------------------------------------------

    def revoke(self, error: ErrorReply) -> None:
        """The user was deleted (or its credentials otherwise revoked): close the
        connection with 320, as RabbitMQ closes a deleted user's connections."""
        self.conn.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {error.message}")
        self.release_all("credentials revoked")
        self.stop_reading()
        self.wake()

    def recheck(self, access: Access) -> None:
        """The user's permissions changed: cancel its consumers of queues it may no
        longer read (telling clients that asked, with ``basic.cancel``)."""
        for ch in list(self.channels.values()):
            for tag, queue in self.views.consumer_queues(ch.core_id):
                if access.allows("read", queue):
                    continue
                self.bridge.now(partial(_cancel, ch.core_id, tag))
                if self.cancel_notify:
                    self.conn.send_raw(encode_cancel(ch.number, tag))
        self.wake()

    def closing(self, reason: str) -> None:
        """The broker shuts down: the IO layer stops reading, lets confirms out, then
        closes the connection with 320."""
        if self.closing_reason is None:
            self.closing_reason = reason
            self.stop_reading()
            self.wake()

    def must_pause(self) -> bool:
        return self.unconfirmed_bytes > UNCONFIRMED_MAX_BYTES or self.conn.pending_output() > OUTPUT_MAX_BYTES

    async def publish_when_allowed(self, event: Content) -> None:
        """A publish while publishing is blocked (a memory or disk alarm): what came
        before it leaves, then the connection reads nothing more until publishing
        resumes, or the publish is refused with a ``basic.nack`` once the connection
        has waited ``blocked_publish_wait_s`` in this alarm (as the HTTP channel does)."""
        ch = self.channels.get(event.channel)
        if ch is None:
            return
        self.bridge.flush()
        self.update_blocked()
        self.wake()
        if self.blocked_since is None:
            self.blocked_since = self.bridge.clock()
        refusal = await self.bridge.wait_publishable(self.blocked_since)
        if self.channels.get(event.channel) is not ch:
            return
        if refusal is not None and self.bridge.refuse_publish(ch.core_id, refusal) is not None:
            ch.published += 1  # numbered (its confirm is a nack) though not taken
            return
        self.guard(event.channel, self.publish, event, 60, 40)

    def flow_changed(self) -> None:
        """Publishing was blocked or resumed: tell the client (``update_blocked``)."""
        if not self.bridge.flow_blocked:
            self.blocked_since = None
        self.update_blocked()
        self.wake()

    def update_blocked(self) -> None:
        """``connection.blocked`` while the broker refuses publishes (its disk reserve
        is used up) or this connection's unconfirmed publishes are over their bound;
        ``unblocked`` when that ends (RabbitMQ's alarms, for clients that asked)."""
        refusal = self.bridge.flow_reason if self.bridge.flow_blocked else self.views.publish_refusal()
        blocked = refusal is not None or self.unconfirmed_bytes > UNCONFIRMED_MAX_BYTES
        if blocked == self.blocked:
            return
        self.blocked = blocked
        if not self.conn.wants_blocked:
            return
        if blocked:
            reason = refusal[:255] if refusal is not None else "too many unconfirmed publishes"
            self.conn.send_connection_method(commands.Connection.Blocked(reason=reason))
        else:
            self.conn.send_connection_method(commands.Connection.Unblocked())
        self.wake()

    def next_tag(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{secrets.token_urlsafe(8)}-{self._counter}"

    # -- the per-message methods ----------------------------------------------------

    def publish(self, ch: AMQPChannel, event: Content) -> None:
        publish = event.publish
        if publish.immediate:
            raise AMQPException(NOT_IMPLEMENTED, "NOT_IMPLEMENTED - immediate=true", 60, 40)
        exchange = exchange_alias(publish.exchange)
        self.access.require("publish", exchange or DEFAULT_EXCHANGE_ALIAS)
        props = event.properties
        if props:
            props = received_properties(props, self, ch)
        charge = delivery_cost(event.body)
        tag = self.bridge.publish(
            ch.core_id, exchange, publish.routing_key, event.body, props, publish.mandatory, charge, self.deduplicate
        )
        ch.published += 1
        if tag:
            ch.unconfirmed.append((tag, charge))
            ch.unconfirmed_bytes += charge
            self.unconfirmed_bytes += charge

    def ack(self, ch: AMQPChannel, m: Ack) -> None:
        tag = m.delivery_tag
        if tag == 0 and m.multiple:
            tag = self.last_tag(ch)
            if not tag:
                return
        self.bridge.now(lambda core: core.ack(ch.core_id, tag, m.multiple))

    def nack(self, ch: AMQPChannel, m: Nack) -> None:
        tag = m.delivery_tag
        if tag == 0 and m.multiple:
            tag = self.last_tag(ch)
            if not tag:
                return
        self.bridge.now(lambda core: core.nack(ch.core_id, tag, m.multiple, m.requeue))

    def reject(self, ch: AMQPChannel, m: Reject) -> None:
        self.bridge.now(lambda core: core.reject(ch.core_id, m.delivery_tag, m.requeue))

    def last_tag(self, ch: AMQPChannel) -> int:
        """The channel's newest unacked delivery tag (0: none), for ``ack``/``nack``
        of tag 0 with ``multiple`` and ``recover``."""
        return self.views.newest_unacked_tag(ch.core_id)

    # -- replies ------------------------------------------------------------------

    def reply(self, ch: AMQPChannel, method: Any, nowait: bool = False) -> None:
        if not nowait:
            self.conn.send_method(ch.number, method)

    def reply_raw(self, ch: AMQPChannel, data: bytes) -> None:
        """A reply the session encoded itself (one that carries a name)."""
        if ch.number in self.conn.channels:
            self.conn.send_raw(data)

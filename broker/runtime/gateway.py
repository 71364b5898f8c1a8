"""The one door from the protocols into the core: :class:`CommandGateway`.

Every protocol adapter (the REST resources, the channel and stream protocols in
``broker.api``, and any other front end, such as an AMQP listener) changes the core
only through a gateway, so the command path is the same whoever asks::

    socket -> adapter (decode, authorize) -> gateway.run(command)
           -> core command -> core effects -> runtime pump -> WAL / channels
           -> (durable) wait for the records the command logged -> answer

The interface, in full:

* ``gateway.views``: read-only queries of the core (:class:`~broker.core.BrokerViews`);
  an adapter never reads the core's state any other way.
* ``gateway.check_ready()``: raises ``Unavailable`` while recovering or shutting down.
* ``gateway.run(command)``: ``command`` is a function of the :class:`~broker.core.Broker`
  (``lambda core: core.purge_queue(name)``); runs it, carries out its effects, returns
  its result.
* ``await gateway.run_durable(command)``: the same, then waits until the records the
  command logged (if any) are durable; this is the one durability rule of every
  declare, delete, bind and coordination change, over every protocol.
* ``gateway.batch()``: a :class:`CommandBatch` for an adapter that applies many
  operations in a row (a channel applies a received chunk of ops): its commands run
  without carrying out their effects, which its ``flush()`` does once.
* ``gateway.publish(...)`` / ``await gateway.publish_and_confirm(...)``: a publish
  from a channel (its confirm arrives as a ``Confirm`` effect on that channel), or a
  one-shot REST publish, which waits for its confirm (:class:`PublishOutcome`).
  ``gateway.channel_ops(channel_id)``: a channel's publish and acks as one object
  (``channelops.py``) for the channel's compiled per-chunk path, single node only.
* Publishing blocked (``runtime.flow``, a memory or disk alarm: ``flow.py``): a publish
  waits here, once for every protocol. ``publish_and_confirm`` waits by itself; a
  channel awaits ``wait_publishable`` before its publish, and numbers and nacks one it
  refuses with ``refuse_publish``. A wait ends when publishing resumes, after
  ``blocked_publish_wait_s`` (refused: the alarm's reason), or at the publisher's own
  deadline (refused: ``deadline``).
* In cluster mode (``runtime.cluster``), a publish whose queues other
  nodes own is also forwarded to each owner, and its confirm waits for theirs (the
  core's ``hold_confirm``): acked once all of them acked, a nack if any refused.
* ``gateway.open_channel()``, ``attach(channel_id, sink)``, ``close_channel(...)``:
  a long-lived session's channel in the core and the sink its events go to.
* ``await gateway.declare_queue(...)``, ``delete_queue``, ``declare_exchange``,
  ``delete_exchange``, ``bind``, ``unbind``: the metadata changes of every protocol;
  on a single node the core's commands (durable), in cluster mode decided through
  etcd (``runtime.cluster``) and applied to this core before they return. Exclusive
  and server-named queues, and bindings to them, stay the channel's node's own.
* ``await gateway.tx_commit(channel_id)``: a transaction's commit, for every protocol;
  in cluster mode its publishes that reach other nodes' queues are forwarded at the
  commit (``txcommit.py`` says what it guarantees).
* Long-poll gets (``park_getters``/``unpark_getters``) and REST lock waits
  (``acquire_lock``/``end_lock_wait``).

Errors: a command's ``ErrorReply`` (code, HTTP status hint, message) propagates
unchanged; each adapter renders it in one place (``broker.api.errors.http_error`` for
REST, an ``error`` event on a channel). A nack whose reason names a refusal of the
publish's target (``not_found: ...``, ``access_refused: ...``, the core's wording) is
turned into that same error by :meth:`PublishOutcome.refusal`, so a REST publish and a
channel publish to a missing or internal exchange are refused with the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from broker.core import (
    REST_CHANNEL,
    AccessRefused,
    Broker,
    BrokerViews,
    ErrorReply,
    LockGranted,
    NotFound,
    NotLockHolder,
)
from broker.runtime.channelops import ChannelOps
from broker.runtime.confirms import PublishWaiter
from broker.runtime.ports import ChannelSink, ClusterPort, ForwardPlan
from broker.runtime.runtime import BrokerRuntime
from broker.runtime.txcommit import RelayedSettles, commit_across_nodes
from broker.runtime.waits import LockWait

__all__ = ["CommandBatch", "CommandGateway", "PublishOutcome"]

T = TypeVar("T")

#: Nack reasons (``code: message``) that refuse the publish's target, as errors.
_REFUSALS: dict[str, type[ErrorReply]] = {"not_found": NotFound, "access_refused": AccessRefused}


@dataclass
class PublishOutcome:
    """How a REST publish ended: acked or nacked (with the core's ``reason``), the
    number of queues it reached, and whether it was returned (mandatory, unroutable)."""

    ack: bool
    reason: str | None
    routed: int
    returned: bool
    #: Refused without reaching the core, publishing being blocked: seconds the
    #: publisher should wait before trying again (HTTP ``Retry-After``).
    retry_after_s: int | None = None

    def refusal(self) -> ErrorReply | None:
        """The error a nack means when it refused the target exchange (missing,
        internal); None for any other outcome (a full queue, a failing disk)."""
        if self.ack or not self.reason:
            return None
        code, sep, message = self.reason.partition(": ")
        error = _REFUSALS.get(code) if sep else None
        return error(message) if error is not None else None


class CommandGateway:
    """The one place that runs core commands for the protocols (see the module
    docstring). Holds no state of its own: any number of gateways over one runtime
    behave as one."""

    def __init__(self, runtime: BrokerRuntime) -> None:
        self.runtime = runtime
        self._core = runtime.core
        self.views: BrokerViews = runtime.core.views

    # ------------------------------------------------------------ state

    def check_ready(self) -> None:
        """Raises ``Unavailable`` while recovering or shutting down."""
        self.runtime.check_ready()

    @property
    def shutting_down(self) -> bool:
        return self.runtime.shutting_down

    # --------------------------------------------------------- commands

    def run(self, command: Callable[[Broker], T]) -> T:
        """Run ``command`` on the core and carry out its effects; its result."""
        try:
            return command(self._core)
        finally:
            self.runtime.pump()

    async def run_durable(self, command: Callable[[Broker], T]) -> T:
        """Run ``command``, carry out its effects, and wait until the records it
        logged are durable (at once if it logged none). Raises ``Unavailable`` if the
        log could not write them."""
        core = self._core
        before = core.last_lsn
        try:
            result = command(core)
        finally:
            self.runtime.pump()
        await self.wait_logged_since(before)
        return result

    async def wait_logged_since(self, lsn: int) -> None:
        """Wait until every record logged after LSN ``lsn`` is durable."""
        self.runtime.pump()
        last = self._core.last_lsn
        if last > lsn:
            await self.runtime.wait_durable(last)

    def batch(self) -> CommandBatch:
        """Commands whose effects are carried out together (see :class:`CommandBatch`)."""
        return CommandBatch(self)

    def flush(self) -> None:
        """Carry out every effect the core has produced so far."""
        self.runtime.pump()

    # ---------------------------------------------------------- publish

    def publish(
        self,
        channel_id: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        *,
        mandatory: bool = False,
        delay_s: float | None = None,
        charge: int = 0,
        dedup: bool = True,
    ) -> int:
        """Publish on an open channel without carrying out the effects (a channel
        batches its publishes; see :meth:`CommandBatch.flush`). Its confirm arrives as
        a ``Confirm`` effect on the channel; until then it charges ``charge`` bytes
        (``runtime.confirms.unconfirmed_bytes``). ``dedup`` False: not deduplicated by
        its ``message_id`` (``Broker.publish``), here nor by the owners it is forwarded
        to. Returns the publish tag."""
        forwarder = self.runtime.cluster
        if forwarder is not None:
            plan = forwarder.plan(channel_id, exchange, routing_key, properties.get("headers") if properties else None)
            if plan is not None:
                tag, _routed = self._forward(channel_id, plan, exchange, routing_key, body, properties, mandatory, delay_s, dedup)
                self.runtime.confirms.track(channel_id, tag, charge)
                return tag
        tag, _routed = self._core.publish(
            channel_id, exchange, routing_key, body, properties, mandatory=mandatory, delay_s=delay_s, dedup=dedup
        )
        self.runtime.confirms.track(channel_id, tag, charge)
        return tag

    def channel_ops(self, channel_id: int) -> ChannelOps:
        """The channel's per-message commands as one object (:class:`ChannelOps`:
        :meth:`publish` on a single node, and acks), which the compiled channel path
        calls natively. Its publish does not forward: in cluster mode
        (``runtime.cluster``) publishes go through :meth:`publish`."""
        return ChannelOps(self._core, self.runtime.confirms, channel_id)

    def _forward(
        self,
        channel_id: int,
        plan: ForwardPlan,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        mandatory: bool,
        delay_s: float | None,
        dedup: bool = True,
    ) -> tuple[int, int]:
        """Publish the part of ``plan`` on this node (if any), forward the rest to the
        owners, and hold the confirm for their answers: (publish tag, queues routed)."""
        core = self._core
        tag: int | None = None
        if plan.local:
            tag, _routed = core.publish(
                channel_id, exchange, routing_key, body, properties, mandatory=mandatory, delay_s=delay_s, dedup=dedup
            )
        answers = len(plan.owners) + (1 if plan.refused else 0)
        held = core.hold_confirm(channel_id, tag, answers)
        if held is None:  # a transaction: the core holds it; forwarded at the commit (tx_commit)
            if tag is None:
                tag, _routed = core.publish(
                    channel_id, exchange, routing_key, body, properties, mandatory=mandatory, delay_s=delay_s, dedup=dedup
                )
            return tag, 0
        forwarder = self.runtime.cluster
        assert forwarder is not None

        def settle(ack: bool, reason: str | None) -> None:
            try:
                core.settle_held_confirm(channel_id, held, ack, reason)
            finally:
                self.runtime.pump()

        for owner in plan.owners:
            forwarder.send(owner, exchange, routing_key, body, properties, delay_s, settle, dedup=dedup)
        if plan.refused:
            core.settle_held_confirm(channel_id, held, False, plan.refused)
        return held, plan.routed

    async def wait_publishable(self, *, since: float | None = None, deadline: float | None = None) -> str | None:
        """Wait while publishing is blocked: None once a publish may go ahead (at once
        when not blocked), else why it is refused: the alarm's reason after
        ``blocked_publish_wait_s`` counted from ``since`` (default: now), or
        ``"deadline"`` when ``deadline`` (trio time: the publisher's own) comes first."""
        flow = self.runtime.flow
        if not flow.blocked:
            return None
        start = trio.current_time() if since is None else since
        limit = start + self.runtime.options.blocked_publish_wait_s
        until = limit if deadline is None else min(limit, deadline)
        if await flow.wait_unblocked(until):
            return None
        flow.refused += 1
        return "deadline" if deadline is not None and deadline <= limit else (flow.reason or "publishing blocked")

    def refuse_publish(self, channel_id: int, reason: str) -> int | None:
        """Number and nack a channel's publish that :meth:`wait_publishable` refused
        (its ``nack`` leaves with the batch); None on a transactional channel (see
        ``Broker.refuse_publish``): publish it as usual."""
        return self._core.refuse_publish(channel_id, reason)

    async def publish_and_confirm(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        *,
        mandatory: bool = False,
        delay_s: float | None = None,
        deadline: float | None = None,
    ) -> PublishOutcome:
        """One REST publish, answered once its confirm is released. While publishing
        is blocked it first waits (see :meth:`wait_publishable`; ``deadline``: the
        publisher's, trio time), and is refused without reaching the core."""
        refusal = await self.wait_publishable(deadline=deadline)
        if refusal is not None:
            return PublishOutcome(False, refusal, 0, False, self.runtime.flow.retry_after_s)
        forwarder = self.runtime.cluster
        plan = None
        if forwarder is not None:
            plan = forwarder.plan(REST_CHANNEL, exchange, routing_key, properties.get("headers") if properties else None)
        if plan is not None:
            tag, routed = self._forward(REST_CHANNEL, plan, exchange, routing_key, body, properties, mandatory, delay_s)
        else:
            tag, routed = self._core.publish(
                REST_CHANNEL, exchange, routing_key, body, properties, mandatory=mandatory, delay_s=delay_s
            )
        waiter = PublishWaiter()
        self.runtime.confirms.track(REST_CHANNEL, tag, 0, waiter)
        self.runtime.pump()
        await waiter.event.wait()
        return PublishOutcome(waiter.ack, waiter.reason, routed, waiter.returned)

    # ------------------------------------------------------ transactions

    async def tx_commit(self, channel_id: int, relayed: RelayedSettles | None = None) -> int:
        """Commit a channel's transaction (``Broker.tx_commit``): the number of
        operations, once the commit is durable. In cluster mode its publishes that
        reach queues of other nodes are forwarded to those owners at the commit, its
        ``relayed`` settles (of deliveries from other nodes' queues) are sent to theirs,
        and the answer waits for them too (``broker.runtime.txcommit``)."""
        cluster = self.runtime.cluster
        if cluster is None:
            return await self.run_durable(lambda core: core.tx_commit(channel_id))
        return await commit_across_nodes(self.runtime, cluster, channel_id, relayed)

    # --------------------------------------------------------- metadata

    async def declare_queue(
        self,
        channel_id: int,
        name: str,
        *,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
        passive: bool,
    ) -> tuple[str, bool]:
        """Declare a queue (see the module docstring): (its name, whether created)."""
        cluster = self.runtime.cluster
        if cluster is None or exclusive or not name or (passive and self.views.queue_exists(name)):
            queue, created = await self.run_durable(
                lambda core: core.declare_queue(
                    name, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                    arguments=arguments, passive=passive, channel_id=channel_id,
                )
            )
            if cluster is not None and created:
                # a connection's own queue: in etcd too, for every node's routing
                try:
                    await cluster.register_local_queue(
                        queue.name, durable=durable, auto_delete=auto_delete, exclusive=exclusive, arguments=arguments
                    )
                except ErrorReply:
                    await self.run_durable(lambda core: core.delete_queue(queue.name, channel_id=channel_id))
                    raise
            return queue.name, created
        created = await cluster.declare_queue(name, durable=durable, auto_delete=auto_delete, arguments=arguments, passive=passive)
        await self.runtime.wait_durable()
        return name, created

    async def queue_counts(self, name: str) -> tuple[int, int]:
        """(ready messages, consumers) of queue ``name``: this core's, or (cluster
        mode) its owner's; (0, 0) while the owner cannot be asked."""
        if self.views.queue_exists(name) or self.runtime.cluster is None:
            return self.views.queue_counter("messages_ready", name) or 0, self.views.queue_counter("consumers", name) or 0
        return await self.runtime.cluster.queue_counts(name) or (0, 0)

    def _clustered_queue(self, name: str) -> bool:
        cluster = self.runtime.cluster
        return cluster is not None and cluster.owner_of(name) is not None

    def queue_exists(self, name: str) -> bool:
        """Whether queue ``name`` exists: in this core, or (cluster mode) anywhere in
        the cluster, owned by another node."""
        return self.views.queue_exists(name) or self._clustered_queue(name)

    async def delete_queue(self, channel_id: int, name: str, *, if_unused: bool, if_empty: bool) -> int:
        """Delete a queue: the ready messages it dropped."""
        cluster = self.runtime.cluster
        local = cluster is not None and self.views.is_local_queue(name)  # (a connection's own: in etcd too)
        if cluster is None or local or not self._clustered_queue(name):
            count = await self.run_durable(
                lambda core: core.delete_queue(name, if_unused=if_unused, if_empty=if_empty, channel_id=channel_id)
            )
            if local and cluster is not None:
                cluster.forget_local_queue(name)
            return count
        count = await cluster.delete_queue(name, if_unused=if_unused, if_empty=if_empty)
        await self.runtime.wait_durable()
        return count

    async def declare_exchange(
        self, name: str, type: str, *, durable: bool, auto_delete: bool, internal: bool, arguments: dict[str, Any], passive: bool
    ) -> tuple[str, bool]:
        """Declare an exchange: (its name, whether created)."""
        cluster = self.runtime.cluster
        if cluster is None or (passive and self.views.exchange_info(name) is not None):
            exchange, created = await self.run_durable(
                lambda core: core.declare_exchange(
                    name, type, durable=durable, auto_delete=auto_delete, internal=internal,
                    arguments=arguments, passive=passive,
                )
            )
            return exchange.name, created
        created = await cluster.declare_exchange(
            name, type, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments, passive=passive
        )
        await self.runtime.wait_durable()
        return name, created

    async def delete_exchange(self, name: str, *, if_unused: bool) -> None:
        cluster = self.runtime.cluster
        if cluster is None:
            await self.run_durable(lambda core: core.delete_exchange(name, if_unused=if_unused))
            return
        await cluster.delete_exchange(name, if_unused=if_unused)
        await self.runtime.wait_durable()

    async def bind(
        self, channel_id: int, source: str, destination: str, routing_key: str, arguments: dict[str, Any],
        *, to_exchange: bool, unbind: bool = False,
    ) -> None:
        """Bind (or, with ``unbind``, unbind) ``destination`` to ``source``."""
        cluster = self.runtime.cluster
        if cluster is not None and not to_exchange and self.views.is_local_queue(destination):
            await self._bind_local(cluster, channel_id, source, destination, routing_key, arguments, unbind)
            return
        if cluster is None or (not to_exchange and not self._clustered_queue(destination)):
            await self.run_durable(
                lambda core: (core.unbind if unbind else core.bind)(
                    source, destination, routing_key, arguments, to_exchange=to_exchange, channel_id=channel_id
                )
            )
            return
        change = cluster.unbind if unbind else cluster.bind
        await change(source, destination, routing_key, arguments, to_exchange=to_exchange)
        await self.runtime.wait_durable()

    async def _bind_local(
        self, cluster: ClusterPort, channel_id: int, source: str, queue: str, routing_key: str,
        arguments: dict[str, Any], unbind: bool,
    ) -> None:
        """Bind (or unbind) a connection's own queue (``is_local_queue``) in this core
        and in etcd, where every node's routing finds it: bound here first, unbound
        there first, so that no node forwards to it what this core would route
        nowhere."""
        if unbind:
            try:
                await cluster.unbind(source, queue, routing_key, arguments, to_exchange=False)
            except NotFound:
                pass  # (not in etcd: unbound here all the same, or refused here)
            await self.run_durable(
                lambda core: core.unbind(source, queue, routing_key, arguments, channel_id=channel_id)
            )
            return
        created = await self.run_durable(lambda core: core.bind(source, queue, routing_key, arguments, channel_id=channel_id))
        try:
            await cluster.bind_local(source, queue, routing_key, arguments)
        except ErrorReply:
            if created:
                await self.run_durable(lambda core: core.unbind(source, queue, routing_key, arguments, channel_id=channel_id))
            raise

    # --------------------------------------------------------- channels

    def open_channel(self, *, forwarded: bool = False) -> int:
        """A new channel in the core (refused past ``max_channels``); attach its sink
        with :meth:`attach`, end it with :meth:`close_channel`. ``forwarded``: a
        channel another node of the cluster forwards publishes over (they reach this
        node's queues only)."""
        self.runtime.check_channel_room()
        channel_id = self._core.open_channel()
        forwarder = self.runtime.cluster
        if forwarded and forwarder is not None:
            forwarder.peer_channel(channel_id, True)
        return channel_id

    def attach(self, channel_id: int, sink: ChannelSink) -> None:
        """Send the events of ``channel_id`` to ``sink`` from now on."""
        self.runtime.add_sink(channel_id, sink)

    def detach(self, channel_id: int) -> None:
        """Send no more events of ``channel_id`` anywhere (its final event is queued)."""
        self.runtime.remove_sink(channel_id)

    def close_channel(self, channel_id: int, reason: str) -> None:
        """End a channel: detach it, close it in the core (its unacked deliveries go
        back to their queues, its consumers are cancelled, its waiting lock acquires
        leave their lines) and carry out the effects."""
        self.runtime.remove_sink(channel_id)
        forwarder = self.runtime.cluster
        if forwarder is not None:
            forwarder.peer_channel(channel_id, False)
        core = self._core
        try:
            core.close_channel(channel_id, reason)
            core.lock_forget_channel(channel_id)
        finally:
            self.runtime.pump()

    def sink(self, channel_id: int) -> ChannelSink | None:
        """The sink of an open channel or stream."""
        return self.runtime.sinks.get(channel_id)

    def sinks(self) -> list[tuple[int, ChannelSink]]:
        """Every open channel and stream, with its sink."""
        return list(self.runtime.sinks.items())

    def close_sink(self, channel_id: int, reason: str) -> None:
        """An operator closes a channel or stream: the shutdown path, for one."""
        sink = self.runtime.sinks.get(channel_id)
        if sink is not None:
            sink.closing(reason)
            sink.shutdown()
            self.runtime.pump()

    # -------------------------------------------------------- long polls

    def park_getters(self, queues: list[str]) -> list[trio.Event]:
        """Park a long-poll on ``queues``: events set when one gets ready messages."""
        events = [self.runtime.queue_event(name) for name in queues]
        for name in queues:
            self._core.park_getter(name)
        return events

    def unpark_getters(self, queues: list[str]) -> None:
        for name in queues:
            self._core.unpark_getter(name)

    # ---------------------------------------------------- REST lock waits

    async def acquire_lock(
        self, name: str, owner: Any, ttl_s: Any, wait_s: Any
    ) -> tuple[dict[str, Any] | None, tuple[int, LockWait] | None]:
        """A REST acquire: ``(lock info, None)`` once granted and durable, or
        ``(None, (waiter id, wait))`` when it waits in line; end the wait with
        :meth:`end_lock_wait`. Raises ``LockBusy`` (held, no waiting asked)."""
        core = self._core
        before = core.last_lsn
        try:
            info, waiter_id = core.lock_acquire(REST_CHANNEL, name, owner, ttl_s, wait_s)
            if info is None:
                return None, (waiter_id, self.runtime.lock_wait(waiter_id))
        finally:
            self.runtime.pump()
        await self.wait_logged_since(before)
        return info, None

    def end_lock_wait(self, waiter_id: int, wait: LockWait, *, caller_left: bool) -> None:
        """The parked acquire ends (answered, timed out, or its caller left): it leaves
        the line, and a grant its caller will never see is released for the next."""
        core = self._core
        self.runtime.forget_lock_wait(waiter_id)
        try:
            core.lock_cancel_wait(waiter_id)
            answer = wait.answer
            if caller_left and isinstance(answer, LockGranted):
                try:
                    core.lock_release(answer.info["name"], answer.info["owner"], answer.info["token"])
                except NotLockHolder:
                    pass
        finally:
            self.runtime.pump()


class CommandBatch:
    """Commands of one adapter whose effects are carried out together, at
    :meth:`flush` (a channel flushes after each received chunk of ops, and before an
    op whose reply must follow what earlier ops caused). Durable commands still wait
    for their records."""

    __slots__ = ("_gateway", "_core")

    def __init__(self, gateway: CommandGateway) -> None:
        self._gateway = gateway
        self._core = gateway.runtime.core

    def run(self, command: Callable[[Broker], T]) -> T:
        """Run ``command``; its effects wait for :meth:`flush`."""
        return command(self._core)

    async def run_durable(self, command: Callable[[Broker], T]) -> T:
        """:meth:`CommandGateway.run_durable` (it flushes)."""
        return await self._gateway.run_durable(command)

    def flush(self) -> None:
        """Carry out the effects of the commands so far."""
        self._gateway.runtime.pump()

"""One channel's lifetime (``POST /channel``): open it in the core, run the reader and
writer tasks, and end it exactly once however the exchange ends."""

from __future__ import annotations

import logging

import trio

from broker import __version__
from broker.api.channel.opfields import echo_id
from broker.api.channel.reader import serve_reader
from broker.api.channel.session import FEATURES, FLUSH_TIMEOUT_S, ServedChannel
from broker.api.permissions import access_for
from broker.cluster import FORWARDED_HEADER
from broker.core import ErrorReply
from broker.http import ClientDisconnected, Request, Response
from broker.runtime import BrokerRuntime, CommandGateway

__all__ = ["NDJSON_HEADERS", "handle_channel"]

log = logging.getLogger("ackbus.channel")

NDJSON_HEADERS = [
    ("content-type", "application/x-ndjson"),
    ("cache-control", "no-cache"),
    ("x-content-type-options", "nosniff"),
]


async def handle_channel(
    runtime: BrokerRuntime, request: Request, response: Response, gateway: CommandGateway | None = None
) -> None:
    """Serve one channel for the lifetime of this HTTP exchange."""
    if gateway is None:
        gateway = CommandGateway(runtime)
    gateway.check_ready()
    principal = request.principal
    forwarded = FORWARDED_HEADER in request.headers
    channel_id = gateway.open_channel(forwarded=forwarded)
    try:
        if principal is not None:
            principal.open_channel(channel_id)  # raises past max_channels_per_user
    except BaseException:
        gateway.close_channel(channel_id, "refused")
        raise
    session = ServedChannel(runtime, channel_id, response, access_for(request), principal, gateway)
    session.remote, session.user_agent = request.remote, request.headers.get("user-agent")
    session.forwarded = forwarded
    # a node's forwarding channel (cluster secret, or no users: no principal) carries
    # publishes their entry node checked, and stored ones (dead letters)
    session.entry_checked = forwarded and principal is None
    asked = request.headers.get("ackbus-features") or ""
    features = sorted(FEATURES.intersection(name.strip() for name in asked.split(",")))
    session.batch_deliveries = "batches" in features
    if principal is not None:
        principal.open_session(session)  # ended at once if its credentials are revoked
    gateway.attach(channel_id, session)
    stop_flow_events = runtime.flow.subscribe(session.flow_changed)
    log.info("channel opened", extra={"fields": {"channel": channel_id}})
    reason = "channel closed"
    disconnected = False
    try:
        await response.start(200, headers=NDJSON_HEADERS)
        opened: dict[str, object] = {"ev": "open", "channel": channel_id, "server": f"ackbus/{__version__}"}
        if features:
            opened["features"] = features
        session.send_event(opened)
        if runtime.flow.blocked:
            session.flow_changed(runtime.flow)
        async with trio.open_nursery() as nursery:
            session.tasks = nursery

            async def write() -> None:
                nonlocal disconnected
                try:
                    await session.serve_writer()
                except ClientDisconnected:
                    disconnected = True
                    nursery.cancel_scope.cancel()

            nursery.start_soon(write)
            try:
                with session.reader_scope:
                    await serve_reader(session, request)
                if session.reader_scope.cancelled_caught and session.revoked is not None:
                    reason = f"channel error: {session.revoked.code}"
                    await session.finish_publishes()
                    session.send_final({**session.revoked.to_json(), "ev": "error"})
                elif session.reader_scope.cancelled_caught:  # broker shutdown or an operator's close
                    reason = session.closing_reason or "broker shut down"
                    await session.finish_publishes()
            except ClientDisconnected:
                disconnected = True
                nursery.cancel_scope.cancel()
            except ErrorReply as exc:
                reason = f"channel error: {exc.code}"
                # Publishes before the failing op still get their confirms.
                await session.finish_publishes()
                event = exc.to_json()
                event["ev"] = "error"
                failed = session.current_op
                if failed is not None:
                    echo, op_id = echo_id(failed)
                    if echo:
                        event["id"] = op_id
                session.send_final(event)
            finally:
                session.finish()
                # A client that stopped reading cannot hold the channel open forever.
                nursery.cancel_scope.deadline = trio.current_time() + FLUSH_TIMEOUT_S
        if disconnected:
            reason = "client disconnected"
        else:
            await response.end()
    except ClientDisconnected:
        reason = "client disconnected"
    finally:
        stop_flow_events()
        if session.relayed is not None:  # (a client gone: its relays end here)
            session.relayed.close_all()
        if principal is not None:
            principal.close_channel(channel_id)
            principal.close_session(session)
        gateway.close_channel(channel_id, reason)
        log.info("channel closed", extra={"fields": {"channel": channel_id, "reason": reason}})

#!/usr/bin/env python3
"""A producer: publish messages with confirms, keep going across broker restarts, stop
cleanly on SIGINT/SIGTERM.

    scripts/serve &
    .venv/bin/python scripts/examples/producer.py --count 10000   # the checkout's venv
    # (scripts/test or scripts/serve creates .venv; any Python with ackbus installed works)
    # meanwhile: kill -9 the broker, start it again — the producer waits, reconnects,
    # resends what was unconfirmed, and every message lands in the queue exactly once.

Publishes are pipelined: up to ``--max-pending`` are in flight, each confirmed by the
broker; when the window is full ``start_publish`` waits (backpressure). On a signal
the producer stops publishing, waits for the confirms of what it sent, closes the
channel and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import anyio

import client

log = logging.getLogger("producer")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("ACKBUS_URL", client.DEFAULT_URL))
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio",
                        help="the event loop (the client runs on either)")
    parser.add_argument("--queue", default="jobs")
    parser.add_argument("--count", type=int, default=1000, help="messages to publish (0: until stopped)")
    parser.add_argument("--rate", type=float, default=0, help="messages per second (0: as fast as confirms allow)")
    parser.add_argument("--max-pending", type=int, default=500)
    parser.add_argument("--prefix", default="msg", help="message ids are PREFIX-N")
    return parser.parse_args()


async def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s producer: %(message)s")

    sent = 0
    async with client.open_graceful_shutdown() as shutdown:
        async with client.connect(args.url, max_pending=args.max_pending) as conn:
            shutdown.attach(conn)
            async with conn.channel() as ch:
                await ch.declare_queue(args.queue)
                while not shutdown.requested and (args.count == 0 or sent < args.count):
                    message_id = f"{args.prefix}-{sent}"
                    await ch.start_publish(
                        "", args.queue, f"job {sent}".encode(),
                        properties={"message_id": message_id, "content_type": "text/plain"},
                    )
                    sent += 1
                    if sent % 1000 == 0:
                        stats = ch.statistics()
                        log.info("sent %d, confirmed %d, reconnects %d, resent %d",
                                 sent, stats.confirmed, stats.reconnects, stats.resent)
                    if args.rate:
                        await anyio.sleep(1 / args.rate)
                log.info("waiting for the last confirms")
                try:
                    await ch.wait_for_confirms()
                except client.SomePublishesFailed as exc:
                    for failure in exc.failures:
                        log.error("not confirmed: %s", failure)
                    return 4
                stats = ch.statistics()
                log.info("done: %d published, %d confirmed, %d resent after reconnects",
                         sent, stats.confirmed, stats.resent)
    return 1 if shutdown.aborted else 0


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(anyio.run(main, arguments, backend=arguments.backend))

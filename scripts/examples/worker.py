#!/usr/bin/env python3
"""A worker: consume a queue, handle each message, ack it — and survive broker restarts
and stop cleanly on SIGINT/SIGTERM.

    scripts/serve &                                   # a broker on 127.0.0.1:8080
    .venv/bin/python scripts/examples/producer.py --count 1000  # fill the queue
    .venv/bin/python scripts/examples/worker.py       # then Ctrl-C (or kill -TERM)

(``.venv`` is the checkout's environment, made by scripts/test or scripts/serve; any
Python with ackbus installed works. ``--backend asyncio`` runs it on asyncio.)

What it shows:

* reconnect: kill the broker (even with -9) and start it again; the worker keeps
  going. Messages it was handling when the connection dropped come back
  ``redelivered``; their old ack returns ``False`` (it is logged as "stale").
* graceful shutdown: on the first signal the consumer is cancelled, the message being
  handled is finished and acked, the rest go back to the queue, the channel closes and
  the process exits 0. A second signal aborts at once; the unfinished message is not
  acked and goes back to the queue too.

``--journal FILE`` appends ``handled <id>`` after each message is fully handled and
``acked <id>`` after its ack was sent (the system tests check those against the queue).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import anyio

import client

log = logging.getLogger("worker")


async def handle(msg: client.Message, work_s: float) -> None:
    """The work: here, just take a while."""
    await anyio.sleep(work_s)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("ACKBUS_URL", client.DEFAULT_URL))
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio",
                        help="the event loop (the client runs on either)")
    parser.add_argument("--queue", default="jobs")
    parser.add_argument("--prefetch", type=int, default=10)
    parser.add_argument("--work-ms", type=float, default=50.0, help="time each message takes")
    parser.add_argument("--journal", help="append 'handled ID' / 'acked ID' lines to this file")
    parser.add_argument("--grace-s", type=float, default=30.0, help="abort if stopping takes longer")
    return parser.parse_args()


async def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker: %(message)s")
    journal = open(args.journal, "a", buffering=1) if args.journal else None

    handled = 0
    async with client.open_graceful_shutdown(grace_s=args.grace_s) as shutdown:
        async with client.connect(args.url) as conn:
            shutdown.attach(conn)
            async with conn.channel() as ch:
                await ch.declare_queue(args.queue)
                log.info("consuming %r (prefetch %d)", args.queue, args.prefetch)
                async with ch.consume(args.queue, prefetch=args.prefetch) as messages:
                    async for msg in messages:
                        await handle(msg, args.work_ms / 1000)
                        key = msg.message_id or msg.body.decode(errors="replace")
                        if journal:
                            journal.write(f"handled {key}\n")
                        if await msg.ack():
                            if journal:
                                journal.write(f"acked {key}\n")
                        else:
                            log.info("stale ack for %s: the broker will redeliver it", key)
                            if journal:
                                journal.write(f"stale {key}\n")
                        handled += 1
                        if handled % 100 == 0:
                            stats = ch.statistics()
                            log.info("handled %d (reconnects %d)", handled, stats.reconnects)
                log.info("consumer stopped; closing")
    log.info("%s after %d messages (signal %s)",
             "aborted" if shutdown.aborted else "stopped cleanly", handled, shutdown.signal)
    return 1 if shutdown.aborted else 0


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(anyio.run(main, arguments, backend=arguments.backend))

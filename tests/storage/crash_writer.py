"""A tiny broker stand-in for crash tests, run as a subprocess with ``ACKBUS_FAULTS`` set.

    python crash_writer.py wal <data_dir> <batches> <batch_size> [policy]
        recover, then append batches; print "durable <lsn>" as the WAL reports them,
        "failed <first> <last>" and "recovered" for the failure path, "done" at the end.
    python crash_writer.py checkpoint <data_dir> <lsn> <tag>
        write a checkpoint at <lsn> holding records tagged <tag>; print "done".

Record payloads are derived from their LSN (``payload_for``) so the test can check them.
"""

from __future__ import annotations

import sys

import trio

from broker.storage import WriteAheadLog, recover, write_checkpoint


def payload_for(lsn: int) -> bytes:
    return b"crash-test-%d" % lsn


def say(*words: object) -> None:
    print(*words, flush=True)


async def run_wal(data_dir: str, batches: int, batch_size: int, policy: str) -> None:
    recovery = recover(data_dir)
    for _ in recovery.checkpoint_records:
        pass
    for lsn, rtype, payload in recovery.wal_records:
        assert (rtype, payload) == (lsn % 256, payload_for(lsn)), lsn
    say("start", recovery.next_lsn)
    progress = trio.Event()
    settled = 0  # highest LSN reported durable or failed

    def settle(lsn: int) -> None:
        nonlocal progress, settled
        settled = max(settled, lsn)
        progress.set()
        progress = trio.Event()

    def on_durable(lsn: int) -> None:
        say("durable", lsn)
        settle(lsn)

    recovered = trio.Event()

    def on_failure(first: int, last: int, exc: OSError) -> None:
        nonlocal recovered
        say("failed", first, last)
        recovered = trio.Event()
        settle(last)

    def on_recovered() -> None:
        say("recovered")
        recovered.set()

    wal = WriteAheadLog.open(
        recovery,
        fsync_policy=policy,
        on_durable=on_durable,
        on_failure=on_failure,
        on_recovered=on_recovered,
        segment_max_bytes=4096,
        retry_interval_s=0.05,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        for _ in range(batches):
            first = wal.last_lsn + 1
            last = wal.append_nowait(
                [(lsn % 256, payload_for(lsn)) for lsn in range(first, first + batch_size)]
            )
            # wait for this batch to settle, so that every batch is its own write
            while settled < last:
                await progress.wait()
            if wal.failed:  # like a broker that pauses publishers while the disk fails
                await recovered.wait()
        await wal.aclose()
    say("done")


def main() -> None:
    mode, data_dir = sys.argv[1], sys.argv[2]
    if mode == "wal":
        policy = sys.argv[5] if len(sys.argv) > 5 else "always"
        trio.run(run_wal, data_dir, int(sys.argv[3]), int(sys.argv[4]), policy)
    elif mode == "checkpoint":
        lsn, tag = int(sys.argv[3]), sys.argv[4].encode()
        write_checkpoint(data_dir, lsn, [(1, tag + b"-%d" % n) for n in range(100)])
        say("done")
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()

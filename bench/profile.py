"""``python -m bench.profile``: where a message's CPU time goes, broker and client, per hop.

Starts one ackbus broker (as the benchmark does: fresh data directory, ``--fsync
always``) and one client worker running one workload operation, and reports:

- CPU time per message of each process (``/proc/<pid>/stat``, user + system, divided
  by the messages the worker counted);
- with ``--sample`` (needs py-spy, ``pip install py-spy``), both processes sampled
  for the whole run, each stack attributed to a *hop*: the first entry of
  :data:`BROKER_HOPS` / :data:`CLIENT_HOPS` one of whose names appears in the stack.
  A hop's share of the samples times the process's CPU per message estimates its
  microseconds per message. Samples of threads parked in the trio thread cache or in
  the WAL's IO thread, or of the worker's handshake thread, are left out; a thread
  waiting in ``fdatasync`` is counted (py-spy sees a thread in a syscall as active),
  so the WAL thread's hop is mostly waiting, not CPU.

Examples::

    python -m bench.profile                                    # pipelined publish, 100 B
    python -m bench.profile --sample --seconds 8
    python -m bench.profile --op consume --count 100000 --prefetch 100 --sample
    python -m bench.profile --amqp                             # the AMQP port, pika worker
    python -m bench.profile --amqp --op consume --sample
    python -m bench.profile --op consume --sample --keep /tmp/stacks   # and keep the raw stacks

With ``--amqp`` the broker serves AMQP 0-9-1 too and the worker is the pika one of
``scripts/bench --peer rabbitmq --amqp`` (``bench/worker_rabbitmq.py``) against that
port: the broker's figure is its CPU per AMQP message, the client's is pika's, the
same client the RabbitMQ side of that benchmark runs.

With ``--null`` (which implies ``--amqp``) the same pika worker runs against the null
AMQP peer (``bench.server_nullamqp``) instead of a broker: a server that does no broker
work, so the client's figure is pika's own CPU per message when the other side costs
next to nothing, and the rate is pika's ceiling on this machine. ``--sample`` then
samples the client only.

    python -m bench.profile --null --op consume        # pika's CPU per consumed + acked message

The broker's hops are named after the code they cover (``docs/architecture.md``
follows one publish through the same functions). docs/benchmarks.md, "Where the
time goes per message", shows what this printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.procs import code_root
from bench.server_nullamqp import NullAMQPServer
from bench.servers import AckbusServer, cpu_seconds

__all__ = ["AMQP_BROKER_HOPS", "BROKER_HOPS", "CLIENT_HOPS", "PIKA_CODE", "PIKA_HOPS", "attribute", "main"]

#: (hop, names of functions in it). A sample goes to the hop of the innermost frame
#: of ackbus's own code in its stack that one of these names (a name matches a frame
#: that contains it; library frames such as trio's socket calls count for the
#: ackbus caller), so a function's callees count where they are named and otherwise
#: with it; a stack with no such frame goes to the innermost library frame a hop
#: names (trio's run loop, epoll, thread hand-off). Compiled
#: code (the compiled build's core and client modules) has no Python frames: its time
#: shows up as the self time of its interpreted caller, which is why the core's hops
#: name the runtime's calls into the core (``CommandGateway.publish``, the settling
#: lambdas, ``LogReports.on_durable``, the pump, whose ``take_effects`` runs the core's
#: deliveries). Stacks whose innermost frame is a parked worker thread
#: (``WorkerThread._work`` or the WAL's ``IOThread._serve``, nothing below it) or the
#: worker's handshake are idle.
BROKER_HOPS: list[tuple[str, tuple[str, ...]]] = [
    ("WAL thread: write + fdatasync (mostly waiting)", ("_io_write", "_io_sync")),
    ("core: publish (checks, dedup, message, record, enqueue, confirm)",
     ("Publishing.publish ", "CommandGateway.publish ", "encode_enqueue", "check_routing_key")),
    # (the pump's take_effects runs the core's pending dispatch: deliveries, page-in)
    ("core: deliveries and settling", ("Deliveries.", "ack_each", "CommandBatch.run", "_apply_typed.<locals>",
                                       "Broker.dispatch", "Pager.", "BrokerRuntime.pump ")),
    ("core: after the fsync (confirms released, page-out)", ("Durability.durable ", "LogReports.on_durable ")),
    ("channel: op line decoded (msgspec) and checked, publish handed over",
     ("ChannelSession._publish ", "parse_op_line", "ChannelSession.apply", "decode_hot", "_apply_typed ",
      "properties_dict", ".require ", "exchange_name", "_decode_publish", "reader.py:", "ops.py:")),
    ("HTTP: chunked body read (recv, h11)", ("BodyIterator", "receive_chunk", "RequestReader")),
    ("events out: encoded, written", ("flush_nowait", "_take_outbox", "write_nowait", "serve_writer", "send_nowait",
                                     "encode_event", "ServedChannel.")),
    ("WAL on the event loop: framing, group commit", ("WriteAheadLog", "encode_records", "_append_records",
                                                      "AppendBuffer", "GroupCommitter")),
    ("runtime: confirms tracked and released", ("PendingConfirms.",)),
    ("runtime: effects carried out", ("BrokerRuntime",)),
    ("trio: run loop, epoll, thread hand-off", ("unrolled_run", "get_events", "run_sync_soon", "start_thread_soon",
                                               "trio/")),
]
CLIENT_HOPS: list[tuple[str, tuple[str, ...]]] = [
    ("publish: op line encoded", ("encode_publish", "encode_op", "to_json", "Publisher.prepare")),
    ("publish: handle, window, tracking", ("PendingPublish", "PublishTracker", "has_room", "wait_for_room",
                                           "Channel._enqueue", "_prepare", "Publisher.", "SortedDict",
                                           "SortedList")),
    ("events in: decoded, confirms settled, deliveries handed over", ("_read_loop", "decode_event", "_on_event",
                                                                      "SessionLink._dispatch", "Messages.")),
    ("settling: acks queued", ("Message.ack", "_settle", "send_ack")),
    ("writer: chunks framed, sent", ("_write_loop", "_coalesce", "encode_chunk", "SessionLink.send_nowait")),
    ("the workload's loop", ("start_publish", "publish_pipelined", "_pipeline", "consume ", "publish_seq")),
    ("trio: run loop, epoll", ("unrolled_run", "get_events", "trio/", "anyio/")),
]
#: The broker's hops with ``--amqp``: the AMQP listener's code in place of HTTP's.
AMQP_BROKER_HOPS: list[tuple[str, tuple[str, ...]]] = [
    BROKER_HOPS[0],
    BROKER_HOPS[1],
    BROKER_HOPS[2],
    BROKER_HOPS[3],
    ("amqp: deliveries and confirms encoded", ("AMQPChannel.", "encode_deliver", "encode_confirm",
                                              "encode_properties")),
    ("amqp: frames split and decoded, publishes assembled", ("FrameReader", "AMQPConnection.", "decode_method",
                                                           "decode_content_header", "decode_properties")),
    ("amqp: session (publish checks, acks handed to the core)", ("AMQPSession.", "_drain_events", "RuntimeBridge.",
                                                                "handle ")),
    ("amqp: socket read and write", ("AMQPServer._reader", "AMQPServer._writer", "_receive")),
    BROKER_HOPS[7],
    BROKER_HOPS[8],
    BROKER_HOPS[9],
    BROKER_HOPS[10],
]
#: pika's hops (the client with ``--amqp``); a stack goes to its innermost pika frame
#: a hop names (:data:`PIKA_CODE`), else to the worker's own loop.
PIKA_HOPS: list[tuple[str, tuple[str, ...]]] = [
    ("pika: methods out encoded and queued (basic_publish, basic_ack)",
     ("basic_publish", "basic_ack", "_send_method", "_send_message", "_send_frame", "marshal",
      "_output_marshaled_frames")),
    ("pika: frames in decoded, callbacks dispatched", ("_on_data_available", "_append_frame_buffer", "_read_frame",
                                                      "decode_frame", "unmarshal", "_deliver_frame_to_channel",
                                                      "_on_deliver", "_on_confirm", "_process_frame", "callback")),
    ("pika: socket IO, ioloop", ("_on_socket_writable", "_on_socket_readable", "_on_writable", "_on_readable",
                                 "selector_ioloop", "select_connection", "io_services", "poll")),
    ("the workload's loop and confirm tracking", ("_fill", "settle", "_on_message", "ConfirmTracker")),
]
PIKA_CODE = (" (pika/",)
_IDLE_LEAVES = ("WorkerThread._work ", "IOThread._serve ", "wait_go ")
_OWN_CODE = (" (broker/", " (client/", " (bench/")


def _hop_of(frames: list[str], hops: list[tuple[str, tuple[str, ...]]], own_code: tuple[str, ...] = _OWN_CODE) -> str:
    """The hop of the innermost frame of ackbus's own code that a hop names (so a
    socket ``recv`` inside trio counts for the HTTP reader that called it); failing
    that, of the innermost frame any hop names (trio's run loop); else "other"."""
    for own_only in (True, False):
        for frame in reversed(frames):
            if own_only and not any(marker in frame for marker in own_code):
                continue
            for name, keys in hops:
                if any(k in frame for k in keys):
                    return name
    return "other"


def attribute(
    raw_lines: list[str], hops: list[tuple[str, tuple[str, ...]]], own_code: tuple[str, ...] = _OWN_CODE,
) -> tuple[collections.Counter[str], int]:
    """Samples per hop from py-spy's ``--format raw`` lines (``frame;frame;... count``):
    each stack to the hop of its innermost named frame (see :data:`BROKER_HOPS`); also
    the samples of idle threads, which the shares leave out."""
    counts: collections.Counter[str] = collections.Counter()
    idle = 0
    for line in raw_lines:
        line = line.rstrip()
        if not line:
            continue
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if any(frames[-1].startswith(leaf) for leaf in _IDLE_LEAVES):
            idle += int(n)
            continue
        counts[_hop_of(frames, hops, own_code)] += int(n)
    return counts, idle


def _table(title: str, counts: collections.Counter[str], cpu_us: float) -> str:
    busy = sum(counts.values()) or 1
    rows = [f"{title}: {cpu_us:.1f} µs of CPU per message", "| hop | share of samples | ≈ µs/msg |",
            "| --- | --- | --- |"]
    for hop, n in counts.most_common():
        rows.append(f"| {hop} | {100 * n / busy:.0f} % | {cpu_us * n / busy:.1f} |")
    return "\n".join(rows)


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    if args.op == "publish_pipelined":
        return {"op": "publish_pipelined", "queues": ["profile"], "routing_key": "profile", "size": args.size,
                "duration_s": args.seconds, "window": args.window}
    if args.op == "publish_seq":
        return {"op": "publish_seq", "queues": ["profile"], "routing_key": "profile", "size": args.size,
                "duration_s": args.seconds, "warmup_s": 0.5}
    return {"op": "consume", "queue": "profile", "count": args.count, "prefetch": args.prefetch}


def _worker(server: AckbusServer | NullAMQPServer, spec: dict[str, Any]) -> subprocess.Popen[str]:
    module = "bench.worker_rabbitmq" if server.worker_side == "rabbitmq" else "bench.worker_ackbus"
    proc = subprocess.Popen(
        [sys.executable, "-m", module, json.dumps({**server.client_spec(), **spec})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(code_root()),
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "READY":
        proc.kill()
        raise SystemExit("the worker did not get ready")
    return proc


def _run(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("GO\n")
    proc.stdin.flush()
    lines = proc.stdout.read().splitlines()
    proc.wait()
    results = [line for line in lines if line.startswith("RESULT ")]
    if not results:
        raise SystemExit("the worker ended without a result")
    result: dict[str, Any] = json.loads(results[-1][len("RESULT "):])
    return result


def _spy(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--output", str(out),
         "--duration", str(max(1, round(seconds)))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=["publish_pipelined", "publish_seq", "consume"], default="publish_pipelined")
    parser.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    parser.add_argument("--seconds", type=float, default=8.0, help="publishing time (default 8)")
    parser.add_argument("--window", type=int, default=1000, help="pipelined publishes in flight (default 1000)")
    parser.add_argument("--count", type=int, default=100_000, help="messages to fill and consume (consume)")
    parser.add_argument("--prefetch", type=int, default=100, help="consumer prefetch (consume)")
    parser.add_argument("--sample", action="store_true", help="sample both processes with py-spy")
    parser.add_argument("--amqp", action="store_true",
                        help="the AMQP port with the pika worker (as scripts/bench --peer rabbitmq --amqp)")
    parser.add_argument("--null", action="store_true",
                        help="the pika worker against the null AMQP peer (no broker: pika's ceiling); implies --amqp")
    parser.add_argument("--peer", choices=["null"], help="--peer null: the same as --null")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="with --sample, also copy py-spy's raw stacks (broker.txt, client.txt) into DIR")
    args = parser.parse_args(argv)
    if args.sample and shutil.which("py-spy") is None:
        parser.error("--sample needs py-spy on PATH (pip install py-spy)")
    args.null = args.null or args.peer == "null"
    args.amqp = args.amqp or args.null
    workdir = Path(tempfile.mkdtemp(prefix="ackbus-profile-"))
    server = NullAMQPServer(workdir) if args.null else AckbusServer(workdir, amqp=args.amqp)
    try:
        server.start(timeout_s=60)
        if args.op == "consume":
            fill = {"op": "publish_pipelined", "queues": ["profile"], "routing_key": "profile", "size": args.size,
                    "count": args.count, "window": 1000}
            _run(_worker(server, fill))
        worker = _worker(server, _spec(args))
        spies = []
        seconds = args.seconds if args.op != "consume" else args.count / 20_000
        if args.sample:
            spies = [_spy(worker.pid, workdir / "client.txt", seconds)]
            if not args.null:
                spies.append(_spy(server.pid, workdir / "broker.txt", seconds))
        broker0, children0 = cpu_seconds(server.pid), _children_cpu()
        result = _run(worker)  # (reaps the worker; the samplers are reaped after)
        broker_s, client_s = cpu_seconds(server.pid) - broker0, _children_cpu() - children0
        for spy in spies:
            spy.wait()
        count = result["count"]
        over = " against the null AMQP peer (pika)" if args.null else " over AMQP (pika)" if args.amqp else ""
        print(f"{args.op}{over}, {args.size} B: {count:,} messages in {result['elapsed_s']:.2f} s "
              f"({count / result['elapsed_s']:,.0f} msgs/s)")
        broker_us = broker_s / count * 1e6
        print(f"{'null server' if args.null else 'broker'}: {broker_us:.1f} µs of CPU per message")
        print(f"client: {client_s / count * 1e6:.1f} µs of CPU per message")
        if args.sample and args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for name in ("broker.txt", "client.txt"):
                if (workdir / name).exists():
                    shutil.copy(workdir / name, args.keep / name)
        if args.sample:
            for title, path, hops, cpu_us in (
                ("broker", workdir / "broker.txt", AMQP_BROKER_HOPS if args.amqp else BROKER_HOPS, broker_us),
                ("client", workdir / "client.txt", PIKA_HOPS if args.amqp else CLIENT_HOPS, client_s / count * 1e6),
            ):
                if path.exists():
                    own = PIKA_CODE if hops is PIKA_HOPS else _OWN_CODE
                    counts, idle = attribute(path.read_text().splitlines(), hops, own)
                    print()
                    print(_table(title, counts, cpu_us))
                    print(f"({sum(counts.values())} samples; {idle} of idle threads left out)")
        return 0
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (the worker, once waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench.profile``: stacks attributed to hops, and one short real run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.procs import ROOT
from bench.profile import AMQP_BROKER_HOPS, BROKER_HOPS, PIKA_CODE, PIKA_HOPS, attribute

RAW = [
    "<module> (broker/__main__.py:1);serve_reader (broker/api/channel/reader.py:1);"
    "_apply_typed (broker/api/channel/reader.py:2);CommandGateway.publish (broker/runtime/gateway.py:3);"
    "Publishing.publish (broker/core/publishing.py:3);DedupWindow.lookup (broker/core/dedup.py:4) 30",
    "<module> (broker/__main__.py:1);serve_reader (broker/api/channel/reader.py:1);"
    "decode_hot (broker/api/channel/typed.py:5) 10",
    "Thread._bootstrap (threading.py:1);WorkerThread._work (trio/_core/_thread_cache.py:211) 50",
    "Thread._bootstrap (threading.py:1);WorkerThread._work (trio/_core/_thread_cache.py:213);"
    "GroupCommitter._io_write (broker/storage/wal_commit.py:1);_OsFile.sync (broker/storage/fs.py:2) 5",
    # the WAL's own IO thread: parked (idle), then at work
    "Thread._bootstrap (threading.py:1);IOThread._serve (broker/storage/wal_thread.py:128) 20",
    "Thread._bootstrap (threading.py:1);IOThread._serve (broker/storage/wal_thread.py:131);"
    "_Call.run_in_thread (broker/storage/wal_thread.py:55);GroupCommitter._io_write (broker/storage/wal_commit.py:1) 4",
    "<module> (broker/__main__.py:1);something_new (broker/x.py:1) 5",
    # a socket read inside trio counts for the HTTP reader that called it
    "<module> (broker/__main__.py:1);unrolled_run (trio/_core/_run.py:1);serve_reader (broker/api/channel/reader.py:1);"
    "RequestReader.receive (broker/http/reading.py:1);_SocketType._nonblocking_helper (trio/_socket.py:1) 7",
    # a thread hand-off has no frame of ackbus's own that a hop names: trio's
    "Thread._bootstrap (threading.py:1);WorkerThread._work (trio/_core/_thread_cache.py:213);"
    "TrioToken.run_sync_soon (trio/_core/_entry_queue.py:2) 3",
    "",
]


def test_stacks_go_to_the_hop_of_their_innermost_named_frame() -> None:
    counts, idle = attribute(RAW, BROKER_HOPS)
    assert idle == 70  # parked worker threads (trio's, the WAL's) are left out; one at work is not
    # the core's own frames when interpreted, its caller's self time when compiled
    assert counts["core: publish (checks, dedup, message, record, enqueue, confirm)"] == 30
    assert counts["channel: op line decoded (msgspec) and checked, publish handed over"] == 10  # not the reader loop
    assert counts["WAL thread: write + fdatasync (mostly waiting)"] == 9
    assert counts["HTTP: chunked body read (recv, h11)"] == 7
    assert counts["trio: run loop, epoll, thread hand-off"] == 3
    assert counts["other"] == 5
    assert sum(counts.values()) == 64


AMQP_RAW = [
    "<module> (broker/__main__.py:1);AMQPServer._reader (broker/amqp/server.py:1);"
    "AMQPConnection.receive_data (broker/amqp/connection.py:1);AMQPConnection._parse (broker/amqp/connection.py:2) 20",
    "<module> (broker/__main__.py:1);AMQPServer._reader (broker/amqp/server.py:1);_drain_events (broker/amqp/server.py:2);"
    "AMQPSession.handle_nowait (broker/amqp/session.py:1);CommandGateway.publish (broker/runtime/gateway.py:3) 9",
    "<module> (broker/__main__.py:1);BrokerRuntime.pump (broker/runtime/runtime.py:1);AMQPChannel.push "
    "(broker/amqp/session.py:1);encode_deliver (broker/amqp/frames.py:1) 4",
]
PIKA_RAW = [
    # the worker's own loop calls into pika: the innermost pika frame names the hop
    "<module> (bench/worker_rabbitmq.py:1);PipelinedPublisher._fill (bench/worker_rabbitmq.py:2);"
    "Channel.basic_publish (pika/channel.py:1);Connection._send_message (pika/connection.py:2) 6",
    "<module> (bench/worker_rabbitmq.py:1);IOLoop.start (pika/adapters/select_connection.py:1);"
    "_AsyncPlaintextTransport._on_socket_readable (pika/adapters/utils/io_services_utils.py:1);"
    "Connection._on_data_available (pika/connection.py:1) 3",
    "<module> (bench/worker_rabbitmq.py:1);ConfirmTracker.settle (bench/worker_rabbitmq.py:3) 2",
]


def test_amqp_stacks_go_to_the_amqp_and_pika_hops() -> None:
    counts, _idle = attribute(AMQP_RAW, AMQP_BROKER_HOPS)
    assert counts["amqp: frames split and decoded, publishes assembled"] == 20
    assert counts["core: publish (checks, dedup, message, record, enqueue, confirm)"] == 9
    assert counts["amqp: deliveries and confirms encoded"] == 4
    counts, _idle = attribute(PIKA_RAW, PIKA_HOPS, PIKA_CODE)
    assert counts["pika: methods out encoded and queued (basic_publish, basic_ack)"] == 6
    assert counts["pika: frames in decoded, callbacks dispatched"] == 3
    assert counts["the workload's loop and confirm tracking"] == 2


@pytest.mark.slow
def test_a_short_run_of_the_amqp_port_reports_cpu_per_message() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.profile", "--amqp", "--seconds", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("publish_pipelined over AMQP (pika), 100 B: ")
    for side in ("broker", "client"):
        (line,) = [x for x in lines if x.startswith(f"{side}: ")]
        assert float(line.split()[1]) > 0, line


@pytest.mark.slow
def test_a_short_run_reports_cpu_per_message() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.profile", "--seconds", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("publish_pipelined, 100 B: ")
    for side in ("broker", "client"):
        (line,) = [x for x in lines if x.startswith(f"{side}: ")]
        assert float(line.split()[1]) > 0, line


@pytest.mark.slow
def test_a_short_run_against_the_null_peer_reports_pikas_cpu_per_message() -> None:
    # CPU time is read from /proc in 10 ms ticks and the null server spends about
    # 5 µs per message: 20,000 messages give it some 10 ticks, 2,000 gave it one or none.
    done = subprocess.run([sys.executable, "-m", "bench.profile", "--peer", "null", "--op", "consume", "--count", "20000"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("consume against the null AMQP peer (pika), 100 B: 20,000 messages")
    for side in ("null server", "client"):
        (line,) = [x for x in lines if x.startswith(f"{side}: ")]
        assert float(line.split(": ")[1].split()[0]) > 0, line

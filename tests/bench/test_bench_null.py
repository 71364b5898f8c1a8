"""The null AMQP peer (``bench.nullamqp``, ``bench.server_nullamqp``): pika's ceiling.

It must serve the real pika worker (``bench/worker_rabbitmq.py``, unchanged) with
the counts right, answer bad input with the AMQP error a broker would send (never a
crash or a hang), and show up as a column of its own in a quick benchmark run.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from bench.cli import main
from bench.nullamqp import PROTOCOL_HEADER
from bench.procs import ROOT
from bench.server_nullamqp import NullAMQPServer

pytest.importorskip("pika")


@pytest.fixture
def null_server(tmp_path: Path) -> Iterator[NullAMQPServer]:
    server = NullAMQPServer(tmp_path / "null")
    server.start(timeout_s=30)
    try:
        yield server
    finally:
        server.stop()
    assert server.proc is not None and server.proc.returncode is not None


def _workers(server: NullAMQPServer, *specs: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the pika worker (``bench.worker_rabbitmq``) once per spec, one after another:
    READY, GO, then its RESULT line, each under a timeout."""
    results = []
    for one in specs:
        with subprocess.Popen([sys.executable, "-m", "bench.worker_rabbitmq", json.dumps({**server.client_spec(), **one})],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT) as proc:
            try:
                out, _ = proc.communicate("GO\n", timeout=30)
            finally:
                proc.kill()
        lines = out.splitlines()
        assert lines[0] == "READY" and lines[-1].startswith("RESULT "), out
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


def test_the_pika_worker_publishes_and_consumes_with_the_counts_right(null_server: NullAMQPServer) -> None:
    queue = "bench.null.q"
    (published,) = _workers(null_server, {
        "op": "publish_pipelined", "queues": [queue], "routing_key": queue, "size": 1024, "count": 3000,
        "window": 100})
    assert published["count"] == 3000 and published["nacked"] == 0
    assert null_server.queue_messages(queue) == 3000

    (consumed,) = _workers(null_server, {"op": "consume", "queue": queue, "count": 2500, "prefetch": 50})
    assert consumed["count"] == 2500 and consumed["elapsed_s"] > 0
    # the deliveries still outstanding when the consumer left went back to the queue
    null_server.wait_queue(queue, 500, timeout_s=10)


def test_fanout_transactions_and_one_at_a_time_publishes_are_counted(null_server: NullAMQPServer) -> None:
    fanned = [f"bench.null.fan.{i}" for i in range(3)]
    fanout, tx, seq = _workers(
        null_server,
        {"op": "publish_pipelined", "queues": fanned, "fanout": "bench.null.fanout", "exchange": "bench.null.fanout",
         "routing_key": "", "size": 100, "count": 500, "window": 50},
        {"op": "tx_publish", "queues": ["bench.null.tx"], "routing_key": "bench.null.tx", "size": 100, "per_tx": 10,
         "duration_s": 0.2},
        {"op": "publish_seq", "queues": ["bench.null.seq"], "routing_key": "bench.null.seq", "size": 100,
         "duration_s": 0.2, "warmup_s": 0.0},
    )
    assert fanout["count"] == 500
    assert [null_server.queue_messages(q) for q in fanned] == [500, 500, 500]
    assert tx["count"] == tx["commits"] * 10 > 0
    assert null_server.queue_messages("bench.null.tx") == tx["count"]
    assert null_server.queue_messages("bench.null.seq") == seq["count"] > 0


# --------------------------------------------------------------------------- bad input, raw frames


class RawAMQP:
    """A blocking AMQP client of raw frames (pamqp), every read under a deadline."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""

    def send(self, channel: int, *methods: Any) -> None:
        self.sock.sendall(b"".join(pamqp_frame.marshal(m, channel) for m in methods))

    def read(self) -> tuple[int, Any]:
        """The next frame: (channel, pamqp frame); fails at EOF or after 5 s."""
        deadline = time.monotonic() + 5
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack_from(">I", self.buf, 3)[0]
                if len(self.buf) >= 8 + size:
                    used, channel, value = pamqp_frame.unmarshal(self.buf)
                    self.buf = self.buf[used:]
                    return channel, value
            assert time.monotonic() < deadline, "no frame in time"
            data = self.sock.recv(65536)
            assert data, f"connection closed (had {self.buf!r})"
            self.buf += data

    def closed(self) -> bool:
        """True once the server closed the socket (within 5 s)."""
        while True:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            if not data:
                return True

    def open(self) -> None:
        """The handshake and channel 1."""
        self.sock.sendall(PROTOCOL_HEADER)
        _, start = self.read()
        assert isinstance(start, spec.Connection.Start)
        capabilities = start.server_properties["capabilities"]
        for name in ("publisher_confirms", "consumer_cancel_notify", "basic.nack", "per_consumer_qos"):
            assert capabilities[name] is True, name
        self.send(0, spec.Connection.StartOk(client_properties={}, response="\0guest\0guest"))
        _, tune = self.read()
        assert isinstance(tune, spec.Connection.Tune) and tune.heartbeat == 0
        self.send(0, spec.Connection.TuneOk(tune.channel_max, tune.frame_max, 0), spec.Connection.Open())
        assert isinstance(self.read()[1], spec.Connection.OpenOk)
        self.send(1, spec.Channel.Open())
        assert isinstance(self.read()[1], spec.Channel.OpenOk)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(null_server: NullAMQPServer) -> Iterator[RawAMQP]:
    client = RawAMQP(null_server.port)
    try:
        yield client
    finally:
        client.close()


def _still_serves(server: NullAMQPServer) -> None:
    client = RawAMQP(server.port)
    try:
        client.open()
    finally:
        client.close()


def test_another_protocol_gets_the_amqp_header_and_a_close(null_server: NullAMQPServer, raw: RawAMQP) -> None:
    raw.sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert raw.sock.recv(8) == PROTOCOL_HEADER
    assert raw.closed()
    _still_serves(null_server)


def test_unknown_exchange_and_queue_close_the_channel_with_404(null_server: NullAMQPServer, raw: RawAMQP) -> None:
    raw.open()
    raw.send(1, spec.Basic.Publish(exchange="nowhere", routing_key="k"))
    raw.sock.sendall(pamqp_frame.marshal(pamqp_header.ContentHeader(0, 1, spec.Basic.Properties()), 1)
                     + pamqp_frame.marshal(pamqp_body.ContentBody(b"x"), 1))
    channel, close = raw.read()
    assert channel == 1 and isinstance(close, spec.Channel.Close) and close.reply_code == 404
    assert "nowhere" in close.reply_text
    raw.send(1, spec.Channel.CloseOk())
    raw.send(2, spec.Channel.Open())
    assert isinstance(raw.read()[1], spec.Channel.OpenOk)
    raw.send(2, spec.Queue.Declare(queue="missing", passive=True))
    channel, close = raw.read()
    assert channel == 2 and isinstance(close, spec.Channel.Close) and close.reply_code == 404
    # a wrong delivery tag on another channel: 406
    raw.send(3, spec.Channel.Open())
    assert isinstance(raw.read()[1], spec.Channel.OpenOk)
    raw.send(3, spec.Basic.Ack(delivery_tag=7))
    channel, close = raw.read()
    assert channel == 3 and isinstance(close, spec.Channel.Close) and close.reply_code == 406
    # a body over the null peer's bound: 406 too, and the body frames after it are ignored
    raw.send(4, spec.Channel.Open(), spec.Queue.Declare(queue="big"))
    assert isinstance(raw.read()[1], spec.Channel.OpenOk) and isinstance(raw.read()[1], spec.Queue.DeclareOk)
    raw.send(4, spec.Basic.Publish(routing_key="big"))
    raw.sock.sendall(pamqp_frame.marshal(pamqp_header.ContentHeader(0, 1 << 30, spec.Basic.Properties()), 4)
                     + pamqp_frame.marshal(pamqp_body.ContentBody(b"x" * 1000), 4))
    channel, close = raw.read()
    assert channel == 4 and isinstance(close, spec.Channel.Close) and close.reply_code == 406
    raw.send(4, spec.Channel.CloseOk())
    raw.send(5, spec.Channel.Open(), spec.Queue.Declare(queue="big", passive=True))
    assert isinstance(raw.read()[1], spec.Channel.OpenOk)
    _, declared = raw.read()
    assert isinstance(declared, spec.Queue.DeclareOk) and declared.message_count == 0
    # a name pamqp cannot carry in the reply (found by the test below): 406, not a dropped connection
    raw.send(6, spec.Channel.Open())
    assert isinstance(raw.read()[1], spec.Channel.OpenOk)
    raw.sock.sendall(pamqp_frame.marshal(spec.Queue.Declare(queue="okname"), 6).replace(b"okname", b"bad!na"))
    channel, close = raw.read()
    assert channel == 6 and isinstance(close, spec.Channel.Close) and close.reply_code == 406
    assert "Invalid value for queue" in close.reply_text


def test_unimplemented_methods_and_broken_frames_close_the_connection(
        null_server: NullAMQPServer, raw: RawAMQP) -> None:
    raw.open()
    raw.send(1, spec.Queue.Declare(queue="q"))
    assert isinstance(raw.read()[1], spec.Queue.DeclareOk)
    raw.send(1, spec.Basic.Get(queue="q"))
    channel, close = raw.read()
    assert channel == 0 and isinstance(close, spec.Connection.Close) and close.reply_code == 540
    raw.send(0, spec.Connection.CloseOk())
    assert raw.closed()

    other = RawAMQP(null_server.port)
    try:
        other.open()
        other.sock.sendall(struct.pack(">BHI", 1, 1, 10_000_000))  # a frame over frame_max
        channel, close = other.read()
        assert isinstance(close, spec.Connection.Close) and close.reply_code == 501
        assert other.closed()
    finally:
        other.close()
    _still_serves(null_server)


def _valid_script() -> bytes:
    """Frames a pika publisher and consumer send on channel 1 after the handshake."""
    methods = [spec.Queue.Declare(queue="f"), spec.Confirm.Select(), spec.Basic.Qos(prefetch_count=5),
               spec.Basic.Consume(queue="f", consumer_tag="c")]
    out = b"".join(pamqp_frame.marshal(m, 1) for m in methods)
    for _ in range(3):
        out += (pamqp_frame.marshal(spec.Basic.Publish(routing_key="f"), 1)
                + pamqp_frame.marshal(pamqp_header.ContentHeader(0, 3, spec.Basic.Properties(delivery_mode=2)), 1)
                + pamqp_frame.marshal(pamqp_body.ContentBody(b"abc"), 1))
    return out + pamqp_frame.marshal(spec.Basic.Ack(delivery_tag=1), 1)


def test_broken_input_never_takes_the_server_down(null_server: NullAMQPServer, seeded_random: Any) -> None:
    """Valid frames with bytes flipped, cut, inserted or replaced by garbage: each
    connection ends or goes on, and a fresh one still gets through the handshake."""
    script = _valid_script()
    for case in range(40):
        data = bytearray(script)
        for _ in range(seeded_random.randint(1, 4)):
            at = seeded_random.randrange(len(data))
            what = seeded_random.choice(("flip", "cut", "insert", "garbage"))
            if what == "flip":
                data[at] ^= 1 << seeded_random.randrange(8)
            elif what == "cut":
                del data[at:at + seeded_random.randint(1, 20)]
            elif what == "insert":
                data[at:at] = seeded_random.randbytes(seeded_random.randint(1, 20))
            else:
                data[at:] = seeded_random.randbytes(seeded_random.randint(1, 200))
        client = RawAMQP(null_server.port)
        try:
            client.open()
            client.sock.sendall(bytes(data))
            client.sock.shutdown(socket.SHUT_WR)
            client.sock.settimeout(2)
            try:
                while client.sock.recv(65536):
                    pass
            except (TimeoutError, ConnectionResetError):
                pass
        finally:
            client.close()
        assert null_server.proc is not None and null_server.proc.poll() is None, f"case {case}: the server died"
        _still_serves(null_server)
    log = null_server.log_tail(200)
    assert "Traceback" not in log, log


# --------------------------------------------------------------------------- the harness


@pytest.mark.slow
def test_a_quick_run_has_a_null_column(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKBUS_BENCH_CLIENT_BACKEND", "trio")  # (main() sets it; undone after the test)
    cmd = [sys.executable, "-m", "bench", "--peer", "null", "--amqp", "--only", "inflight", "--quick", "--rounds", "1",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "latest.json").read_text())
    assert [r["side"] for r in results["runs"]] == ["ackbus", "null"]
    assert not [r for r in results["runs"] if r.get("error")]
    null_run = results["runs"][1]
    assert null_run["figures"] and all(v > 0 for v in null_run["figures"].values())
    (header,) = [line for line in done.stdout.splitlines() if line.startswith("figure ")]
    assert "null median (min–max)" in header and "ackbus/null" in header
    assert "pika's ceiling" in done.stdout
    for figure in results["summary"]:
        assert figure["null"]["median"] > 0 and figure["ratios"]["null"]["median_ratio"] > 0
    # saved results print the null column again
    capsys.readouterr()
    assert main(["--results", str(tmp_path / "latest.json")]) == 0
    assert "ackbus/null" in capsys.readouterr().out

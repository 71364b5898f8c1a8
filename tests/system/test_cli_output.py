"""The ``ackbus`` CLI as a shell user meets it (a real broker, the CLI a subprocess):
a closed pipe ends it quietly, an error shows once, and ``consume -n N`` takes no
message it will not print."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.broker import ROOT, BrokerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("cli") / "data") as proc:
        yield proc


def ackbus(broker: BrokerProcess, *argv: str, stdout: int | None = subprocess.PIPE,
           stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "client", "--url", broker.url, "--timeout", "10", *argv],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), input=stdin,
        stdout=stdout, stderr=subprocess.PIPE, timeout=60, check=False,
    )


@pytest.mark.parametrize("argv", [("queues", "--json"), ("queues",), ("exchanges",), ("overview",)])
def test_a_closed_pipe_ends_it_quietly(broker: BrokerProcess, argv: tuple[str, ...]) -> None:
    """``ackbus queues | head`` once head has gone: exit as ls does (SIGPIPE's 141),
    no traceback."""
    assert ackbus(broker, "declare", "queue", "piped").returncode == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        done = ackbus(broker, *argv, stdout=write_end)
    finally:
        os.close(write_end)
    assert done.stderr == b"", done.stderr.decode()
    assert done.returncode == 141


@pytest.mark.parametrize("argv, message", [
    (("publish", "-e", "nowhere", "hello"), "no exchange 'nowhere'"),
    (("consume", "nowhere", "-n", "1"), "no queue 'nowhere'"),
    (("bind", "nowhere", "piped"), "no exchange 'nowhere'"),
])
def test_an_error_shows_once(broker: BrokerProcess, argv: tuple[str, ...], message: str) -> None:
    ackbus(broker, "declare", "queue", "piped")
    done = ackbus(broker, *argv)
    assert done.returncode in (1, 4)
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("ackbus: "), lines


def test_consume_n_takes_only_n(broker: BrokerProcess) -> None:
    assert ackbus(broker, "declare", "queue", "counted").returncode == 0
    published = ackbus(broker, "publish", "-k", "counted",
                       stdin="".join(f"m{i}\n" for i in range(20)).encode())
    assert published.returncode == 0, published.stderr
    for count, prefetch in ((2, "10"), (5, "2"), (1, "1")):
        done = ackbus(broker, "consume", "counted", "-n", str(count), "--prefetch", prefetch)
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.splitlines()) == count
    status, queue = broker.request("GET", "/queues/counted")
    assert status == 200
    # delivered once each, none sent back with its delivery count raised
    assert queue["message_stats"]["delivered"] == 8, queue
    assert queue["message_stats"]["redelivered"] == 0, queue
    assert (queue["messages_ready"], queue["messages_unacked"]) == (12, 0)
    status, page = broker.request("GET", "/queues/counted/messages?limit=20")
    assert status == 200
    assert [m["delivery_count"] for m in page["messages"]] == [0] * 12

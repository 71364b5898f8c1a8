"""The broker's command line as an operator meets it: ``--help``, validation errors,
the precedence of flags, environment and config file, limits that refuse clearly, and
the log settings. Every test runs ``python -m broker`` as a real process.

tests/test_config.py covers the settings loader in depth, in-process; this file checks
the wiring around it: exit statuses, what reaches stderr, and that a setting given
anywhere takes effect in the running broker.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker.config import describe_settings
from tests.support.broker import ROOT, BrokerProcess, free_port, request
from tests.support.rawchannel import ChannelGone, RawChannel
from tests.support.wait import wait_until_sync

pytestmark = pytest.mark.slow


def broker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACKBUS_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    env.setdefault("ACKBUS_AMQP_PORT", "0")  # no AMQP listener on the shared default port
    return env


def run_broker_cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``python -m broker ARGS`` to completion (for --help and errors)."""
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        env=broker_env(env),
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=30,
    )


def http_get(port: int, path: str, timeout_s: float = 1.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@contextmanager
def running_broker(
    *args: str, env: dict[str, str] | None = None, cwd: Path, port: int
) -> Iterator[subprocess.Popen[str]]:
    """``python -m broker ARGS`` running until it answers ``/healthz`` on ``port``;
    SIGTERM (and exit status 0) when the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", *args],
        env=broker_env(env),
        cwd=str(cwd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"broker exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
            try:
                if http_get(port, "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "broker not ready"
            time.sleep(0.05)
        yield proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# --------------------------------------------------------------------------- --help


def test_help_lists_every_setting_with_default_and_env() -> None:
    result = run_broker_cli("--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps lines
    for info in describe_settings():
        assert info.flag in text, info.flag
        assert f"(default: {info.show_default()}; env: {info.env})" in text, info.name
    assert "--config PATH" in text and "ACKBUS_CONFIG" in text
    assert "Precedence: flags > environment > config file > defaults" in text


def test_version() -> None:
    from broker import __version__

    result = run_broker_cli("--version")
    assert result.returncode == 0
    # the version, and which build runs (docs/benchmarks.md, "The builds")
    assert result.stdout.strip() in (
        f"ackbus-broker {__version__} (interpreted build)",
        f"ackbus-broker {__version__} (compiled build)",
    ), result.stdout


# --------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("args", "env", "toml", "expected"),
    [
        (["--port", "70000"], {}, None, "port = '70000' from --port: must be between 0 and 65535"),
        (
            [],
            {"ACKBUS_MAX_BODY_BYTES": "lots"},
            None,
            "max_body_bytes = 'lots' from environment variable ACKBUS_MAX_BODY_BYTES: must be a size",
        ),
        ([], {}, "max-body-bytes = 10\n", "unknown setting 'max-body-bytes' in config file"),
        ([], {}, 'port = "8080"\n', "must be an integer, not a string"),
        ([], {}, "port = [\n", "is not valid TOML"),
        (
            ["--default-lease-s", "100"],
            {"ACKBUS_MAX_LEASE_S": "50"},
            None,
            "default_lease_s = 100 (from --default-lease-s) must not exceed max_lease_s = 50 "
            "(from environment variable ACKBUS_MAX_LEASE_S)",
        ),
        (["--fsync", "sometimes"], {}, None, "must be always, never, or interval="),
        (["--shutdown-timeout-s", "-1"], {}, None, "shutdown_timeout_s"),
        (["--bogus"], {}, None, "unrecognized arguments: --bogus (see --help)"),
        (["--log-file", "/nonexistent-dir/broker.log"], {}, None, "log_file = '/nonexistent-dir/broker.log': cannot open"),
        # A broken file is reported even while a flag overrides the value in it.
        (["--port", "9000"], {}, "port = -5\n", "from config file"),
    ],
)
def test_invalid_settings_exit_2_with_one_clear_line(
    tmp_path: Path, args: list[str], env: dict[str, str], toml: str | None, expected: str
) -> None:
    if toml is not None:
        config = tmp_path / "ackbus.toml"
        config.write_text(toml)
        args = ["--config", str(config), *args]
    result = run_broker_cli("--data-dir", str(tmp_path / "data"), *args, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ackbus-broker: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists(), "the broker touched its data directory before validating"


def test_missing_config_file_named_by_environment(tmp_path: Path) -> None:
    result = run_broker_cli(env={"ACKBUS_CONFIG": str(tmp_path / "absent.toml")}, cwd=tmp_path)
    assert result.returncode == 2
    assert "cannot read config file" in result.stderr
    assert "environment variable ACKBUS_CONFIG" in result.stderr


def test_busy_port_exits_1_naming_the_address(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_broker_cli("--port", str(port), "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists(), "recovery ran although the broker could not listen"


# --------------------------------------------------------------------- precedence


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    file_port, env_port, flag_port = free_port(), free_port(), free_port()
    config = tmp_path / "ackbus.toml"
    config.write_text(f'port = {file_port}\ndata_dir = "from-file"\nmax_queues = 7\n')

    # The file alone: its port and (relative to the working directory) data dir.
    with running_broker("--config", str(config), cwd=tmp_path, port=file_port):
        pass
    assert (tmp_path / "from-file").is_dir()

    # The environment beats the file; ACKBUS_CONFIG names the file just like --config.
    env = {"ACKBUS_CONFIG": str(config), "ACKBUS_PORT": str(env_port), "ACKBUS_DATA_DIR": "from-env"}
    with running_broker(env=env, cwd=tmp_path, port=env_port):
        pass
    assert (tmp_path / "from-env").is_dir()

    # A flag beats both; settings from lower sources still apply where not overridden.
    with running_broker(
        "--port", str(flag_port), "--data-dir", "from-flag", env=env, cwd=tmp_path, port=flag_port
    ):
        for i in range(7):
            assert request(flag_port, "PUT", f"/queues/q{i}", {})[0] == 201
        status, body = request(flag_port, "PUT", "/queues/one-too-many", {})
        assert status == 503 and "(7)" in body["message"], body  # max_queues = 7 from the file
    assert (tmp_path / "from-flag").is_dir()


# ------------------------------------------------------------------------- limits


def test_limits_refuse_clearly_and_the_broker_carries_on(tmp_path: Path) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        args=("--max-channels", "2", "--max-queues", "2", "--max-body-bytes", "1000", "--max-connections", "6"),
    )
    with broker:
        port = broker.port
        # max_queues
        assert request(port, "PUT", "/queues/a", {})[0] == 201
        assert request(port, "PUT", "/queues/b", {})[0] == 201
        status, body = request(port, "PUT", "/queues/c", {})
        assert status == 503 and body["error"] == "limit_reached", (status, body)
        assert body["message"] == "queue limit reached (2)"

        # max_body_bytes: REST publish and channel publish
        status, body = request(port, "POST", "/exchanges/amq.default/publish?routing_key=a", b"x" * 1001)
        assert status == 413 and body["error"], body
        status, body = request(port, "POST", "/exchanges/amq.default/publish?routing_key=a", b"x" * 1000)
        assert status == 200, body

        # max_channels (broker-wide)
        first, second = RawChannel(port), RawChannel(port)
        try:
            status, body = request(port, "POST", "/channel", b"")
            assert status == 503 and body["error"] == "limit_reached", body
            assert "channel limit" in body["message"]
            second.send({"op": "publish", "routing_key": "a", "body": "y" * 1001})
            event = second.next_event()
            assert event["ev"] == "error" and event["error"] == "payload_too_large", event
        finally:
            first.close()
            second.close()
        _eventually(lambda: RawChannel(port).close() is None)

        # max_connections: idle sockets hold every slot; the next one gets a 503.
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
        try:

            def refused() -> tuple[int, bytes] | None:
                status, raw = _raw_get(port, "/healthz")
                return (status, raw) if status == 503 else None

            # once the broker holds all six, the next connection is answered 503
            status, raw = wait_until_sync(refused, 10, what="a 503 with every slot held")
            assert b"too many connections" in raw
        finally:
            for sock in held:
                sock.close()
        _eventually(lambda: _raw_get(port, "/healthz")[0] == 200)

        # Nothing above crashed anything.
        assert broker.proc is not None and broker.proc.poll() is None
        status, metrics = request(port, "GET", "/metrics")
        rejected = re.search(rb"^ackbus_connections_rejected_total (\S+)$", metrics, re.MULTILINE)
        assert rejected is not None and float(rejected.group(1)) >= 1
    assert broker.proc is not None and broker.proc.returncode == 0


def _raw_get(port: int, path: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _eventually(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except (OSError, ChannelGone, AssertionError):
            pass
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


# --------------------------------------------------------------------------- logs


def _publish_and_consume(port: int, n: int) -> None:
    ch = RawChannel(port)
    try:
        ch.send({"op": "declare_queue", "queue": "logq", "id": 1})
        ch.send(*({"op": "publish", "routing_key": "logq", "body": f"body-{i}"} for i in range(n)))
        ch.send({"op": "consume", "queue": "logq", "prefetch": 50})
        got = 0
        while got < n:
            ev = ch.next_event()
            if ev["ev"] == "deliver":
                got += 1
                ch.send({"op": "ack", "delivery_tag": ev["delivery_tag"]})
        ch.send({"op": "close"})
        while ch.next_event()["ev"] != "close_ok":
            pass
    finally:
        ch.close()


def test_json_logs_lifecycle_and_no_per_message_lines(tmp_path: Path) -> None:
    log_file = tmp_path / "broker.log"
    broker = BrokerProcess(
        tmp_path / "data", args=("--log-format", "json", "--log-level", "info", "--log-file", str(log_file))
    )
    with broker:
        _publish_and_consume(broker.port, 300)
    assert broker.proc is not None and broker.proc.returncode == 0
    records = [json.loads(line) for line in log_file.read_text().splitlines()]  # every line is JSON
    for record in records:
        assert {"ts", "level", "logger", "msg"} <= set(record)
        assert record["level"] in ("info", "warning", "error")
    messages = [r["msg"] for r in records]
    for expected in ("starting", "listening", "broker ready", "shutting down", "stopped"):
        assert expected in messages, (expected, messages)
    starting = records[messages.index("starting")]
    assert starting["port"] == broker.port and starting["log_format"] == "json"
    # 300 messages published, delivered and acked: not one line about any of them.
    assert not [r for r in records if "body-" in json.dumps(r)]
    assert len(records) < 30, messages


def test_debug_level_and_human_format(tmp_path: Path) -> None:
    log_file = tmp_path / "broker.log"
    broker = BrokerProcess(tmp_path / "data", args=("--log-level", "debug", "--log-file", str(log_file)))
    with broker:
        _publish_and_consume(broker.port, 5)
        # A malformed request is logged at debug only.
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            while sock.recv(65536):
                pass
    lines = log_file.read_text().splitlines()
    assert any(" DEBUG " in line and "bad request head" in line for line in lines), lines
    assert any("channel opened" in line for line in lines) and any("channel closed" in line for line in lines)
    # `<UTC time with ms>Z <LEVEL padded to 7> <logger>: <message>`
    for line in lines:
        if not line.startswith("    "):  # not a traceback continuation
            assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG  |INFO   |WARNING|ERROR  ) ackbus[\w.]*: ", line), line


def test_info_level_hides_debug_lines(tmp_path: Path) -> None:
    log_file = tmp_path / "broker.log"
    broker = BrokerProcess(tmp_path / "data", args=("--log-file", str(log_file)))
    with broker:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            while sock.recv(65536):
                pass
    text = log_file.read_text()
    assert " DEBUG " not in text and "bad request head" not in text
    assert "broker ready" in text


def test_channel_lifecycle_is_logged_at_info(tmp_path: Path) -> None:
    log_file = tmp_path / "broker.log"
    broker = BrokerProcess(tmp_path / "data", args=("--log-file", str(log_file)))
    with broker:
        _publish_and_consume(broker.port, 5)
    text = log_file.read_text()
    assert "INFO    ackbus.channel: channel opened" in text
    assert "INFO    ackbus.channel: channel closed" in text

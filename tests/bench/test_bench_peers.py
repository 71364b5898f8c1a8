"""Several peers in the benchmark harness, without running any broker: ``--peer``
parsing, which workloads each peer runs, and the per-peer ratios and table columns
computed from fake runs (``bench.stats`` is pure)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.cli import main, parse_args
from bench.params import QUICK
from bench.procs import ROOT
from bench.stats import (
    Figure,
    markdown_table,
    parse_peers,
    peers_of,
    summarize,
    text_table,
)
from bench.workloads import WORKLOADS, all_figures

RATE = Figure("w/rate", "w", "a rate", "msgs/s", True)
P50 = Figure("w/p50", "w", "a latency", "p50 ms", False)


def _run(side: str, round_no: int, rate: float, error: str | None = None) -> dict[str, Any]:
    run: dict[str, Any] = {"workload": "w", "round": round_no, "side": side, "figures": {"w/rate": rate}}
    if error:
        run["error"] = error
    return run


@pytest.fixture(autouse=True)
def _restore_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """``parse_args`` sets the workers' client backend in the environment: undo it."""
    monkeypatch.setenv("ACKBUS_BENCH_CLIENT_BACKEND", "trio")


def test_peer_list_in_any_order_comes_back_in_one_order() -> None:
    assert parse_peers(None) == [] and parse_peers("") == []
    assert parse_peers("redis") == ["redis"]
    assert parse_peers("redis,rabbitmq") == parse_peers("rabbitmq, redis") == ["rabbitmq", "redis"]
    assert parse_peers("redis,redis") == ["redis"]
    with pytest.raises(ValueError, match="'kafka'"):
        parse_peers("rabbitmq,kafka")
    assert parse_args(["--peer", "redis,rabbitmq"]).peers == ["rabbitmq", "redis"]
    assert parse_args([]).peers == []


def test_unknown_peer_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--peer", "nats"])
    assert exc.value.code == 2
    assert "--peer: unknown peer(s) 'nats'" in capsys.readouterr().err


def test_null_peer_needs_amqp(capsys: pytest.CaptureFixture[str]) -> None:
    """The null peer is an AMQP server for the pika worker: without --amqp, ackbus's
    side would run its own client and the two columns would not measure one workload."""
    for argv in (["--peer", "null"], ["--peer", "rabbitmq,null"], ["--peer", "null", "--amqp", "--cluster", "3"]):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2
        assert "--peer null needs --amqp" in capsys.readouterr().err
    args = parse_args(["--peer", "null,rabbitmq", "--amqp"])
    assert args.peers == ["rabbitmq", "null"]
    assert "e2e" in args.names and "recovery" in args.names  # RabbitMQ's; the null side skips them


def test_saved_results_name_their_peers_old_and_new() -> None:
    assert peers_of({"peer": "rabbitmq"}) == ["rabbitmq"]  # saved before there were several
    assert peers_of({"peer": None}) == []
    assert peers_of({"peer": "rabbitmq,redis", "peers": ["rabbitmq", "redis"]}) == ["rabbitmq", "redis"]


def test_workloads_say_which_peers_run_them() -> None:
    with_redis = {name for name, w in WORKLOADS.items() if w.runs_on("redis")}
    assert with_redis == {"publish_seq", "publish_pipelined", "inflight", "consume", "e2e", "recovery"}
    for name in ("delayed", "get_any", "priority_memory", "locks"):
        assert WORKLOADS[name].peers == frozenset() and WORKLOADS[name].ackbus_only
        assert not WORKLOADS[name].runs_on("rabbitmq") and WORKLOADS[name].runs_on("ackbus")
    assert WORKLOADS["fanout"].runs_on("rabbitmq") and not WORKLOADS["fanout"].runs_on("redis")
    with_null = {name for name, w in WORKLOADS.items() if w.runs_on("null")}
    assert with_null == {"publish_seq", "publish_pipelined", "inflight", "consume", "fanout", "tx", "priority"}
    assert all(WORKLOADS[name].runs_on("rabbitmq") for name in with_null)  # (--amqp keeps RabbitMQ's only)


def test_ratio_per_peer_and_range_of_paired_rounds() -> None:
    runs = [
        _run("ackbus", 1, 100.0), _run("rabbitmq", 1, 50.0), _run("redis", 1, 200.0),
        _run("ackbus", 2, 120.0), _run("rabbitmq", 2, 40.0), _run("redis", 2, 100.0),
        _run("ackbus", 3, 90.0), _run("rabbitmq", 3, 45.0), _run("redis", 3, 0.0, error="boom"),
    ]
    (summary,) = summarize([RATE], runs)
    assert summary.ratio_to("rabbitmq") == pytest.approx(100.0 / 45.0)
    assert summary.ratio == summary.ratio_to("rabbitmq")
    assert summary.ratio_to("redis") == pytest.approx(100.0 / 150.0)
    assert summary.round_ratios("rabbitmq") == pytest.approx([2.0, 3.0, 2.0])
    assert summary.round_ratios("redis") == pytest.approx([0.5, 1.2])  # round 3 failed on Redis: unpaired
    as_json = summary.as_json()
    assert as_json["ratios"]["redis"]["per_round"] == pytest.approx([0.5, 1.2])
    assert as_json["ratio"] == pytest.approx(100.0 / 45.0)

    table = text_table([summary], ["rabbitmq", "redis"])
    header, _rule, row = table.splitlines()
    assert header.split("  ")[0] == "figure"
    for column in ("RabbitMQ median (min–max)", "ackbus/RabbitMQ", "Redis median (min–max)", "ackbus/Redis", "better"):
        assert column in header
    assert header.index("ackbus/RabbitMQ") < header.index("Redis median") < header.index("ackbus/Redis")
    assert "2.22 (2.00–3.00)" in row and "0.67 (0.50–1.20)" in row and row.rstrip().endswith("higher")


def test_null_column_beside_rabbitmq() -> None:
    runs = [_run("ackbus", 1, 30.0), _run("rabbitmq", 1, 15.0), _run("null", 1, 60.0)]
    (summary,) = summarize([RATE], runs)
    assert summary.ratio_to("null") == pytest.approx(0.5)
    assert summary.as_json()["null"]["median"] == 60.0
    header, _rule, row = markdown_table([summary], ["rabbitmq", "null"]).splitlines()
    assert header.endswith("| RabbitMQ median (min–max) | ackbus/RabbitMQ | null median (min–max) | ackbus/null | better |")
    assert "| 2.00 |" in row and "| 0.50 |" in row


def test_table_has_only_the_peers_asked_for() -> None:
    runs = [_run("ackbus", 1, 100.0), _run("redis", 1, 50.0)]
    summaries = summarize([RATE, P50], runs)
    assert len(summaries) == 1  # no value of P50 anywhere: no row
    alone = markdown_table(summaries)
    assert "Redis" not in alone and "better" not in alone
    with_redis = markdown_table(summaries, ["redis"])
    assert with_redis.splitlines()[0] == (
        "| figure | metric | ackbus median (min–max) | Redis median (min–max) | ackbus/Redis | better |")
    assert "| 2.00 |" in with_redis  # one round: no range
    assert markdown_table(summaries, False) == alone  # the RabbitMQ-only call: with_peer
    assert markdown_table(summaries, True) == markdown_table(summaries, ["rabbitmq"])
    (summary,) = summaries
    assert math.isnan(summary.ratio_to("rabbitmq"))
    assert "–" in markdown_table(summaries, ["rabbitmq", "redis"]).splitlines()[2]


def test_saved_results_from_before_several_peers_still_print(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A result file in the format of the RabbitMQ-only harness: ``peer`` a string, no
    ``peers``; the table gets the RabbitMQ columns."""
    figures = all_figures(QUICK, ["inflight"])
    runs = [
        {"workload": "inflight", "round": 1, "side": side, "figures": {f.key: value for f in figures}}
        for side, value in (("ackbus", 2000.0), ("rabbitmq", 1000.0))
    ]
    results = {"params": {k: list(v) if isinstance(v, tuple) else v for k, v in QUICK.__dict__.items()},
               "options": {"peer": "rabbitmq", "rounds": 1, "workloads": ["inflight"]}, "runs": runs}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(results))
    assert main(["--results", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ackbus/RabbitMQ" in out and "Redis" not in out
    assert "2.00" in out


def test_text_table_without_peers_is_ackbus_alone() -> None:
    summaries = summarize([RATE], [_run("ackbus", 1, 10.0), _run("ackbus", 2, 30.0)])
    table = text_table(summaries)
    assert table.splitlines()[0].split() == ["figure", "metric", "ackbus", "median", "(min–max)"]
    assert "20.0 (10.0–30.0)" in table


def test_the_harness_imports_no_peer_client() -> None:
    """The suite runs the harness without pika, redis-py or hiredis installed: only the
    peers' workers (and their servers, when used) import them."""
    code = "import sys, bench.cli; loaded = {'pika', 'redis', 'hiredis'} & set(sys.modules); assert not loaded, loaded"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

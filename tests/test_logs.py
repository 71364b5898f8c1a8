"""Log output: human and JSON formats, structured fields, levels, reopening on SIGHUP."""

from __future__ import annotations

import io
import json
import logging
import pathlib
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from broker.config import ConfigError
from broker.logs import configure_logging, log_event, reopen_log_files, reset_logging

HUMAN_LINE = re.compile(
    r"(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) (?P<level>[A-Z]+) +(?P<logger>[\w.]+): (?P<rest>.*)"
)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    yield
    reset_logging()
    root.setLevel(level)


@pytest.fixture
def log() -> logging.Logger:
    return logging.getLogger("ackbus.test")


def configured(format: str, level: str = "debug") -> io.StringIO:
    stream = io.StringIO()
    configure_logging(level, format, None, stream=stream)
    return stream


def test_human_line_layout(log: logging.Logger) -> None:
    stream = configured("human")
    log.info("queue %s declared", "orders")
    (line,) = stream.getvalue().splitlines()
    match = HUMAN_LINE.fullmatch(line)
    assert match is not None, line
    assert match["level"] == "INFO"
    assert match["logger"] == "ackbus.test"
    assert match["rest"] == "queue orders declared"


def test_human_fields_as_key_value(log: logging.Logger) -> None:
    stream = configured("human")
    log_event(log, logging.WARNING, "slow fsync", seconds=1.5, segment="0000000000000001.wal", ok=True, gone=None)
    log.info("declared", extra={"fields": {"queue": "two words", "note": 'say "hi"', "empty": ""}})
    log.info("plain extra", extra={"queue": "q1"})
    first, second, third = stream.getvalue().splitlines()
    assert first.endswith("slow fsync seconds=1.5 segment=0000000000000001.wal ok=true gone=null")
    assert second.endswith('declared queue="two words" note="say \\"hi\\"" empty=""')
    assert third.endswith("plain extra queue=q1")


def test_human_escapes_control_characters_so_lines_cannot_be_forged(log: logging.Logger) -> None:
    stream = configured("human")
    log.info("queue %s deleted", "evil\n2099-01-01T00:00:00.000Z ERROR ackbus: forged")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert "evil\\n2099" in lines[0]


def test_human_traceback_is_indented(log: logging.Logger) -> None:
    stream = configured("human")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("handler failed", extra={"fields": {"channel": 3}})
    first, *rest = stream.getvalue().splitlines()
    assert HUMAN_LINE.fullmatch(first)
    assert first.endswith("handler failed channel=3")
    assert rest and all(line.startswith("    ") for line in rest)
    assert rest[-1].strip() == "RuntimeError: boom"


def test_json_one_object_per_line(log: logging.Logger) -> None:
    stream = configured("json")
    log_event(log, "info", "published", queue="q", bytes=12, path=pathlib.Path("/x"))
    log.error("multi\nline %d", 2)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "info"
    assert first["logger"] == "ackbus.test"
    assert first["msg"] == "published"
    assert (first["queue"], first["bytes"], first["path"]) == ("q", 12, "/x")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert second["msg"] == "multi\nline 2"
    assert second["level"] == "error"


def test_json_field_names_never_overwrite_the_envelope(log: logging.Logger) -> None:
    stream = configured("json")
    log_event(log, logging.INFO, "real", msg="fake", level="fake", exc="fake")
    obj = json.loads(stream.getvalue())
    assert (obj["msg"], obj["level"]) == ("real", "info")
    assert (obj["msg_"], obj["level_"], obj["exc_"]) == ("fake", "fake", "fake")
    assert "exc" not in obj


def test_json_exception(log: logging.Logger) -> None:
    stream = configured("json")
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("oops")
    obj = json.loads(stream.getvalue())
    assert "ZeroDivisionError" in obj["exc"]


def test_level_filters_and_log_event_is_cheap_when_disabled(log: logging.Logger) -> None:
    stream = configured("json", level="warning")

    class Explodes:
        def __str__(self) -> str:
            raise AssertionError("formatted a disabled record")

    log.info("hidden")
    log_event(log, logging.DEBUG, "hidden", value=Explodes())
    log.warning("shown")
    messages = [json.loads(line)["msg"] for line in stream.getvalue().splitlines()]
    assert messages == ["shown"]


def test_configure_again_replaces_the_handler(log: logging.Logger) -> None:
    first = configured("human")
    second = configured("json")
    log.info("once")
    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"level": "verbose"}, "log_level"),
        ({"format": "xml"}, "log_format"),
    ],
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        configure_logging(**kwargs)


def test_unopenable_file_is_a_config_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="log_file = .*cannot open"):
        configure_logging("info", "human", tmp_path / "missing-dir" / "broker.log")


def test_file_output_and_reopen_after_rename(tmp_path: pathlib.Path, log: logging.Logger) -> None:
    path = tmp_path / "broker.log"
    configure_logging("info", "json", path)
    log.info("before rotation")
    path.rename(tmp_path / "broker.log.1")  # what logrotate does
    log.info("still to the renamed file")
    reopen_log_files()
    log.info("after rotation")
    reset_logging()
    rotated = [json.loads(line)["msg"] for line in (tmp_path / "broker.log.1").read_text().splitlines()]
    fresh = [json.loads(line)["msg"] for line in path.read_text().splitlines()]
    assert rotated == ["before rotation", "still to the renamed file"]
    assert fresh == ["after rotation"]


def test_file_is_appended_not_truncated(tmp_path: pathlib.Path, log: logging.Logger) -> None:
    path = tmp_path / "broker.log"
    path.write_text("earlier line\n")
    configure_logging("info", "human", str(path))
    log.info("new line")
    reset_logging()
    lines = path.read_text().splitlines()
    assert lines[0] == "earlier line" and lines[1].endswith("new line")


def test_reopen_without_a_file_is_a_no_op() -> None:
    configured("human")
    reopen_log_files()
    reset_logging()
    reopen_log_files()


def test_reopen_failure_keeps_logging_to_the_old_file(tmp_path: pathlib.Path, log: logging.Logger) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / "broker.log"
    configure_logging("info", "human", path)
    path.rename(tmp_path / "broker.log.1")
    folder.rmdir()
    with pytest.raises(OSError):
        reopen_log_files()
    log.info("not lost")
    reset_logging()
    assert (tmp_path / "broker.log.1").read_text().rstrip().endswith("not lost")


async def test_reopen_from_the_trio_thread_while_a_worker_thread_logs(
    tmp_path: pathlib.Path, log: logging.Logger
) -> None:
    path = tmp_path / "broker.log"
    configure_logging("info", "human", path)
    total = 3000

    def worker() -> None:
        for i in range(total):
            log.info("line %d", i)

    thread = threading.Thread(target=worker)
    thread.start()
    rotations = 0
    while thread.is_alive():
        rotations += 1
        path.rename(tmp_path / f"broker.log.{rotations}")
        reopen_log_files()
        await trio.sleep(0.001)
    thread.join()
    reset_logging()

    seen: list[int] = []
    for file in tmp_path.glob("broker.log*"):
        for line in file.read_text().splitlines():
            match = HUMAN_LINE.fullmatch(line)
            assert match is not None, line  # no torn lines
            if match["logger"] != log.name:
                continue  # another thread of the test process logging (not ours to count)
            seen.append(int(match["rest"].removeprefix("line ")))
    assert sorted(seen) == list(range(total))

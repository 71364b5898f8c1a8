"""``ackbus lock``, ``ackbus locks`` and ``ackbus schedule`` against the real broker
(in process, through memory streams); ``lock`` runs a real command."""

from __future__ import annotations

import io
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import trio

from client.__main__ import run
from tests.support.app import MemoryBroker, TrioByteStream, open_memory_broker


@pytest.fixture
async def mb() -> AsyncIterator[MemoryBroker]:
    async with open_memory_broker() as broker:
        yield broker


async def cli(mb: MemoryBroker, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    async def open_stream(endpoint: object) -> TrioByteStream:
        return mb.connect_client()

    status = await run(list(argv), stdout=out, stderr=err, open_stream=open_stream, handle_signals=False)
    return status, out.getvalue(), err.getvalue()


def py(code: str) -> list[str]:
    return ["--", sys.executable, "-c", code]


async def test_lock_runs_the_command_with_its_token_and_exits_with_its_status(mb: MemoryBroker, tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    code = f"import os; open({str(seen)!r}, 'w').write(os.environ['ACKBUS_LOCK_TOKEN'] + ' ' + os.environ['ACKBUS_LOCK_NAME']); raise SystemExit(3)"
    status, _out, err = await cli(mb, "lock", "nightly", "--ttl", "10", *py(code))
    assert status == 3, err
    token, name = seen.read_text().split()
    assert int(token) >= 1 and name == "nightly"
    assert mb.runtime.core.lock_list() == []  # released


async def test_lock_held_by_another_exits_1_without_running(mb: MemoryBroker, tmp_path: Path) -> None:
    mb.runtime.core.lock_acquire(0, "nightly", "someone-else", 60, 0)
    ran = tmp_path / "ran"
    status, _out, err = await cli(mb, "lock", "nightly", "--wait", "0.2", *py(f"open({str(ran)!r}, 'w')"))
    assert status == 1 and "someone-else" in err and not ran.exists()
    status, out, _err = await cli(mb, "locks")
    assert "someone-else" in out and out.splitlines()[0].split()[:3] == ["name", "owner", "token"]
    status, out, _err = await cli(mb, "locks", "--json")
    assert orjson.loads(out.splitlines()[0])["owner"] == "someone-else"


async def test_a_lost_lock_stops_the_command_and_exits_6(mb: MemoryBroker, tmp_path: Path) -> None:
    started = tmp_path / "started"
    code = f"import time; open({str(started)!r}, 'w'); time.sleep(60)"
    result: list[tuple[int, str, str]] = []
    async with trio.open_nursery() as nursery:
        async def go() -> None:
            result.append(await cli(mb, "lock", "l", "--ttl", "1.5", "--owner", "me", *py(code)))

        nursery.start_soon(go)
        with trio.fail_after(30):
            while not started.exists():
                await trio.sleep(0.05)
        core = mb.runtime.core
        (lock,) = core.lock_list()
        core.lock_release("l", "me", lock["token"])
        core.lock_acquire(0, "l", "thief", 60, 0)
        mb.runtime.pump()
        with trio.fail_after(20):
            while not result:
                await trio.sleep(0.05)
    status, _out, err = result[0]
    assert status == 6 and "lost" in err


async def test_schedule_put_get_list_pause_resume_delete(mb: MemoryBroker) -> None:
    await cli(mb, "declare", "queue", "jobs")
    status, out, err = await cli(
        mb, "schedule", "put", "nightly", "--cron", "0 3 * * *", "--timezone", "Europe/Paris",
        "-k", "jobs", "--body", "run", "--header", "team=ops",
    )
    assert status == 0, err
    info = orjson.loads(out)
    assert info["cron"] == "0 3 * * *" and info["next_tick"].endswith("Z")
    status, out, _ = await cli(mb, "schedule", "list")
    assert [orjson.loads(line)["name"] for line in out.splitlines()] == ["nightly"]
    status, out, _ = await cli(mb, "schedule", "pause", "nightly")
    assert orjson.loads(out)["paused"] is True
    status, out, _ = await cli(mb, "schedule", "resume", "nightly")
    assert orjson.loads(out)["paused"] is False
    status, _out, _err = await cli(mb, "schedule", "delete", "nightly")
    assert status == 0
    status, _out, err = await cli(mb, "schedule", "get", "nightly")
    assert status == 1 and "not_found" in err


async def test_schedule_bad_cron_is_refused(mb: MemoryBroker) -> None:
    status, _out, err = await cli(mb, "schedule", "put", "s", "--cron", "0 3 * *", "-k", "jobs")
    assert status == 1 and "5 fields" in err
    status, _out, err = await cli(mb, "schedule", "put", "s", "--interval", "5", "--timezone", "Mars/Base")
    assert status == 1


async def test_lock_with_a_command_that_does_not_exist_is_a_usage_error(mb: MemoryBroker) -> None:
    status, _out, err = await cli(mb, "lock", "l", "--", "/nonexistent/command")
    assert status == 2 and "cannot run" in err
    assert mb.runtime.core.lock_list() == []
    status, _out, err = await cli(mb, "lock", "l")
    assert status == 2 and "give the command" in err

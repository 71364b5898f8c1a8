"""Checkpoints: atomic replacement, verification before use, fallback, crash safety."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.storage import (
    CorruptCheckpoint,
    LoadedCheckpoint,
    faults,
    read_latest_checkpoint,
    write_checkpoint,
)
from broker.storage.checkpoint import checkpoint_name
from broker.storage.testing import SimulatedCrash, SimulatedDisk

STATE_A = [(1, b"queue q1"), (2, b"message 1"), (2, b"")]
STATE_B = [(1, b"queue q1"), (1, b"queue q2"), (2, b"message 2" * 100)]


def read_all(
    data_dir: Path, fs: SimulatedDisk | None = None
) -> tuple[int, list[tuple[int, bytes]]] | None:
    loaded = read_latest_checkpoint(data_dir, fs=fs)
    if loaded is None:
        return None
    lsn, records = loaded
    return lsn, list(records)


def ckpt_dir(data_dir: Path) -> Path:
    return data_dir / "checkpoint"


def test_roundtrip(tmp_path: Path) -> None:
    info = write_checkpoint(tmp_path, 42, STATE_A)
    assert (info.lsn, info.records) == (42, 3)
    assert info.path == str(ckpt_dir(tmp_path) / checkpoint_name(42))
    assert info.size_bytes == os.path.getsize(info.path)
    loaded = read_latest_checkpoint(tmp_path)
    assert isinstance(loaded, LoadedCheckpoint)
    assert loaded.path == info.path
    lsn, records = loaded
    assert (lsn, list(records)) == (42, STATE_A)


def test_no_checkpoint(tmp_path: Path) -> None:
    assert read_latest_checkpoint(tmp_path) is None


def test_empty_state_and_generator_input(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 0, iter([]))
    assert read_all(tmp_path) == (0, [])

    def many() -> Iterator[tuple[int, bytes]]:
        for n in range(50_000):
            yield n % 256, b"%d" % n

    info = write_checkpoint(tmp_path, 7, many())
    assert info.records == 50_000
    result = read_all(tmp_path)
    assert result is not None and result[0] == 7
    assert result[1] == list(many())


def test_a_new_checkpoint_replaces_older_ones(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 10, STATE_A)
    info = write_checkpoint(tmp_path, 20, STATE_B)
    assert info.deleted == (str(ckpt_dir(tmp_path) / checkpoint_name(10)),)
    assert os.listdir(ckpt_dir(tmp_path)) == [checkpoint_name(20)]
    assert read_all(tmp_path) == (20, STATE_B)
    write_checkpoint(tmp_path, 20, STATE_A)  # same LSN: replaced atomically
    assert read_all(tmp_path) == (20, STATE_A)


def test_an_older_lsn_than_the_existing_checkpoint_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 20, STATE_A)
    with pytest.raises(ValueError, match="older"):
        write_checkpoint(tmp_path, 19, STATE_B)


def test_an_invalid_record_leaves_no_temporary_file(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 1, STATE_A)
    with pytest.raises(ValueError):
        write_checkpoint(tmp_path, 2, [(1, b"ok"), (999, b"bad type")])
    assert os.listdir(ckpt_dir(tmp_path)) == [checkpoint_name(1)]


def test_leftover_temporary_files_are_removed_at_start(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 5, STATE_A)
    leftover = ckpt_dir(tmp_path) / (checkpoint_name(9) + ".tmp")
    leftover.write_bytes(b"incomplete")
    assert read_all(tmp_path) == (5, STATE_A)
    assert not leftover.exists()


@pytest.mark.parametrize("damage", ["truncate", "flip-body", "flip-header", "flip-trailer", "tiny"])
def test_an_unreadable_newest_checkpoint_falls_back_loudly(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    write_checkpoint(tmp_path, 10, STATE_A)
    old = ckpt_dir(tmp_path) / checkpoint_name(10)
    kept = old.read_bytes()
    write_checkpoint(tmp_path, 20, STATE_B)
    old.write_bytes(kept)  # as if a crash had interrupted the deletion
    newest = ckpt_dir(tmp_path) / checkpoint_name(20)
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        del data[-7:]
    elif damage == "flip-body":
        data[len(data) // 2] ^= 1
    elif damage == "flip-header":
        data[3] ^= 1
    elif damage == "flip-trailer":
        data[-1] ^= 1
    else:
        del data[10:]
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="ackbus.storage"):
        loaded = read_latest_checkpoint(tmp_path)
    assert loaded is not None
    assert loaded.skipped == (str(newest) + ".corrupt",)
    assert (loaded.lsn, list(loaded.records)) == (10, STATE_A)
    assert "falling back" in caplog.text and str(newest) in caplog.text
    assert not newest.exists()
    # A later checkpoint is not blocked by the set-aside file.
    write_checkpoint(tmp_path, 15, STATE_B)
    assert read_all(tmp_path) == (15, STATE_B)


def test_an_unreadable_only_checkpoint_is_an_error(tmp_path: Path) -> None:
    info = write_checkpoint(tmp_path, 10, STATE_A)
    with open(info.path, "r+b") as file:
        file.truncate(info.size_bytes - 1)
    with pytest.raises(CorruptCheckpoint) as exc:
        read_latest_checkpoint(tmp_path)
    assert exc.value.path == info.path
    assert "no older checkpoint" in str(exc.value)


def test_a_checkpoint_changed_while_being_read_is_detected(tmp_path: Path) -> None:
    info = write_checkpoint(tmp_path, 3, STATE_B)
    loaded = read_latest_checkpoint(tmp_path)
    assert loaded is not None
    data = bytearray(Path(info.path).read_bytes())
    data[40] ^= 1
    Path(info.path).write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint):
        list(loaded.records)


# --------------------------------------------------------------------------- crashes

CHECKPOINT_KILL_POINTS = [
    "checkpoint.after_tmp_write",
    "checkpoint.before_rename",
    "checkpoint.after_rename",
]


@pytest.mark.parametrize("point", CHECKPOINT_KILL_POINTS)
@pytest.mark.parametrize("power_loss", [False, True])
def test_a_crash_at_any_step_leaves_a_whole_checkpoint(
    tmp_path: Path, point: str, power_loss: bool, crash_at_kill_points: None
) -> None:
    disk = SimulatedDisk()
    write_checkpoint(tmp_path, 10, STATE_A, fs=disk)
    faults.activate(point, count=1)
    with pytest.raises(SimulatedCrash):
        write_checkpoint(tmp_path, 20, STATE_B, fs=disk)
    if power_loss:
        disk.lose_power()
    else:
        disk.crash_process()
    result = read_all(tmp_path, fs=disk)
    if point == "checkpoint.after_rename" and not power_loss:
        assert result == (20, STATE_B)
    else:
        # After a power cut even the rename is gone: it was never made durable.
        assert result == (10, STATE_A)
    assert not any(name.endswith(".tmp") for name in os.listdir(ckpt_dir(tmp_path)))


def test_a_completed_checkpoint_survives_power_loss(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    write_checkpoint(tmp_path, 10, STATE_A, fs=disk)
    write_checkpoint(tmp_path, 20, STATE_B, fs=disk)
    disk.lose_power()
    assert read_all(tmp_path, fs=disk) == (20, STATE_B)

"""The ``FileSystem`` interface (``broker.storage.fs``) as the storage layer relies on
it, checked on the real file system and on ``broker.storage.testing.SimulatedDisk``
alike (one suite, run against each, in the manner of trio's
``testing/_check_streams.py``): the simulated disk the power-loss tests run on must
behave as the real one does while the power stays on.

What happens at a power cut is the simulated disk's alone (the real one cannot be
unplugged from a test): those tests run against it only, at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.storage.fs import OS_FILE_SYSTEM, FileSystem
from broker.storage.testing import SimulatedDisk


@pytest.fixture(params=["os", "simulated"], ids=["OS_FILE_SYSTEM", "SimulatedDisk"])
def fs(request: pytest.FixtureRequest) -> FileSystem:
    if request.param == "os":
        return OS_FILE_SYSTEM
    return SimulatedDisk()


def _read(fs: FileSystem, path: str) -> bytes:
    with fs.open_read(path) as file:
        return file.read()


# -- files ---------------------------------------------------------------------------------


def test_create_write_and_read_back(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    file = fs.create(path)
    assert file.path == path
    file.write(b"hello ")
    file.write_parts([b"wor", memoryview(b"ld"), b""])
    file.sync()
    file.close()
    file.close()  # idempotent
    assert _read(fs, path) == b"hello world"
    assert fs.getsize(path) == 11
    assert fs.exists(path)


def test_create_truncates_an_existing_file(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    with open(path, "wb") as file:
        file.write(b"old contents")
    new = fs.create(path)
    new.write(b"new")
    new.close()
    assert _read(fs, path) == b"new"


def test_open_append_writes_at_the_end(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    first = fs.create(path)
    first.write(b"abc")
    first.sync()
    first.close()
    again = fs.open_append(path)
    again.write(b"def")
    again.close()
    assert _read(fs, path) == b"abcdef"


def test_open_append_and_getsize_of_a_missing_file_raise(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "missing")
    assert not fs.exists(path)
    with pytest.raises(FileNotFoundError):
        fs.open_append(path)
    with pytest.raises(FileNotFoundError):
        fs.getsize(path)
    with pytest.raises(FileNotFoundError):
        fs.open_read(path)


def test_an_open_file_truncated_takes_later_writes_at_its_new_end(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    file = fs.create(path)
    file.write(b"0123456789")
    file.truncate(4)
    file.write(b"xy")
    file.close()
    assert _read(fs, path) == b"0123xy"


def test_preallocated_space_reads_as_zeros_and_writes_go_on_after_the_data(
    fs: FileSystem, tmp_path: Path
) -> None:
    path = str(tmp_path / "f")
    file = fs.create(path)
    file.write(b"abc")
    file.preallocate(64)
    assert fs.getsize(path) == 64
    file.write(b"def")
    file.sync()
    file.close()
    assert _read(fs, path) == b"abcdef" + bytes(58)


def test_truncate_by_path(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    file = fs.create(path)
    file.write(b"0123456789")
    file.close()
    fs.truncate(path, 3)
    assert _read(fs, path) == b"012"
    assert fs.getsize(path) == 3


# -- directories -------------------------------------------------------------------------


def test_makedirs_makes_parents_and_may_be_repeated(fs: FileSystem, tmp_path: Path) -> None:
    deep = str(tmp_path / "a" / "b" / "c")
    fs.makedirs(deep)
    fs.makedirs(deep)
    assert os.path.isdir(deep) and fs.exists(deep)
    fs.sync_dir(deep)


def test_listdir_names_the_entries_and_a_missing_directory_is_empty(fs: FileSystem, tmp_path: Path) -> None:
    assert fs.listdir(str(tmp_path / "nowhere")) == []
    for name in ("x", "y"):
        fs.create(str(tmp_path / name)).close()
    fs.makedirs(str(tmp_path / "sub"))
    assert sorted(fs.listdir(str(tmp_path))) == ["sub", "x", "y"]


def test_rename_replaces_the_destination(fs: FileSystem, tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    for path, data in ((src, b"new"), (dst, b"old")):
        file = fs.create(path)
        file.write(data)
        file.close()
    fs.rename(src, dst)
    fs.sync_dir(str(tmp_path))
    assert not fs.exists(src)
    assert _read(fs, dst) == b"new"
    assert fs.listdir(str(tmp_path)) == ["dst"]


def test_remove_deletes_and_a_missing_file_raises(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    fs.create(path).close()
    fs.remove(path)
    fs.sync_dir(str(tmp_path))
    assert not fs.exists(path)
    with pytest.raises(FileNotFoundError):
        fs.remove(path)


# -- power loss: the simulated disk only ------------------------------------------------


def test_a_power_cut_keeps_synced_data_and_durable_entries_only(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    synced, unsynced, unlisted = (str(tmp_path / n) for n in ("synced", "unsynced", "unlisted"))
    file = disk.create(synced)
    file.write(b"kept")
    file.sync()
    file.write(b" lost")
    other = disk.create(unsynced)
    other.write(b"never synced")
    disk.sync_dir(str(tmp_path))  # both names durable; only "synced" has durable data
    late = disk.create(unlisted)
    late.write(b"x")
    late.sync()  # data synced, but its name never was
    disk.lose_power()
    assert _read(disk, synced) == b"kept"
    assert _read(disk, unsynced) == b""
    assert not disk.exists(unlisted)


def test_a_rename_not_made_durable_is_undone_by_a_power_cut(tmp_path: Path) -> None:
    disk = SimulatedDisk()
    src, dst = str(tmp_path / "tmp"), str(tmp_path / "final")
    file = disk.create(src)
    file.write(b"data")
    file.sync()
    disk.sync_dir(str(tmp_path))
    disk.rename(src, dst)
    disk.lose_power()
    assert disk.exists(src) and not disk.exists(dst)
    assert _read(disk, src) == b"data"

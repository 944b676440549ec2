"""The one atomic write: whole file or old file, umask mode, no debris, used by storage and staging."""

from __future__ import annotations

import json
import os
import stat

import pytest

from zephon_store._util import atomic
from zephon_store._util.atomic import atomic_write, publish_file
from zephon_store.io.storage import Storage
from zephon_store.write.staging import atomic_write_json


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o640
    os.umask(old)


def test_atomic_write_replaces_whole_with_umask_mode(tmp_path, umask_027):
    target = tmp_path / "sub" / "f.bin"
    atomic_write(str(target), b"old")
    atomic_write(str(target), memoryview(b"new bytes"))
    assert target.read_bytes() == b"new bytes"
    assert _mode(target) == umask_027
    assert os.listdir(target.parent) == ["f.bin"]


def test_atomic_write_failure_keeps_old_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    atomic_write(str(target), b"old")

    def boom(*a):
        raise OSError("disk full")
    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(str(target), b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_atomic_write_fsyncs_file_and_directory(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(atomic.os, "fsync", spy)
    atomic_write(str(tmp_path / "f.bin"), b"x")
    assert synced[-1] == os.path.realpath(tmp_path)
    assert synced[0].startswith(os.path.realpath(tmp_path / ".f.bin."))


@pytest.mark.parametrize("move", [True, False])
def test_publish_file_move_or_copy(tmp_path, umask_027, move):
    src = tmp_path / "staged"
    src.write_bytes(b"shard")
    os.chmod(src, 0o600)
    publish_file(str(src), str(tmp_path / "out" / "s.parquet"), move=move)
    assert (tmp_path / "out" / "s.parquet").read_bytes() == b"shard"
    assert _mode(tmp_path / "out" / "s.parquet") == umask_027
    assert src.exists() is not move
    assert os.listdir(tmp_path / "out") == ["s.parquet"]


def test_publish_file_missing_source_leaves_no_temp(tmp_path):
    with pytest.raises(FileNotFoundError):
        publish_file(str(tmp_path / "absent"), str(tmp_path / "out" / "s"), move=False)
    assert os.listdir(tmp_path / "out") == []


def test_storage_and_staging_write_through_it(tmp_path, monkeypatch, umask_027):
    calls = []
    real = atomic.atomic_write

    def spy(target, data):
        calls.append(os.path.basename(target))
        real(target, data)
    monkeypatch.setattr("zephon_store.io.storage.atomic_write", spy)
    monkeypatch.setattr("zephon_store.write.staging.atomic_write", spy)
    Storage(str(tmp_path / "ds")).write_atomic("manifest.json", b"{}")
    atomic_write_json(str(tmp_path / "meta.json"), {"b": 1, "a": [2]})
    assert calls == ["manifest.json", "meta.json"]
    assert (tmp_path / "meta.json").read_bytes() == json.dumps({"a": [2], "b": 1}).encode()
    assert _mode(tmp_path / "meta.json") == _mode(tmp_path / "ds" / "manifest.json") == umask_027

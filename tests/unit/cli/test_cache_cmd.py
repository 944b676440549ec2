"""``zephon cache fill|info|clear`` as a user meets them: what a fill tells about how a job
reads what it filled, bad budgets as usage errors, and the remote-output scratch files of
killed conversions (main() called directly)."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import converted
from zephon_store import open_dataset
from zephon_store.cli.main import main
from zephon_store.read.decoded_disk import ENV_BUDGET, ENV_DIR


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("cache_cmd"), files=1, records=60, seed=5,
                     row_group_rows=20)


def test_fill_says_how_a_job_reads_it_and_warns_when_this_environment_would_not(
        ds_path, tmp_path, capsys, monkeypatch):
    """Issue 29, item 8: the default loader reads a decoded cache only where
    $ZEPHON_DECODED_CACHE_DIR names it; a fill says so, with the folder it filled."""
    monkeypatch.delenv(ENV_DIR, raising=False)
    monkeypatch.delenv(ENV_BUDGET, raising=False)
    filled = str(tmp_path / "c" / "decoded")
    assert main(["cache", "fill", ds_path, "--dir", str(tmp_path / "c")]) == 0
    out, err = capsys.readouterr()
    assert f"ZEPHON_DECODED_CACHE_DIR={filled}" in out and f"decoded_cache={filled!r}" in out
    assert len(err.strip().splitlines()) == 1 and "warning" in err
    assert "ZEPHON_DECODED_CACHE_DIR is not set" in err and "reads no decoded cache" in err

    # The environment names another folder: the warning names both.
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "elsewhere"))
    assert main(["cache", "fill", ds_path, "--dir", str(tmp_path / "c"), "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["job_env"] == {ENV_DIR: filled} and doc["jobs_here_read_it"] is False
    assert str(tmp_path / "elsewhere") in doc["warning"] and filled in doc["warning"]
    assert doc["complete"] and doc["present"] == doc["row_groups"]

    # The environment a job gets from this shell reads it: no warning, and a job reads it.
    monkeypatch.setenv(ENV_DIR, filled)
    assert main(["cache", "fill", ds_path, "--budget", "64MiB", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["decoded_dir"] == filled and doc["jobs_here_read_it"] and doc["warning"] is None
    assert doc["job_env"] == {ENV_DIR: filled, ENV_BUDGET: str(64 << 20)} and not err
    ds = open_dataset(ds_path)
    for rg in range(ds.manifest.num_row_groups):
        ds.row_groups.read(rg)
    assert ds.decoded_cache.stats.hits == ds.manifest.num_row_groups


@pytest.mark.parametrize("budget", ["0", "0B", "-5", "lots", "", "1e400", "nan"])
def test_fill_with_a_bad_budget_is_a_one_line_usage_error(ds_path, tmp_path, capsys, budget):
    assert main(["cache", "fill", ds_path, "--dir", str(tmp_path / "c"),
                 "--budget", budget]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--budget" in err and repr(budget) in err
    assert not os.path.exists(tmp_path / "c")          # nothing filled


def test_budget_belongs_to_fill_only(tmp_path, capsys):
    assert main(["cache", "info", "--dir", str(tmp_path / "c"), "--budget", "1GiB"]) == 2
    assert "--budget" in capsys.readouterr().err


_SCRATCH_CHILD = """
import sys
from zephon_store.write.staging import StagingArea
area = StagingArea("s3://bucket/out/.zephon-staging/job")   # remote: scratch is local
path = area.scratch("parsed/000000.arrow")
with open(path, "wb") as f:
    f.write(b"x" * int(sys.argv[1]))
print(path, flush=True)
sys.stdin.readline()            # live until told to finish (or killed)
with open(path, "ab") as f:     # its scratch is still there to write into
    f.write(b"y")
"""


def _scratch_child(env, size: int):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", _SCRATCH_CHILD, str(size)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = []

    def read():
        line.append(p.stdout.readline().strip())

    import threading

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(120)       # a child that never prints fails the test, not hangs it
    if not line or not line[0]:
        p.kill()
        pytest.fail("the scratch-writing child printed no path")
    return p, line[0]


def test_cache_info_and_clear_know_the_scratch_files_of_killed_conversions(
        tmp_path, capsys, monkeypatch):
    """Issue 29, item 10: a convert into a remote output killed mid-stage leaves its local
    scratch files in the system temp folder; `cache info` counts them, `cache clear` removes
    them and never those of a live convert, and the next convert on the host reclaims them."""
    import signal
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    env = dict(os.environ, TMPDIR=str(tmp))
    cache = ["--dir", str(tmp_path / "c"), "--json"]
    live, live_file = _scratch_child(env, 1000)
    killed, killed_file = _scratch_child(env, 500)
    killed.send_signal(signal.SIGKILL)
    killed.wait(60)
    scratch = tmp / "zephon-scratch"
    # A file of the first layout (no folder of its own) by a process that is gone.
    first = scratch / f"parsed-000001.arrow.{killed.pid}.0123abcd.tmp"
    first.write_bytes(b"z" * 30)
    try:
        assert main(["cache", "info", *cache]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["scratch_dir"] == str(scratch)
        assert (info["scratch_files"], info["scratch_bytes"], info["scratch_in_use"]) == (
            3, 1530, 1)
        assert main(["cache", "clear", *cache]) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["cleared_scratch_files"], out["cleared_scratch_bytes"],
                out["scratch_in_use"]) == (2, 530, 1)
        assert os.path.exists(live_file) and not os.path.exists(killed_file)
        assert not first.exists()
        assert main(["cache", "clear"]) == 0       # the text form says what it kept
        assert "1 in use by a running convert, kept" in capsys.readouterr().out
        live.stdin.write("go\n")
        live.stdin.flush()
        assert live.wait(60) == 0
    finally:
        live.kill()
    # A finished process leaves nothing; a killed one is reclaimed by the next one to write.
    assert not os.path.exists(os.path.dirname(live_file))
    again, again_file = _scratch_child(env, 10)
    again.kill()
    again.wait(60)
    assert os.path.exists(again_file)
    later, _ = _scratch_child(env, 10)
    later.kill()
    later.wait(60)
    assert not os.path.exists(again_file)


def test_fill_replaces_a_misplaced_entry_and_says_so(ds_path, tmp_path, capsys):
    """Issue 29, item 14: a fill over a cache where one entry was copied onto another key's
    name used to call the cache complete and leave it to be served; it is replaced."""
    import shutil

    from zephon_store import DecodedDiskCache

    argv = ["cache", "fill", ds_path, "--dir", str(tmp_path / "c"), "--json"]
    assert main(argv) == 0
    capsys.readouterr()
    cache = DecodedDiskCache(tmp_path / "c" / "decoded")
    ds = open_dataset(ds_path, decoded_cache=cache)
    shutil.copyfile(cache._store.entry_path(ds.row_groups.decoded_key(1)),
                    cache._store.entry_path(ds.row_groups.decoded_key(0)))
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dropped"] == 1 and out["decoded"] == 1 and out["complete"]
    want = open_dataset(ds_path, decoded_cache=False).row_groups.read(0)
    assert ds.row_groups.read(0).equals(want)

"""``zephon cache fill|info|clear`` as a user meets them: what a fill tells about how a job
reads what it filled, bad budgets as usage errors, and the remote-output scratch files of
killed conversions (main() called directly)."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import write_jsonl_corpus
from zephon_store import convert, open_dataset
from zephon_store.cli.main import main
from zephon_store.read.decoded_disk import ENV_BUDGET, ENV_DIR
from zephon_store.write.shardwriter import WriteOptions


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("cache_cmd")
    write_jsonl_corpus(d / "src", files=1, records=60, seed=5)
    convert([str(d / "src")], str(d / "ds"), options=WriteOptions(row_group_rows=20))
    return str(d / "ds")


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

"""Conversion: round trip, determinism across workers, crash + resume, bad input."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from tests.helpers import tree_digest, write_jsonl_corpus
from zephon_store import InputError, convert, open_dataset
from zephon_store.ingest import InputOptions
from zephon_store.read.verify import verify
from zephon_store.write.shardwriter import WriteOptions

SMALL = WriteOptions(target_shard_bytes=48 << 10, row_group_bytes=8 << 10)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    records = write_jsonl_corpus(d, files=5, records=400, suffix=".jsonl.zst")
    return d, records


def test_round_trip_record_by_record(corpus, tmp_path):
    src, records = corpus
    res = convert([str(src / "*.jsonl.zst")], str(tmp_path / "ds"), options=SMALL)
    assert res.num_samples == len(records) and res.num_shards > 3
    ds = open_dataset(str(tmp_path / "ds"))
    got = ds.take(range(ds.num_samples)).to_pylist()
    assert got == records
    assert ds[17] == records[17]
    assert verify(str(tmp_path / "ds"), deep=True).ok


@pytest.mark.parametrize("workers", [2, 4])
def test_byte_identical_for_any_worker_count(corpus, tmp_path, workers):
    src, _ = corpus
    convert([str(src)], str(tmp_path / "w1"), options=SMALL, workers=1)
    convert([str(src)], str(tmp_path / "wn"), options=SMALL, workers=workers)
    a, b = tree_digest(tmp_path / "w1"), tree_digest(tmp_path / "wn")
    assert a == b and len(a) > 5


def test_rerun_reuses_everything(corpus, tmp_path):
    src, _ = corpus
    first = convert([str(src)], str(tmp_path / "ds"), options=SMALL)
    before = tree_digest(tmp_path / "ds")
    again = convert([str(src)], str(tmp_path / "ds"), options=SMALL)
    assert again.dataset_id == first.dataset_id and tree_digest(tmp_path / "ds") == before


def test_manifest_records_provenance_and_options(corpus, tmp_path):
    src, records = corpus
    convert([str(src)], str(tmp_path / "ds"), options=SMALL)
    ds = open_dataset(str(tmp_path / "ds"))
    prov = ds.manifest.tables["provenance"].to_pylist()
    assert sorted({p["input"] for p in prov}) == [f"part-{k:03d}.jsonl.zst" for k in range(5)]
    assert sum(p["num_rows"] for p in prov) == len(records)
    for p in prov:  # every piece maps input rows to the shard that holds them
        assert ds.manifest.shard_row_start[p["shard"]] <= p["row_start"]
        first = ds.take([p["row_start"]]).to_pylist()[0]
        k = int(p["input"][5:8])
        assert first == records[k * 400 + p["input_row_start"]]
    assert ds.manifest.doc["writer"]["target_shard_bytes"] == SMALL.target_shard_bytes


def _cli(*args, check=True, **kw):
    return subprocess.run([sys.executable, "-m", "zephon_store.cli.main", *args],
                          capture_output=True, text=True, check=check, **kw)


def test_killed_at_random_points_then_resumed_gives_identical_output(tmp_path):
    src = tmp_path / "src"
    write_jsonl_corpus(src, files=8, records=600, seed=3, suffix=".jsonl.gz")
    args = ["convert", str(src), "--target-shard-size", "32KiB", "--row-group-size", "4KiB", "--json"]
    _cli(*args, "--output", str(tmp_path / "ref"))
    ref = tree_digest(tmp_path / "ref")
    rng = random.Random(11)
    for attempt in range(4):
        out = tmp_path / f"out{attempt}"
        for _ in range(3):  # kill it up to three times before letting it finish
            p = subprocess.Popen([sys.executable, "-m", "zephon_store.cli.main", *args,
                                  "--output", str(out), "--workers", "2"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:     # killed at a random point, unless it finished before (then no wait)
                p.wait(timeout=rng.uniform(0.3, 2.5))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if (out / "manifest.json").exists():
                # a manifest is only ever published complete
                assert verify(str(out)).ok
        _cli(*args, "--output", str(out), "--workers", "2")
        assert tree_digest(out) == ref
        assert not (out / ".zephon-staging").exists() or not os.listdir(out / ".zephon-staging")


def test_malformed_json_names_file_and_line(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    (src / "b.jsonl").write_text('{"x": 3}\n{"x": 4,,}\n{"x": 5}\n')
    with pytest.raises(InputError) as e:
        convert([str(src)], str(tmp_path / "ds"))
    assert "b.jsonl" in str(e.value) and "line 2" in str(e.value)
    assert not (tmp_path / "ds" / "manifest.json").exists()
    res = convert([str(src)], str(tmp_path / "ds"),
                  input_options=InputOptions(on_error="skip"))
    assert res.num_samples == 4 and res.skipped.get("malformed_json") == 1
    ds = open_dataset(str(tmp_path / "ds"))
    assert ds.take(range(4)).column("x").to_pylist() == [1, 2, 3, 5]
    assert ds.manifest.doc["skipped"]["malformed_json"] == 1


def test_empty_input_is_an_error_naming_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"x": 1}\n')
    (src / "empty.jsonl").write_text("")
    with pytest.raises(InputError, match="empty.jsonl.*no records"):
        convert([str(src)], str(tmp_path / "ds"))


def test_missing_input_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        convert([str(tmp_path / "nope*.jsonl")], str(tmp_path / "ds"))


def test_schema_drift_unifies_or_names_both_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"x": 1, "y": "a"}\n')
    (src / "b.jsonl").write_text('{"x": 2}\n')
    res = convert([str(src)], str(tmp_path / "ok"))
    assert open_dataset(str(tmp_path / "ok")).take([0, 1]).to_pylist() == [
        {"x": 1, "y": "a"}, {"x": 2, "y": None}]
    assert res.num_samples == 2
    (src / "c.jsonl").write_text('{"x": "three"}\n')
    with pytest.raises(InputError) as e:
        convert([str(src)], str(tmp_path / "bad"))
    msg = str(e.value)
    assert "'x'" in msg and "c.jsonl" in msg and ("a.jsonl" in msg or "b.jsonl" in msg)


def test_cli_convert_json_summary(corpus, tmp_path):
    src, records = corpus
    r = _cli("convert", str(src), "--output", str(tmp_path / "ds"), "--json", "--target-shard-size",
             "64KiB", "--row-group-size", "100rows")
    summary = json.loads(r.stdout)
    assert summary["num_samples"] == len(records)
    ds = open_dataset(str(tmp_path / "ds"))
    assert set(ds.manifest.rg_rows[:-1].tolist()) == {100}

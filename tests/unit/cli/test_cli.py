"""The CLI: info, get, plan, cache, usage errors and exit codes (main() called directly)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import converted, write_jsonl_corpus
from zephon_store import open_dataset
from zephon_store.cli.main import main
from zephon_store.format.manifest import FORMAT_VERSION
from zephon_store.order import Order, OrderOptions


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("cli"), files=2, records=300, seed=2,
                     target_shard_bytes=20 << 10, row_group_rows=25)


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_info_json(ds_path, capsys):
    assert main(["info", ds_path, "--json"]) == 0
    info = _json(capsys)
    ds = open_dataset(ds_path)
    assert info["dataset_id"] == ds.dataset_id and info["num_samples"] == 600
    assert info["num_shards"] == ds.num_shards and info["num_row_groups"] == 24
    assert [f["name"] for f in info["schema"]] == ["id", "text", "score", "tags"]
    assert info["codecs"] == ds.manifest.codecs    # the default, compression="auto"
    assert set(info["codecs"]) == {"id", "text", "score", "tags"}
    assert main(["info", ds_path]) == 0
    text = capsys.readouterr().out
    assert ds.dataset_id in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("codecs")]
    assert "text: " in line and " x" in line


def test_get_json_lines_in_request_order(ds_path, capsys):
    assert main(["get", ds_path, "599", "0", "42", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [599, 0, 42]


def test_get_out_of_range_is_a_usage_error_naming_the_range(ds_path, capsys):
    assert main(["get", ds_path, "600"]) == 2
    assert "0..599" in capsys.readouterr().err


def test_plan_json_is_the_pure_function(ds_path, capsys):
    assert main(["plan", ds_path, "--world-size", "3", "--global-batch", "12", "--steps", "2:5",
                 "--seed", "4", "--json"]) == 0
    out = _json(capsys)
    assert {"dataset_id", "world_size", "global_batch", "steps", "read_amplification"} <= set(out)
    order = Order(open_dataset(ds_path).manifest.rg_rows, OrderOptions(seed=4))
    for st in out["steps"]:
        assert st["cursor"] == st["step"] * 12
        got = sorted(i for ids in st["ranks"] for i in ids)
        want = sorted(order.sample_at(np.arange(st["cursor"], st["cursor"] + 12)).tolist())
        assert got == want and all(len(ids) == 4 for ids in st["ranks"])
    assert out["read_amplification"] >= 1.0
    assert main(["plan", ds_path, "--world-size", "3", "--global-batch", "12", "--cursor", "36",
                 "--steps", "0:1", "--seed", "4", "--json"]) == 0
    assert _json(capsys)["steps"][0]["cursor"] == 36


def test_plan_rejects_indivisible_batch(ds_path, capsys):
    assert main(["plan", ds_path, "--world-size", "5", "--global-batch", "12"]) == 2
    assert "world_size must divide global_batch" in capsys.readouterr().err


def test_cache_info_and_clear(tmp_path, capsys):
    from zephon_store._util.hashing import xxh3_hex
    from zephon_store.io.cache import ChunkCache

    cache = ChunkCache(str(tmp_path / "c"))
    cache.put(xxh3_hex(b"abc"), b"abc")
    assert main(["cache", "info", "--dir", str(tmp_path / "c"), "--json"]) == 0
    info = _json(capsys)
    assert info["entries"] == 1 and info["bytes"] == 3 and info["decoded_entries"] == 0
    import pyarrow as pa

    from zephon_store.read.decoded_disk import DecodedDiskCache

    DecodedDiskCache(str(tmp_path / "c" / "decoded")).put("ab" * 16, pa.table({"a": [1]}))
    assert main(["cache", "info", "--dir", str(tmp_path / "c"), "--json"]) == 0
    info = _json(capsys)
    assert info["decoded_entries"] == 1 and info["decoded_dir"] == str(tmp_path / "c" / "decoded")
    assert main(["cache", "clear", "--dir", str(tmp_path / "c"), "--json"]) == 0
    out = _json(capsys)
    assert out["cleared_bytes"] == 3 and out["cleared_decoded_bytes"] == info["decoded_bytes"] > 0


@pytest.mark.parametrize("argv", [
    ["convert", "x.jsonl", "--output", "o", "--target-shard-size", "lots"],
    ["convert", "x.jsonl"],
    ["verify"],
    ["frobnicate"],
    ["convert", "x.jsonl", "--output", "o", "--row-group-size", "0rows"],
])
def test_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2


def test_missing_dataset_is_an_error_exit_1(tmp_path, capsys):
    assert main(["info", str(tmp_path / "nothing")]) == 1
    assert "not found" in capsys.readouterr().err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert "zephon_store" in capsys.readouterr().out


@pytest.mark.parametrize("flag,want", [(None, "auto"), ("on", True), ("off", False)])
def test_convert_dictionary_flag(tmp_path, capsys, flag, want):
    write_jsonl_corpus(tmp_path / "src", files=1, records=40, seed=3)
    argv = ["convert", str(tmp_path / "src"), "--output", str(tmp_path / "ds"), "--json"]
    if flag:
        argv += ["--dictionary", flag]
    assert main(argv) == 0
    capsys.readouterr()
    assert open_dataset(str(tmp_path / "ds")).manifest.doc["writer"]["use_dictionary"] == want


def test_convert_into_another_dataset_needs_overwrite(tmp_path, capsys):
    write_jsonl_corpus(tmp_path / "a", files=1, records=30, seed=1)
    write_jsonl_corpus(tmp_path / "b", files=1, records=40, seed=2)
    out = str(tmp_path / "ds")
    assert main(["convert", str(tmp_path / "a"), "--output", out, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["dataset_id"]
    assert main(["convert", str(tmp_path / "b"), "--output", out, "--json"]) == 1
    err = capsys.readouterr().err
    assert "--overwrite" in err and first in err and len(err.strip().splitlines()) == 1
    assert main(["convert", str(tmp_path / "b"), "--output", out, "--overwrite", "--json"]) == 0
    capsys.readouterr()
    assert open_dataset(out).num_samples == 40
    assert main(["gc", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == []  # nothing of 'a' was left


def test_cache_fill_decodes_a_dataset_ahead_of_a_job(ds_path, tmp_path, capsys):
    from zephon_store.read.decoded_disk import DecodedDiskCache

    cache_dir = str(tmp_path / "c")
    assert main(["cache", "fill", ds_path, "--dir", cache_dir, "--json"]) == 0
    out = _json(capsys)
    n = open_dataset(ds_path).manifest.num_row_groups
    assert out["complete"] and out["filled"] == out["decoded"] == n and out["present"] == 0
    assert main(["cache", "fill", ds_path, "--dir", cache_dir, "--json"]) == 0
    assert _json(capsys)["present"] == n                      # a second fill decodes nothing
    reader = DecodedDiskCache(tmp_path / "c" / "decoded")
    ds = open_dataset(ds_path, decoded_cache=reader)
    for rg in range(n):
        ds.row_groups.read(rg)
    assert reader.stats.hits == n and reader.stats.misses == 0

    # A budget of about four entries: the fill stops, and says how many are there.
    per_entry = reader.info()["bytes"] // n
    small = str(tmp_path / "small")
    argv = ["cache", "fill", ds_path, "--dir", small, "--budget", str(4 * per_entry), "--json"]
    assert main(argv) == 0
    out = _json(capsys)
    held = DecodedDiskCache(tmp_path / "small" / "decoded").info()["entries"]
    assert not out["complete"] and 0 < out["filled"] == held <= 4
    tiny = str(tmp_path / "tiny")
    assert main(["cache", "fill", ds_path, "--dir", tiny, "--budget", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"0 of {n} row groups") and "pass a larger --budget" in text


@pytest.mark.parametrize("argv, says", [
    (["cache", "fill"], "needs the dataset URL"),
    (["cache", "info", "somewhere"], "takes no dataset URL"),
])
def test_cache_fill_needs_a_url_and_info_takes_none(argv, says, capsys):
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_info_text_lists_what_the_docs_list(ds_path, tmp_path, capsys):
    # docs/cli.md: format version, writer options, inputs and skip counts, besides the totals.
    assert main(["info", ds_path]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert lines["format"].split()[-1] == str(FORMAT_VERSION)
    assert "compression=auto" in lines["writer"] and "row_group_rows=25" in lines["writer"]
    assert lines["inputs"].startswith("inputs    2 files,")
    assert lines["skipped"].endswith("none")
    # One shard is "1 shard", not "1 shards".
    (tmp_path / "one.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    assert main(["convert", str(tmp_path / "one.jsonl"), "-o", str(tmp_path / "one")]) == 0
    assert "in 1 shard (" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "one")]) == 0
    assert "shards    1 shard (1 row group," in capsys.readouterr().out

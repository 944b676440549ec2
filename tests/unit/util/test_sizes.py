"""One size convention through every entry point: 20G = 20GB = 20 * 10**9, 20GiB = 20 * 2**30."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_store._util.sizes import parse_size
from zephon_store.cli.main import build_parser, main
from zephon_store.io.cache import ChunkCache, default_budget_bytes
from zephon_store.write.shardwriter import WriteOptions

EXPECTED = {"20G": 20_000_000_000, "20GB": 20_000_000_000, "20gb": 20_000_000_000,
            "20GiB": 21_474_836_480, "20gib": 21_474_836_480, "1.5k": 1500, "1.5KiB": 1536,
            "3T": 3 * 10**12, "3TiB": 3 << 40, "512": 512, " 512 B ": 512, "7M": 7_000_000,
            "7MiB": 7 << 20}


@pytest.mark.parametrize("text,expected", sorted(EXPECTED.items()))
def test_parse_size_one_convention(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "", "20 GiBs", "-1G", "1e9", "20Gi", None, True])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="not a byte size"):
        parse_size(text)


@pytest.mark.parametrize("text", ["20G", "20GB", "20GiB"])
def test_every_entry_point_reads_the_same_number(text, tmp_path, monkeypatch):
    expected = EXPECTED[text]
    # CLI flag
    args = build_parser().parse_args(["convert", "x.jsonl", "--output", "o",
                                      "--target-shard-size", text, "--row-group-size", text])
    assert args.target_shard_size == expected
    assert args.row_group_size == (expected, None)
    # environment variable of the cache budget
    monkeypatch.setenv("ZEPHON_CACHE_BUDGET", text)
    assert default_budget_bytes() == expected
    assert ChunkCache(tmp_path / "c").budget_bytes == expected
    # API options
    assert ChunkCache(tmp_path / "d", budget_bytes=text).budget_bytes == expected
    opts = WriteOptions(target_shard_bytes=text, row_group_bytes=text, data_page_size=text)
    assert (opts.target_shard_bytes, opts.row_group_bytes, opts.data_page_size) == (expected,) * 3
    assert opts == WriteOptions(target_shard_bytes=expected, row_group_bytes=expected,
                                data_page_size=expected)


def test_cli_size_error_is_a_usage_error(capsys):
    assert main(["convert", "x.jsonl", "--output", "o", "--target-shard-size", "lots"]) == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err


def test_cli_decimal_shard_size_reaches_the_manifest(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": "x" * 50, "i": i}) + "\n" for i in range(200)))
    out = tmp_path / "out"
    assert main(["convert", str(src), "--output", str(out), "--target-shard-size", "4k",
                 "--row-group-size", "1KiB", "--json"]) == 0
    writer = json.loads((out / "manifest.json").read_text())["writer"]
    assert (writer["target_shard_bytes"], writer["row_group_bytes"]) == (4000, 1024)
    shards = sorted((out / "shards").iterdir())
    assert len(shards) > 1
    assert sum(pq.read_metadata(s).num_rows for s in shards) == 200
    assert isinstance(pq.read_table(shards[0]), pa.Table)

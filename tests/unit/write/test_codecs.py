"""compression="auto": a codec per column chosen from the shard's own rows (issue 32;
formats/SPEC.md, "Compression"), recorded in the manifest, overridden by a named codec."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_store import WriteOptions, convert, open_dataset
from zephon_store.read.verify import verify
from zephon_store.write import shardwriter
from zephon_store.write.shardwriter import choose_codecs


def _table(n: int = 2000) -> pa.Table:
    rng = np.random.default_rng(7)
    zipf = np.minimum(rng.zipf(1.3, (n, 64)), 50_000).astype(np.int32)
    return pa.table({
        "text": [f"doc {i}: " + "lorem ipsum dolor sit amet " * (1 + i % 5) for i in range(n)],
        "noise": pa.array(rng.integers(0, 2**63, n), pa.int64()),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 8, np.float32)), 8),
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(zipf.reshape(-1)), 64),
        "digest": [hashlib.sha256(str(i).encode()).digest() for i in range(n)],
        "lang": [["en", "de"][i % 2] for i in range(n)],
    })


def _convert(tmp_path, table, name="ds", **kw):
    src = tmp_path / f"{name}.parquet"
    pq.write_table(table, src)
    out = tmp_path / name
    convert([str(src)], str(out), options=WriteOptions(row_group_rows=500, **kw),
            progress=False)
    return out


def _footer_codecs(root) -> set[tuple[str, str]]:
    m = open_dataset(str(root)).manifest
    out = set()
    for i in range(m.num_shards):
        md = pq.ParquetFile(root / m.shard_path(i)).metadata
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            out |= {(rg.column(c).path_in_schema, rg.column(c).compression)
                    for c in range(md.num_columns)}
    return out


def test_rule_compresses_what_shrinks_and_stores_noise_plain():
    """Text that compresses at zstd level 6 (format v5), every other column that compresses
    at level 1; what does not shrink (random ids, floats, digests) uncompressed."""
    assert choose_codecs(_table()) == {"text": "zstd-6", "noise": "none", "emb": "none",
                                       "tokens": "zstd-1", "digest": "none", "lang": "zstd-6"}


def _windows(n: int = 300, width: int = 512) -> pa.Table:
    """Token windows like a real corpus's: Zipf-ranked ids of a 50,257-id vocabulary, each
    rank a fixed random id (benchmarks/corpora.py draws its tokens corpus the same way)."""
    rng = np.random.default_rng(3)
    p = 1.0 / (np.arange(50_257) + 2.7) ** 1.1
    ids = rng.permutation(50_257).astype(np.int32)
    r = np.searchsorted(np.cumsum(p / p.sum()), rng.random(n * width), side="right")
    flat = ids[np.minimum(r, 50_256)]
    return pa.table({"tokens": pa.FixedSizeListArray.from_arrays(pa.array(flat), width)})


def test_token_windows_in_byte_planes_take_lz4_and_back_to_back_zstd(monkeypatch):
    """In byte planes (format v5's layout) LZ4 packs token ids almost as well as zstd-1 and
    decodes them faster, so "auto" picks it; back to back it packs them 25% worse: zstd-1.
    The share is the threshold: at 0 every compressible non-text column takes LZ4, above 1
    none does."""
    from zephon_store.format.encoding import storage_encodings, to_storage

    t = _windows()
    planes = to_storage(t, storage_encodings(t.schema, "split"))
    back_to_back = to_storage(t, storage_encodings(t.schema, "binary"))
    assert choose_codecs(planes) == {"tokens": "lz4"}
    assert choose_codecs(back_to_back) == {"tokens": "zstd-1"}
    monkeypatch.setattr(shardwriter, "AUTO_FAST_SHARE", 1.5)
    assert choose_codecs(planes) == {"tokens": "zstd-1"}
    monkeypatch.setattr(shardwriter, "AUTO_FAST_SHARE", 0.0)
    assert choose_codecs(back_to_back) == {"tokens": "lz4"}
    assert choose_codecs(_table().select(["text", "noise"])) == {"text": "zstd-6",
                                                                 "noise": "none"}


def test_converted_windows_are_lz4_in_the_footers_and_the_record(tmp_path):
    out = _convert(tmp_path, _windows(), name="win")
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["storage"] == {"tokens": "fixed_size_binary_split"}
    assert doc["codecs"] == {"tokens": {"lz4": doc["totals"]["num_shards"]}}
    assert _footer_codecs(out) == {("tokens", "LZ4")}   # pyarrow's name for LZ4_RAW
    ds = open_dataset(str(out))
    assert ds.take(range(ds.num_samples)).equals(_windows())
    assert verify(str(out), deep=True).ok


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.binary(),
                                   pa.large_binary(), pa.string_view(), pa.binary_view()],
                         ids=str)
def test_every_variable_length_text_type_takes_the_text_level(type_):
    words = ["alpha beta gamma delta " * 4] * 300
    t = pa.table({"v": pa.array([w.encode() if "binary" in str(type_) else w for w in words],
                                type_),
                  "fixed": pa.array([b"alpha beta gamma"] * 300, pa.binary(16))})
    assert choose_codecs(t) == {"v": "zstd-6", "fixed": "zstd-1"}


def test_rule_threshold_is_the_ratio(monkeypatch):
    """The same column flips to "none" when the threshold is above its sample's ratio."""
    t = _table().select(["tokens"])
    assert choose_codecs(t) == {"tokens": "zstd-1"}
    monkeypatch.setattr(shardwriter, "AUTO_MIN_RATIO", 1000.0)
    assert choose_codecs(t) == {"tokens": "none"}


def test_auto_is_the_default_and_the_manifest_records_the_choice(tmp_path):
    out = _convert(tmp_path, _table())
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["format_version"] >= 3
    assert doc["writer"]["compression"] == "auto" and doc["writer"]["compression_level"] is None
    n = doc["totals"]["num_shards"]
    assert doc["codecs"] == {"digest": {"none": n}, "emb": {"none": n}, "lang": {"zstd-6": n},
                             "noise": {"none": n}, "text": {"zstd-6": n},
                             "tokens": {"zstd-1": n}}
    assert _footer_codecs(out) == {("text", "ZSTD"), ("noise", "UNCOMPRESSED"),
                                   ("emb", "UNCOMPRESSED"), ("tokens", "ZSTD"),
                                   ("digest", "UNCOMPRESSED"), ("lang", "ZSTD")}
    ds = open_dataset(str(out))
    assert ds.take(range(ds.num_samples)).equals(_table())
    assert verify(str(out), deep=True).ok


def test_auto_is_the_same_bytes_for_any_number_of_workers(tmp_path):
    t = _table()
    one = _convert(tmp_path, t, "one")
    src = tmp_path / "one.parquet"
    convert([str(src)], str(tmp_path / "two"), options=WriteOptions(row_group_rows=500),
            workers=2, progress=False)
    assert open_dataset(str(one)).dataset_id == open_dataset(str(tmp_path / "two")).dataset_id


@pytest.mark.parametrize("codec,footer", [("lz4", "LZ4"), ("none", "UNCOMPRESSED"),
                                          ("zstd", "ZSTD")])
def test_a_named_codec_overrides_auto_for_every_column(tmp_path, codec, footer):
    out = _convert(tmp_path, _table(), compression=codec)
    doc = json.loads((out / "manifest.json").read_text())
    assert "codecs" not in doc and doc["writer"]["compression"] == codec
    assert {c for _, c in _footer_codecs(out)} == {footer}


def test_named_codec_keeps_the_old_record():
    """WriteOptions(compression="zstd") records level 3, as when 3 was the default, so a
    re-conversion with explicit options keeps its writer record and dataset_id."""
    assert WriteOptions(compression="zstd").compression_level == 3
    assert WriteOptions(compression="none").compression_level == 3
    assert WriteOptions(compression="zstd", compression_level=1).compression_level == 1
    assert WriteOptions().compression_level is None


def test_auto_takes_no_level():
    with pytest.raises(ValueError, match="compression='auto' chooses its own levels"):
        WriteOptions(compression_level=1)
    with pytest.raises(ValueError, match="compression must be one of auto, zstd"):
        WriteOptions(compression="lzo")


def test_cli_default_is_auto_and_a_codec_overrides(tmp_path, capsys):
    from zephon_store.cli.main import main

    src = tmp_path / "in.parquet"
    pq.write_table(_table(300), src)
    assert main(["convert", str(src), "-o", str(tmp_path / "a"), "--json"]) == 0
    assert main(["convert", str(src), "-o", str(tmp_path / "z"), "--compression", "zstd",
                 "--json"]) == 0
    a = json.loads((tmp_path / "a" / "manifest.json").read_text())
    z = json.loads((tmp_path / "z" / "manifest.json").read_text())
    assert a["writer"]["compression"] == "auto" and "codecs" in a
    assert z["writer"]["compression"] == "zstd" and z["writer"]["compression_level"] == 3
    assert "codecs" not in z

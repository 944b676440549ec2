"""verify checks the manifest's statement of codecs against every shard's footer."""

from __future__ import annotations

import json
import pathlib

import pyarrow as pa
import pytest

from tests.helpers import converted, reseal
from zephon_store.read.verify import verify
from zephon_store.read.verify_codecs import auto_codec_problems, leaf_owners


def _convert(tmp_path, **options):
    return pathlib.Path(converted(tmp_path, files=2, records=200, target_shard_bytes=24 << 10,
                                  row_group_bytes=4 << 10, **options))


def _codec_findings(ds):
    rep = verify(str(ds))
    return rep, [f for f in rep.findings if f.kind == "codec_mismatch"]


def test_auto_codecs_record_is_checked_against_the_footers(tmp_path):
    ds = _convert(tmp_path)
    rep, found = _codec_findings(ds)
    assert rep.ok and not found
    doc = json.loads((ds / "manifest.json").read_text())
    column, counts = next((c, v) for c, v in doc["codecs"].items() if "zstd-1" in v)
    n = sum(counts.values())

    def lie(d):
        d["codecs"][column] = {"none": n}     # every shard of the column "uncompressed"
    reseal(ds, lie)
    rep, found = _codec_findings(ds)
    assert not rep.ok and len(found) == 1 and found[0].shard is None
    assert repr(column) in found[0].message and "ZSTD" in found[0].message
    assert str(ds / "manifest.json") in found[0].message


def test_a_missing_codecs_record_is_a_finding(tmp_path):
    ds = _convert(tmp_path)
    reseal(ds, lambda d: d.pop("codecs"))
    rep, found = _codec_findings(ds)
    assert [f.kind for f in rep.findings] == ["codec_mismatch"]
    assert "no 'codecs' record" in found[0].message


def test_a_named_codec_is_checked_on_every_shard(tmp_path):
    ds = _convert(tmp_path, compression="zstd")
    rep, found = _codec_findings(ds)
    assert rep.ok and not found

    def lie(d):
        d["writer"]["compression"] = "snappy"
    reseal(ds, lie)
    rep, found = _codec_findings(ds)
    assert not rep.ok and found and len(found) == rep.shards_checked
    assert all("ZSTD" in f.message and "'snappy'" in f.message for f in found)
    assert all(f.shard is not None for f in found)


@pytest.mark.parametrize("codec", ["lz4", "snappy", "none", "gzip"])
def test_every_named_codec_verifies_as_written(tmp_path, codec):
    """The footer names pyarrow reports for what each codec writes (lz4: Parquet's LZ4_RAW,
    which pyarrow calls LZ4) match the manifest's: no false codec_mismatch."""
    rep, found = _codec_findings(_convert(tmp_path, compression=codec))
    assert rep.ok and not found, found


def test_a_damaged_shard_does_not_turn_into_a_codec_finding(tmp_path):
    ds = _convert(tmp_path)
    shard = sorted((ds / "shards").iterdir())[0]
    shard.unlink()
    rep, found = _codec_findings(ds)
    assert [f.kind for f in rep.findings] == ["missing_shard"] and not found


def test_leaf_owners_follow_the_schema_not_the_dots():
    schema = pa.schema([
        ("a.b", pa.int64()),
        ("n", pa.struct([("x", pa.list_(pa.int32())), ("y", pa.string())])),
        ("m", pa.map_(pa.string(), pa.struct([("p", pa.int8()), ("q", pa.int8())]))),
        ("f", pa.list_(pa.float32(), 4)),
    ])
    assert leaf_owners(schema) == ["a.b", "n", "n", "m", "m", "m", "f"]


@pytest.mark.parametrize("claimed, ok", [
    ({"text": {"zstd-1": 2}}, True),
    ({"text": {"zstd-3": 2}}, True),        # Parquet keeps the codec, not its level
    ({"text": {"zstd-1": 1, "none": 1}}, False),
    ({"text": {"zstd-1": 2}, "gone": {"none": 2}}, False),
    ({}, False),
])
def test_auto_counts(claimed, ok):
    per_shard = [{"text": {"ZSTD"}}, {"text": {"ZSTD"}}]
    assert (auto_codec_problems(claimed, per_shard) == []) is ok

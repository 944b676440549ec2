"""Every golden dataset of every format version stays readable, verified and unchanged."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import ROOT
from zephon_store import open_dataset
from zephon_store.format.manifest import FORMAT_VERSION
from zephon_store.read.verify import verify
from zephon_store.write import shardwriter

GOLDEN = pathlib.Path(ROOT) / "formats" / "golden"
CASES = [(v.name, name) for v in sorted(GOLDEN.glob("v*"))
         for name in json.loads((v / "expected.json").read_text())["datasets"]]


def _expected(version):
    return json.loads((GOLDEN / version / "expected.json").read_text())


def test_there_are_golden_datasets():
    assert ("v1", "text") in CASES and ("v1", "nested") in CASES


@pytest.mark.parametrize("version,name", CASES)
def test_golden_reads_and_verifies(version, name):
    exp = _expected(version)["datasets"][name]
    ds = open_dataset(str(GOLDEN / version / name))
    assert ds.dataset_id == exp["dataset_id"]
    assert ds.num_samples == exp["num_samples"] and ds.num_shards == exp["num_shards"]
    got = json.loads(json.dumps(ds.take(range(ds.num_samples)).to_pylist(),
                                default=lambda o: o.isoformat()))
    assert got == exp["records"]
    assert verify(str(GOLDEN / version / name), deep=True).ok


def test_there_are_golden_datasets_of_the_current_version():
    assert (f"v{FORMAT_VERSION}", "tokens") in CASES


def _manifest(version, name):
    return json.loads((GOLDEN / version / name / "manifest.json").read_text())


def test_v2_golden_stores_fixed_size_lists_as_little_endian_binary():
    """The exact byte layout of formats/SPEC.md 3.1, read with plain pyarrow."""
    root = GOLDEN / "v2" / "tokens"
    assert _manifest("v2", "tokens")["storage"] == {
        "tokens": "fixed_size_binary_le", "pos": "fixed_size_binary_le",
        "emb": "fixed_size_binary_le"}
    ds = open_dataset(str(root))
    m = ds.manifest
    first = pq.ParquetFile(root / m.shard_path(0))
    assert first.schema_arrow.field("tokens").type == pa.binary(36)
    assert not first.schema_arrow.field("tokens").nullable
    raw = first.read_row_group(0)
    want = ds.take([1]).to_pylist()[0]
    assert raw.column("tokens")[1].as_py() == struct.pack("<9i", *want["tokens"])
    assert raw.column("pos")[1].as_py() == struct.pack("<2H", *want["pos"])
    assert raw.column("emb")[1].as_py() == struct.pack("<3f", *want["emb"])
    assert raw.column("emb")[0].as_py() is None  # a null row stays a null row


def test_v2_docs_golden_has_plain_pages_for_distinct_text():
    """``use_dictionary="auto"``: mostly-distinct strings plain, repeated ones a dictionary."""
    root = GOLDEN / "v2" / "docs"
    assert _manifest("v2", "docs")["writer"]["use_dictionary"] == "auto"
    m = open_dataset(str(root)).manifest
    md = pq.ParquetFile(root / m.shard_path(0)).metadata
    for i in range(md.num_row_groups):
        cols = {md.row_group(i).column(c).path_in_schema: md.row_group(i).column(c)
                for c in range(md.num_columns)}
        assert not cols["text"].has_dictionary_page
        assert "RLE_DICTIONARY" not in cols["text"].encodings
        assert cols["source"].has_dictionary_page


def test_v1_goldens_have_no_storage_encodings():
    for name in ("text", "nested"):
        doc = _manifest("v1", name)
        assert doc["format_version"] == 1 and "storage" not in doc
        assert open_dataset(str(GOLDEN / "v1" / name)).manifest.storage == {}


@pytest.mark.parametrize("version,name", CASES)
def test_current_writer_reproduces_golden_bytes(version, name, tmp_path, monkeypatch):
    """Writing the golden inputs again gives the same bytes: nothing drifted.

    For the current version the whole dataset_id matches; for older versions (whose
    manifests this writer no longer produces) every shard file does: their options name
    the codec they were written with, they are written with the ``fixed_size_lists`` their
    manifest records (v1 predates the option: its layout is "list"), and "auto" datasets
    before v5 with text at zstd level 1, the only change v5 made to the rule.

    Parquet bytes include the writer's version string, so this holds for the pyarrow that
    wrote the goldens; other versions are checked by the read test above.
    """
    exp = _expected(version)
    if exp["pyarrow"] != pa.__version__:
        pytest.skip(f"goldens written by pyarrow {exp['pyarrow']}, running {pa.__version__}")
    from zephon_store import convert
    from zephon_store.testing.golden import DATASETS, golden_convert_kwargs

    make_inputs, wopts, iopts = DATASETS[name]
    if version != f"v{FORMAT_VERSION}":
        writer = _manifest(version, name)["writer"]
        wopts = dataclasses.replace(wopts, fixed_size_lists=writer.get("fixed_size_lists", "list"))
        if int(version[1:]) < 5:
            monkeypatch.setattr(shardwriter, "AUTO_TEXT_LEVEL", 1)
    src = tmp_path / "src"
    src.mkdir()
    res = convert(make_inputs(str(src)), str(tmp_path / "out"), options=wopts,
                  input_options=iopts, **golden_convert_kwargs(name, str(src)))
    if version == f"v{FORMAT_VERSION}":
        assert res.dataset_id == exp["datasets"][name]["dataset_id"]
    else:
        old = open_dataset(str(GOLDEN / version / name)).manifest
        new = open_dataset(str(tmp_path / "out")).manifest
        assert new.storage == old.storage, "a later version stores this dataset differently"
        assert ([new.shard_name(i) for i in range(new.num_shards)]
                == [old.shard_name(i) for i in range(old.num_shards)])


def test_v3_auto_golden_has_a_codec_per_column():
    """compression="auto" (formats/SPEC.md, "Compression"): compressible columns zstd,
    the sha256 noise uncompressed; the manifest records the choice per column."""
    root = GOLDEN / "v3" / "auto"
    doc = _manifest("v3", "auto")
    assert doc["writer"]["compression"] == "auto" and doc["writer"]["compression_level"] is None
    shards = doc["totals"]["num_shards"]
    assert doc["codecs"] == {"lang": {"zstd-1": shards}, "noise": {"none": shards},
                             "text": {"zstd-1": shards}, "tokens": {"zstd-1": shards}}
    m = open_dataset(str(root)).manifest
    for i in range(m.num_shards):
        md = pq.ParquetFile(root / m.shard_path(i)).metadata
        for g in range(md.num_row_groups):
            got = {md.row_group(g).column(c).path_in_schema: md.row_group(g).column(c).compression
                   for c in range(md.num_columns)}
            assert got == {"text": "ZSTD", "lang": "ZSTD", "noise": "UNCOMPRESSED",
                           "tokens": "ZSTD"}


def test_older_goldens_name_their_codec():
    """Every golden written before "auto" records zstd level 3 and has no codecs entry."""
    for version, name in CASES:
        doc = _manifest(version, name)
        if doc["writer"]["compression"] != "auto":
            assert doc["writer"]["compression"] == "zstd"
            assert doc["writer"]["compression_level"] == 3 and "codecs" not in doc


def test_v4_goldens_keep_the_v3_shards():
    """Format v4 changed the index only: every v4 golden's shard files are its v3 twin's."""
    v3 = {name for version, name in CASES if version == "v3"}
    for version, name in CASES:
        if version != "v4" or name not in v3:
            continue
        old = open_dataset(str(GOLDEN / "v3" / name)).manifest
        new = open_dataset(str(GOLDEN / "v4" / name)).manifest
        assert new.format_version == 4 and new.details.num_chunks == 1
        assert ([new.shard_name(i) for i in range(new.num_shards)]
                == [old.shard_name(i) for i in range(old.num_shards)])
        for rg in range(new.num_row_groups):
            assert (int(new.rg_offset[rg]), int(new.rg_length[rg]), new.rg_xxh3(rg)) == (
                int(old.rg_offset[rg]), int(old.rg_length[rg]), old.rg_xxh3(rg))


def test_v6_goldens_keep_the_v5_shards_and_only_packed_data_has_a_document_table():
    """Format v6 added the document table only: every v6 golden's shard files are its v5
    twin's; the packed ones name a document table that reads and rebuilds every document."""
    from zephon_store.read.documents import open_documents

    v5 = {name for version, name in CASES if version == "v5"}
    for version, name in CASES:
        if version != "v6":
            continue
        new = open_dataset(str(GOLDEN / "v6" / name)).manifest
        assert new.format_version == 6 and new.has_documents == (name in ("packed", "bestfit"))
        if name in v5:
            old = open_dataset(str(GOLDEN / "v5" / name)).manifest
            assert ([new.shard_name(i) for i in range(new.num_shards)]
                    == [old.shard_name(i) for i in range(old.num_shards)])
    for name in ("packed", "bestfit"):
        ds = open_dataset(str(GOLDEN / "v6" / name))
        docs = open_documents(ds)
        windows = ds.take(range(ds.num_samples)).column("tokens").to_pylist()
        assert docs.num_documents == 23 and docs.inputs == ["p0.jsonl", "p1.jsonl"]
        for d in range(docs.num_documents):
            doc = docs.document(d)
            got = [t for s in doc.spans for t in windows[s.window][s.offset:s.offset + s.length]]
            assert got[:1] in ([], [1]) and (len(got) == doc.num_tokens or name == "packed")

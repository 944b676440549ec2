"""Storage encodings: fixed-size lists of numbers as fixed-size binary, little-endian back to
back (format v2) or in byte planes (v5)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import reseal
from zephon_store import ManifestError, convert, open_dataset
from zephon_store.errors import InputError, ZephonError
from zephon_store.format import encoding as enc_mod
from zephon_store.format.encoding import (
    FIXED_SIZE_BINARY_LE,
    FIXED_SIZE_BINARY_SPLIT,
    ElementNullError,
    encodable,
    storage_encodings,
    storage_schema,
    to_logical,
    to_storage,
)
from zephon_store.format.manifest import FORMAT_VERSION
from zephon_store.read.verify import verify
from zephon_store.write.shardwriter import WriteOptions, write_shard

NUMERIC = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
           pa.uint64(), pa.float16(), pa.float32(), pa.float64()]


def _fsl(values: np.ndarray, n: int, type_: pa.DataType, valid=None) -> pa.Array:
    mask = None if valid is None else pa.array(~np.asarray(valid, dtype=bool))
    return pa.FixedSizeListArray.from_arrays(pa.array(values, type=type_), n, mask=mask)


def _values(rng, type_, count):
    dtype = type_.to_pandas_dtype()
    if pa.types.is_floating(type_):
        return rng.standard_normal(count).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=count, endpoint=True, dtype=dtype)


def _roundtrip(table: pa.Table, mode: str = "split") -> pa.Table:
    encodings = storage_encodings(table.schema, mode)
    stored = to_storage(table, encodings)
    assert stored.schema == storage_schema(table.schema, encodings)
    back = to_logical(stored, table.schema, encodings)
    assert back.schema == table.schema
    assert back.equals(table)
    return stored


# -- pure functions ----------------------------------------------------------------------------
def test_which_columns_are_encoded():
    schema = pa.schema([("a", pa.list_(pa.int32(), 4)), ("b", pa.list_(pa.int32())),
                        ("c", pa.list_(pa.string(), 2)), ("d", pa.list_(pa.bool_(), 2)),
                        ("e", pa.list_(pa.float64(), 1)), ("f", pa.list_(pa.int8(), 0)),
                        ("g", pa.struct([("x", pa.list_(pa.int32(), 2))])), ("h", pa.int32()),
                        ("i", pa.list_(pa.uint8(), 3))])
    # Planes of one byte are the bytes themselves: int8/uint8 lists stay back to back.
    assert storage_encodings(schema) == {"a": FIXED_SIZE_BINARY_SPLIT,
                                         "e": FIXED_SIZE_BINARY_SPLIT, "i": FIXED_SIZE_BINARY_LE}
    assert storage_encodings(schema, "binary") == {"a": FIXED_SIZE_BINARY_LE,
                                                   "e": FIXED_SIZE_BINARY_LE,
                                                   "i": FIXED_SIZE_BINARY_LE}
    assert storage_encodings(schema, "list") == {}
    # No codec, no planes: uncompressed datasets keep windows back to back (zero-copy).
    assert storage_encodings(schema, "split", "none") == storage_encodings(schema, "binary")
    assert storage_encodings(schema, "split", "auto") == storage_encodings(schema)
    assert not encodable(pa.list_(pa.int32(), 0))
    with pytest.raises(ValueError, match="fixed_size_lists must be one of split, binary, list"):
        storage_encodings(schema, "bytes")
    with pytest.raises(ValueError, match="'i': encoding 'fixed_size_binary_split' needs "
                                         "elements of 2 bytes or more"):
        storage_schema(schema, {"i": FIXED_SIZE_BINARY_SPLIT})


def test_storage_schema_keeps_names_nullability_and_metadata():
    schema = pa.schema([pa.field("t", pa.list_(pa.int32(), 2049), nullable=False,
                                 metadata={"k": "v"}), ("s", pa.string())], metadata={"m": "1"})
    got = storage_schema(schema, storage_encodings(schema))
    assert got.field("t").type == pa.binary(8196) and not got.field("t").nullable
    assert got.field("t").metadata == {b"k": b"v"} and got.metadata == {b"m": b"1"}
    assert got.field("s") == schema.field("s")


@pytest.mark.parametrize("mode", ["split", "binary"])
@pytest.mark.parametrize("type_", NUMERIC, ids=str)
def test_roundtrip_every_numeric_type_with_null_rows(type_, mode):
    rng = np.random.default_rng(0)
    n, rows = 5, 40
    valid = rng.random(rows) > 0.3
    t = pa.table({"x": _fsl(_values(rng, type_, rows * n), n, type_, valid),
                  "y": pa.array(range(rows))})
    stored = _roundtrip(t, mode)
    col = stored.column("x")
    assert col.null_count == int((~valid).sum())
    # The exact layout: each value is the row's elements, little-endian, back to back
    # ("binary"), or those bytes as planes: byte 0 of every element, then byte 1, ...
    for k in np.flatnonzero(valid)[:3]:
        want = np.asarray(t.column("x")[int(k)].values).astype(
            np.dtype(type_.to_pandas_dtype()).newbyteorder("<"))
        le = want.tobytes()
        if mode == "split":
            le = np.frombuffer(le, np.uint8).reshape(n, want.itemsize).T.tobytes()
        assert col[int(k)].as_py() == le


@settings(max_examples=60, deadline=None)
@given(type_=st.sampled_from([pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.uint16(),
                               pa.int8()]),
       n=st.integers(1, 40), rows=st.integers(0, 60), mode=st.sampled_from(["split", "binary"]),
       data=st.data())
def test_roundtrip_arbitrary_sizes_slices_and_chunks(type_, n, rows, mode, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    child_pad = data.draw(st.integers(0, 3))
    valid = rng.random(rows) > data.draw(st.sampled_from([0.0, 0.5]))
    # A child array that itself starts at an offset, under a list array sliced twice.
    values = pa.array(_values(rng, type_, rows * n + child_pad), type=type_).slice(child_pad)
    arr = pa.FixedSizeListArray.from_arrays(values, n, mask=pa.array(~valid))
    lo = data.draw(st.integers(0, rows))
    hi = data.draw(st.integers(lo, rows))
    cut = data.draw(st.integers(lo, hi))
    col = pa.chunked_array([arr.slice(lo, cut - lo), arr.slice(cut, hi - cut)], type=arr.type)
    table = pa.table({"x": col})
    _roundtrip(table, mode)
    part = table.slice(data.draw(st.integers(0, hi - lo)))
    stored = _roundtrip(part, mode)
    # A stored column sliced again (rows of a decoded row group) turns back too.
    a = data.draw(st.integers(0, stored.num_rows))
    back = to_logical(stored.slice(a), table.schema, storage_encodings(table.schema, mode))
    assert back.equals(part.slice(a))


def test_to_storage_and_back_are_zero_copy():
    values = pa.array(np.arange(4 * 100, dtype=np.int32))
    arr = pa.FixedSizeListArray.from_arrays(values, 4).slice(7, 50)
    stored = to_storage(pa.table({"x": arr}), {"x": FIXED_SIZE_BINARY_LE}).column("x").chunk(0)
    child = values.buffers()[1]
    assert stored.buffers()[1].address == child.address
    assert stored[0].as_py() == np.arange(28, 32, dtype="<i4").tobytes()
    back = to_logical(pa.table({"x": stored}), pa.schema([("x", arr.type)]),
                      {"x": FIXED_SIZE_BINARY_LE}).column("x").chunk(0)
    assert back.values.buffers()[1].address == child.address
    assert back.equals(arr)


def test_element_null_is_a_clear_error_but_not_under_a_null_row():
    t = pa.table({"ok": pa.array([[1, 2]] * 4, pa.list_(pa.int32(), 2)),
                  "bad": pa.array([[1, 2], None, [3, 4], [5, None]], pa.list_(pa.int32(), 2))})
    encodings = storage_encodings(t.schema)
    # Row 1 is null (pyarrow puts null elements under it): fine.
    _roundtrip(t.slice(0, 3))
    with pytest.raises(ElementNullError, match=r"column 'bad' row 3: .*fixed_size_lists='list'"
                       ) as info:
        to_storage(t, encodings)
    assert (info.value.column, info.value.row) == ("bad", 3)
    assert isinstance(info.value, ValueError)
    # Rows count across chunks.
    chunked = pa.Table.from_batches(t.to_batches(max_chunksize=2))
    with pytest.raises(ElementNullError, match="row 3"):
        to_storage(chunked, encodings)


def test_to_logical_rejects_a_shard_of_another_layout():
    logical = pa.schema([("x", pa.list_(pa.int32(), 3))])
    with pytest.raises(ZephonError, match=r"column 'x': shard holds fixed_size_binary\[8\]"):
        to_logical(pa.table({"x": pa.array([b"12345678"], pa.binary(8))}), logical,
                   {"x": FIXED_SIZE_BINARY_LE})
    with pytest.raises(ValueError, match="unknown storage encoding 'zigzag'"):
        storage_schema(logical, {"x": "zigzag"})
    with pytest.raises(ValueError, match="lacks"):
        storage_schema(logical, {"y": FIXED_SIZE_BINARY_LE})


def test_big_endian_host_is_refused(monkeypatch):
    monkeypatch.setattr(enc_mod.sys, "byteorder", "big")
    t = pa.table({"x": pa.array([[1, 2]], pa.list_(pa.int32(), 2))})
    with pytest.raises(ZephonError, match="little-endian"):
        to_storage(t, storage_encodings(t.schema))
    assert to_storage(t, {}) is t  # nothing encoded, nothing to refuse


# -- shard writer --------------------------------------------------------------------------------
def test_write_options_field():
    assert WriteOptions().fixed_size_lists == "split"
    assert WriteOptions().to_dict()["fixed_size_lists"] == "split"
    with pytest.raises(ValueError, match="fixed_size_lists must be one of split, binary, list; "
                                         "got 'x'"):
        WriteOptions(fixed_size_lists="x")


@pytest.mark.parametrize("mode", ["split", "binary", "list"])
def test_write_shard_layout(tmp_path, mode):
    t = pa.table({"tok": pa.array([[i, i + 1, i + 2] for i in range(50)], pa.list_(pa.int32(), 3)),
                  "s": pa.array([f"v{i % 3}" for i in range(50)])})
    info = write_shard(t, [20, 30], str(tmp_path / "s.parquet"),
                       WriteOptions(fixed_size_lists=mode))
    pf = pq.ParquetFile(tmp_path / "s.parquet")
    assert info.rows == 50 and [r.rows for r in info.row_groups] == [20, 30]
    cols = {pf.metadata.row_group(0).column(i).path_in_schema: pf.metadata.row_group(0).column(i)
            for i in range(pf.metadata.num_columns)}
    if mode != "list":
        assert pf.schema_arrow.field("tok").type == pa.binary(12)
        first = pf.read_row_group(0).column("tok")[1].as_py()   # row 1: [1, 2, 3]
        want = np.array([1, 2, 3], "<i4").tobytes()
        assert first == (want if mode == "binary"
                         else np.frombuffer(want, np.uint8).reshape(3, 4).T.tobytes())
        assert not cols["tok"].has_dictionary_page   # whole windows: no dictionary
        assert cols["s"].has_dictionary_page         # other columns keep use_dictionary
    else:
        assert pf.schema_arrow == t.schema


# -- end to end ------------------------------------------------------------------------------------
def _convert(tmp_path, table, **opts):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    pq.write_table(table, src / "in.parquet")
    out = tmp_path / f"ds-{opts.get('fixed_size_lists', 'split')}"
    convert([str(src / "in.parquet")], str(out),
            options=WriteOptions(target_shard_bytes=2000, row_group_rows=16, **opts))
    return out


def _token_table(rows=100):
    rng = np.random.default_rng(1)
    return pa.table({
        "id": pa.array(range(rows)),
        "tokens": _fsl(rng.integers(0, 50000, rows * 17, dtype=np.int32), 17, pa.int32()),
        "emb": _fsl(rng.standard_normal(rows * 2), 2, pa.float64(), np.arange(rows) % 3 > 0),
    })


def test_dataset_round_trip_and_cuts_match_the_list_layout(tmp_path):
    t = _token_table()
    split = _convert(tmp_path, t)
    binary = _convert(tmp_path, t, fixed_size_lists="binary")
    listed = _convert(tmp_path, t, fixed_size_lists="list")
    s, b, lst = open_dataset(str(split)), open_dataset(str(binary)), open_dataset(str(listed))
    assert s.manifest.storage == {"tokens": FIXED_SIZE_BINARY_SPLIT,
                                  "emb": FIXED_SIZE_BINARY_SPLIT}
    assert b.manifest.storage == {"tokens": FIXED_SIZE_BINARY_LE, "emb": FIXED_SIZE_BINARY_LE}
    assert lst.manifest.storage == {}
    assert s.schema == b.schema == lst.schema == t.schema
    for path, ds in ((split, s), (binary, b), (listed, lst)):
        assert ds.take(range(100)).equals(t)
        assert ds.take([97, 3, 50, 3]).equals(t.take([97, 3, 50, 3]))
        # Cuts are made on logical sizes, so every layout cuts the same rows.
        assert list(ds.manifest.rg_rows) == list(lst.manifest.rg_rows)
        assert list(ds.manifest.shard_rows) == list(lst.manifest.shard_rows)
        assert verify(str(path), deep=True).ok
    for path, mode in ((split, "split"), (binary, "binary")):
        doc = json.loads((path / "manifest.json").read_text())
        assert doc["format_version"] == FORMAT_VERSION and doc["writer"]["fixed_size_lists"] == mode
    # The default layout without a codec: back to back, in the manifest and in the shards.
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw-binary").mkdir()
    raw = _convert(tmp_path / "raw", t, compression="none")
    raw_binary = _convert(tmp_path / "raw-binary", t, compression="none",
                          fixed_size_lists="binary")
    r, rb = open_dataset(str(raw)).manifest, open_dataset(str(raw_binary)).manifest
    assert r.storage == rb.storage == b.manifest.storage
    assert ([r.shard_name(i) for i in range(r.num_shards)]
            == [rb.shard_name(i) for i in range(rb.num_shards)])
    assert open_dataset(str(raw)).take(range(100)).equals(t)
    assert verify(str(raw), deep=True).ok


def test_element_null_names_the_input_and_record(tmp_path):
    t = pa.table({"tokens": pa.array([[1, 2]] * 20 + [[3, None]], pa.list_(pa.int32(), 2))})
    with pytest.raises(InputError, match=r"in\.parquet record 20 .*column 'tokens'.*"
                       r"fixed_size_lists='list'") as info:
        _convert(tmp_path, t)
    assert info.value.row == 20 and info.value.path.endswith("in.parquet")
    out = _convert(tmp_path, t, fixed_size_lists="list")
    assert open_dataset(str(out)).take([20]).column("tokens").to_pylist() == [[3, None]]


def test_verify_reports_a_storage_schema_mismatch(tmp_path):
    ds = _convert(tmp_path, _token_table())
    reseal(ds, lambda doc: doc["storage"].pop("emb"))  # consistent manifest, wrong storage
    rep = verify(str(ds), deep=True)
    kinds = {f.kind for f in rep.findings}
    assert kinds == {"schema_mismatch"}
    msg = next(f.message for f in rep.findings if f.kind == "schema_mismatch")
    assert "storage schema" in msg and "emb" in msg


def test_manifest_rejects_inconsistent_storage(tmp_path):
    ds = _convert(tmp_path, _token_table())
    reseal(ds, lambda doc: doc["storage"].update(id=FIXED_SIZE_BINARY_LE))
    with pytest.raises(ManifestError, match="column 'id'"):
        open_dataset(str(ds))
    reseal(ds, lambda doc: doc.update(format_version=1))
    with pytest.raises(ManifestError, match="format_version 1 manifest cannot have 'storage'"):
        open_dataset(str(ds))
    reseal(ds, lambda doc: (doc.pop("storage"), doc.update(format_version=2)))
    with pytest.raises(ManifestError, match="lacks its 'storage'"):
        open_dataset(str(ds))
    reseal(ds, lambda doc: doc.update(format_version=7, storage={}))
    with pytest.raises(ManifestError,
                       match="format_version 7 is not supported.*reads 1, 2, 3, 4, 5, 6"):
        open_dataset(str(ds))


def test_split_storage_is_refused_before_version_5(tmp_path):
    ds = _convert(tmp_path, _token_table())
    reseal(ds, lambda doc: doc.update(format_version=4))
    with pytest.raises(ManifestError, match="format_version 4 manifest cannot name the storage "
                                            "encoding 'fixed_size_binary_split'"):
        open_dataset(str(ds))


def test_cli_convert_fixed_size_lists_flag(tmp_path, capsys):
    from zephon_store.cli.main import main

    src = tmp_path / "in.parquet"
    pq.write_table(_token_table(20), src)
    for mode in ("split", "binary", "list"):
        out = tmp_path / mode
        assert main(["convert", str(src), "-o", str(out), "--fixed-size-lists", mode,
                     "--json"]) == 0
        doc = json.loads((out / "manifest.json").read_text())
        assert doc["writer"]["fixed_size_lists"] == mode
        want = {"split": FIXED_SIZE_BINARY_SPLIT, "binary": FIXED_SIZE_BINARY_LE}.get(mode)
        assert set(doc["storage"].values()) == ({want} if want else set())
        assert open_dataset(str(out)).take(range(20)).equals(_token_table(20))

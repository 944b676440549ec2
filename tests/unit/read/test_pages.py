"""Reading fixed-size binary pages directly (pages.py) gives exactly what pyarrow gives, or None."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_store.read.pages import read_fixed_chunk

CODECS = ["none", "zstd", "snappy", "gzip", "brotli"]


def _write(tmp_path, table, **kw):
    path = str(tmp_path / "t.parquet")
    opts = dict(use_dictionary=False, data_page_size=4096, write_batch_size=16)
    opts.update(kw)
    pq.write_table(table, path, **opts)
    return path


def _chunk(path, column, rg=0):
    buf = pa.memory_map(path, "r").read_buffer()
    md = pq.ParquetFile(path).metadata
    names = [md.schema.column(i).path for i in range(md.num_columns)]
    ci = names.index(column)
    leaf = md.schema.column(ci)
    return buf, 0, md.row_group(rg).column(ci), leaf.max_definition_level, leaf.max_repetition_level


@pytest.mark.parametrize("compression", CODECS)
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
def test_fixed_pages_are_views_equal_to_pyarrow(tmp_path, compression, page_version):
    vals = [bytes([i % 251]) * 40 for i in range(500)]
    t = pa.table({"w": pa.array(vals, pa.binary(40)),
                  "req": pa.array(vals, pa.binary(40))},
                 schema=pa.schema([("w", pa.binary(40)),
                                   pa.field("req", pa.binary(40), nullable=False)]))
    path = _write(tmp_path, t, compression=compression, data_page_version=page_version)
    ref = pq.read_table(path)
    for name in ("w", "req"):
        buf, _, col, max_def, max_rep = _chunk(path, name)
        got = read_fixed_chunk(buf, 0, col, max_def, max_rep, 40)
        assert got is not None and got.num_chunks > 1
        assert got.equals(ref.column(name).cast(pa.binary(40)))
        if compression == "none":     # zero-copy: the chunks point into the mapped file
            lo, hi = buf.address, buf.address + buf.size
            assert all(lo <= c.buffers()[1].address < hi for c in got.chunks)


def test_nulls_dictionary_lz4_nested_and_other_types_fall_back(tmp_path):
    t = pa.table({"w": pa.array([None if i % 7 == 0 else b"abcd" for i in range(100)],
                                pa.binary(4)),
                  "d": pa.array([b"wxyz"] * 100, pa.binary(4)),
                  "s": [f"s{i}" for i in range(100)],
                  "n": pa.array([[b"ab"]] * 100, pa.list_(pa.binary(2)))})
    path = _write(tmp_path, t, use_dictionary=["d"])
    assert read_fixed_chunk(*_chunk(path, "w"), 4) is None                      # nulls
    assert read_fixed_chunk(*_chunk(path, "d"), 4) is None                      # dictionary
    assert read_fixed_chunk(*_chunk(path, "s"), 4) is None                      # not fixed
    assert read_fixed_chunk(*_chunk(path, "n.list.element"), 2) is None         # nested
    path = _write(tmp_path, t, compression="lz4")
    # pyarrow reports Parquet's framed "LZ4" and raw "LZ4_RAW" alike: not read here
    assert read_fixed_chunk(*_chunk(path, "d"), 4) is None


def test_damaged_or_outside_chunks_fall_back(tmp_path):
    vals = [bytes([i]) * 16 for i in range(200)]
    path = _write(tmp_path, pa.table({"w": pa.array(vals, pa.binary(16))}))
    buf, _, col, max_def, max_rep = _chunk(path, "w")
    assert read_fixed_chunk(buf.slice(0, 100), 0, col, max_def, max_rep, 16) is None
    assert read_fixed_chunk(buf, 0, col, max_def, max_rep, 15) is None        # wrong width
    raw = bytearray(buf.to_pybytes())
    raw[col.data_page_offset] ^= 0xFF        # the hash check catches this first; still no
    got = read_fixed_chunk(pa.py_buffer(bytes(raw)), 0, col, max_def, max_rep, 16)
    assert got is None or got.to_pylist() == vals                              # wrong answer


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_fixed_pages_property(tmp_path_factory, data):
    width = data.draw(st.integers(1, 64))
    n = data.draw(st.integers(1, 300))
    vals = [data.draw(st.binary(min_size=width, max_size=width)) for _ in range(n)]
    tmp = tmp_path_factory.mktemp("p")
    path = _write(tmp, pa.table({"b": pa.array(vals, pa.binary(width))}),
                  compression=data.draw(st.sampled_from(["none", "zstd", "snappy"])),
                  data_page_version=data.draw(st.sampled_from(["1.0", "2.0"])),
                  data_page_size=data.draw(st.sampled_from([64, 1024, 1 << 20])))
    got = read_fixed_chunk(*_chunk(path, "b"), width)
    assert got is not None and got.to_pylist() == vals

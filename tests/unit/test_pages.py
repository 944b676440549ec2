"""Reading PLAIN pages directly (pages.py) gives exactly what pyarrow's reader gives, or None."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_store.pages import (
    MIN_MEAN_VALUE_BYTES,
    PageValues,
    read_byte_array_chunk,
    read_fixed_chunk,
)

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


def _docs(n, seed, nulls):
    rng = np.random.default_rng(seed)
    return [None if nulls and rng.random() < 0.2 else
            f"doc {i} é " + "x" * int(rng.integers(100, 700)) for i in range(n)]


@pytest.mark.parametrize("compression", CODECS)
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
@pytest.mark.parametrize("nulls", [False, True])
def test_byte_array_pages_equal_pyarrow(tmp_path, compression, page_version, nulls):
    docs = _docs(300, 1, nulls)
    t = pa.table({"text": docs,
                  "blob": pa.array([None if d is None else d.encode()[::-1] for d in docs],
                                   pa.large_binary())})
    path = _write(tmp_path, t, compression=compression, data_page_version=page_version,
                  row_group_size=120)
    md = pq.ParquetFile(path).metadata
    for rg in range(md.num_row_groups):
        ref = pq.ParquetFile(path).read_row_group(rg)
        for name, text in (("text", True), ("blob", False)):
            buf, _, col, max_def, max_rep = _chunk(path, name, rg)
            got = read_byte_array_chunk(buf, 0, col, max_def, max_rep, text=text)
            assert isinstance(got, PageValues), (name, compression, page_version)
            assert len(got.pages) > 1                  # several pages per chunk
            want = ref.column(name).to_pylist()
            assert got.pylist(range(len(want))) == want
            rows = np.random.default_rng(rg).integers(0, len(want), 40)
            assert got.pylist(rows) == [want[r] for r in rows]


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


def test_fixed_with_nulls_dictionary_and_short_values_fall_back(tmp_path):
    t = pa.table({"w": pa.array([None if i % 7 == 0 else b"abcd" for i in range(100)],
                                pa.binary(4)),
                  "short": [f"s{i}" for i in range(100)],
                  "dict": [("long value " * 20) + str(i % 3) for i in range(100)]})
    path = _write(tmp_path, t, use_dictionary=["dict"])
    assert read_fixed_chunk(*_chunk(path, "w"), 4) is None                       # nulls
    assert read_byte_array_chunk(*_chunk(path, "short"), text=True) is None      # short
    assert read_byte_array_chunk(*_chunk(path, "dict"), text=True) is None       # dictionary
    assert MIN_MEAN_VALUE_BYTES > 2


def test_lz4_falls_back(tmp_path):
    """pyarrow reports Parquet's framed "LZ4" and raw "LZ4_RAW" alike: not read here."""
    t = pa.table({"text": _docs(50, 3, False), "w": pa.array([b"abcd"] * 50, pa.binary(4))})
    path = _write(tmp_path, t, compression="lz4")
    assert read_byte_array_chunk(*_chunk(path, "text"), text=True) is None
    assert read_fixed_chunk(*_chunk(path, "w"), 4) is None


def test_nested_and_damaged_chunks_fall_back(tmp_path):
    t = pa.table({"tags": pa.array([["a" * 200, "b" * 300]] * 50, pa.list_(pa.string())),
                  "text": _docs(50, 2, False)})
    path = _write(tmp_path, t)
    buf, _, col, max_def, max_rep = _chunk(path, "tags.list.element")
    assert read_byte_array_chunk(buf, 0, col, max_def, max_rep, text=True) is None
    buf, _, col, max_def, max_rep = _chunk(path, "text")
    # the chunk outside the buffer given (a range that does not hold it)
    assert read_byte_array_chunk(buf.slice(0, 100), 0, col, max_def, max_rep,
                                 text=True) is None
    # a damaged page header (the hash check catches this before; still no wrong answer)
    raw = bytearray(buf.to_pybytes())
    raw[col.data_page_offset] ^= 0xFF
    got = read_byte_array_chunk(pa.py_buffer(bytes(raw)), 0, col, max_def, max_rep, text=True)
    assert got is None or got.pylist(range(50)) == pq.read_table(path).column("text").to_pylist()


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_byte_array_pages_property(tmp_path_factory, data):
    n = data.draw(st.integers(1, 120))
    vals = data.draw(st.lists(st.none() | st.binary(min_size=0, max_size=400), min_size=n,
                              max_size=n))
    if all(v is None for v in vals):
        vals[0] = b""
    if sum(len(v or b"") for v in vals) < MIN_MEAN_VALUE_BYTES * n:
        vals = [None if v is None else v + b"p" * MIN_MEAN_VALUE_BYTES * n for v in vals]
    tmp = tmp_path_factory.mktemp("p")
    path = _write(tmp, pa.table({"b": pa.array(vals, pa.binary())}),
                  compression=data.draw(st.sampled_from(["none", "zstd"])),
                  data_page_version=data.draw(st.sampled_from(["1.0", "2.0"])),
                  data_page_size=data.draw(st.sampled_from([64, 1024, 1 << 20])))
    got = read_byte_array_chunk(*_chunk(path, "b"), text=False)
    assert got is not None and got.pylist(range(n)) == vals

"""The shard writer converts one row group at a time to its storage types (issue 43 item 5):
the codec sample, the bytes and the errors are those of converting the whole shard."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from zephon_store.format.encoding import (
    ElementNullError,
    storage_encodings,
    storage_schema,
    to_storage,
)
from zephon_store.write.shardwriter import (
    AUTO_SAMPLE_BYTES,
    WriteOptions,
    _sample,
    _storage_samples,
    choose_codecs,
    write_shard,
)


def _windows(rows: int, n: int, dtype, *, chunks: int = 1, nulls: bool = False,
             seed: int = 0) -> pa.ChunkedArray:
    rng = np.random.default_rng(seed)
    # Incompressible first half, compressible second half: where the sample stops matters.
    values = np.concatenate([rng.integers(0, 2**15, rows * n // 2),
                             np.zeros(rows * n - rows * n // 2, np.int64)]).astype(dtype)
    mask = np.zeros(rows, bool)
    if nulls:
        mask[1::7] = True
    arr = pa.FixedSizeListArray.from_arrays(pa.array(values), n,
                                            mask=pa.array(mask) if nulls else None)
    cuts = np.linspace(0, rows, chunks + 1).astype(int)
    return pa.chunked_array([arr.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])])


@pytest.mark.parametrize("rows,n,dtype,chunks,nulls,mode", [
    (3000, 2049, np.int32, 1, False, "split"),     # token windows: 24 MB, sample is a head
    (3000, 2049, np.int32, 3, False, "split"),     # chunked, the head spans no chunk border
    (40, 2049, np.int32, 2, False, "split"),       # under the sample size: every row
    (128, 2048, np.int32, 1, False, "split"),      # exactly the sample size
    (5, 300_000, np.int32, 2, False, "split"),     # one row is wider than the sample
    (3000, 513, np.float32, 4, True, "split"),     # nulls: converted whole
    (3000, 257, np.uint16, 2, False, "binary"),    # back to back: converted whole
    (20000, 64, np.uint8, 1, False, "split"),      # one-byte items stay back to back
])
def test_the_codec_sample_is_that_of_the_whole_shard(rows, n, dtype, chunks, nulls, mode):
    table = pa.table({"w": _windows(rows, n, dtype, chunks=chunks, nulls=nulls),
                      "id": np.arange(rows), "text": [f"doc {i}" for i in range(rows)]})
    table = table.slice(1)   # an offset into every column
    enc = storage_encodings(table.schema, mode)
    whole = to_storage(table, enc)
    assert whole.column("w").nbytes > AUTO_SAMPLE_BYTES or rows < 200
    assert _storage_samples(table, enc, storage_schema(table.schema, enc)) == [
        _sample(whole.column(i), f) for i, f in enumerate(whole.schema)]


def test_a_shard_written_by_row_group_decodes_to_its_rows_with_the_whole_shards_codecs(
        tmp_path):
    import pyarrow.parquet as pq

    table = pa.table({"w": _windows(600, 2049, np.int32, chunks=3), "n": np.arange(600)})
    info = write_shard(table, [256, 256, 88], str(tmp_path / "s.parquet"), WriteOptions())
    assert info.codecs == choose_codecs(to_storage(table, storage_encodings(table.schema)))
    assert [rg.rows for rg in info.row_groups] == [256, 256, 88]
    stored = pq.read_table(tmp_path / "s.parquet")
    assert stored.equals(to_storage(table, storage_encodings(table.schema)).combine_chunks())


def test_a_null_element_names_its_row_in_the_shard_and_leaves_no_file(tmp_path):
    values = pa.array(np.arange(30 * 4, dtype=np.int32)).to_pylist()
    values[25 * 4 + 2] = None    # row 25, in the third row group of 10
    table = pa.table({"w": pa.FixedSizeListArray.from_arrays(pa.array(values, pa.int32()), 4)})
    path = str(tmp_path / "s.parquet")
    with pytest.raises(ElementNullError, match=r"column 'w' row 25: ") as exc:
        write_shard(table, [10, 10, 10], path, WriteOptions())
    assert exc.value.row == 25
    assert not os.path.exists(path)

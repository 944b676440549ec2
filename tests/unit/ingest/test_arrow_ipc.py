"""Arrow IPC files as inputs: a table already in Arrow converts without a parse, to the same
shards as the same rows from Parquet."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from zephon_store import WriteOptions, convert, open_dataset
from zephon_store.errors import InputError
from zephon_store.ingest import InputOptions, expand_inputs, read_input

SMALL = WriteOptions(target_shard_bytes=300_000, row_group_bytes=40_000)


def _table(rows: int = 2000) -> pa.Table:
    rng = np.random.default_rng(3)
    windows = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.integers(0, 50_000, rows * 65).astype(np.int32)), 65)
    return pa.table({"id": np.arange(rows), "text": [f"document {i} " * (i % 7 + 1)
                                                     for i in range(rows)],
                     "tokens": windows,
                     "lang": pa.array(["en", "de"] * (rows // 2)).dictionary_encode()})


def _shards(url: str) -> list[str]:
    return sorted(os.listdir(os.path.join(url, "shards")))


@pytest.mark.parametrize("name", ["t.arrow", "t.feather", "t.ipc"])
def test_an_arrow_file_converts_to_the_shards_of_the_same_rows_from_parquet(tmp_path, name):
    table = _table()
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=300)
    if name.endswith(".feather"):
        feather.write_feather(table, tmp_path / name, compression="uncompressed",
                              chunksize=700)
    else:
        with pa.ipc.new_file(tmp_path / name, table.schema) as w:
            w.write_table(table, max_chunksize=700)
    ref = convert([str(tmp_path / "t.parquet")], str(tmp_path / "from_parquet"), options=SMALL)
    got = convert([str(tmp_path / name)], str(tmp_path / "from_arrow"), options=SMALL)
    assert got.num_shards == ref.num_shards > 2
    assert _shards(str(tmp_path / "from_arrow")) == _shards(str(tmp_path / "from_parquet"))
    back = open_dataset(str(tmp_path / "from_arrow")).take(np.arange(table.num_rows))
    # Dictionaries are decoded, as for Parquet inputs (docs/inputs.md).
    assert back.column("lang").type == pa.string()
    assert back.select(["id", "text", "tokens"]).equals(
        table.select(["id", "text", "tokens"]).combine_chunks())


def test_batches_hold_at_most_batch_rows(tmp_path):
    with pa.ipc.new_file(tmp_path / "t.arrow", _table(10).schema) as w:
        w.write_table(_table(10), max_chunksize=7)
    (f,) = expand_inputs(str(tmp_path / "t.arrow"))
    assert f.kind == "arrow"
    sizes = [b.num_rows for b in read_input(f, options=InputOptions(batch_rows=3))]
    assert sizes == [3, 3, 1, 3]


def test_a_damaged_or_compressed_file_is_one_clear_error(tmp_path):
    with pa.ipc.new_file(tmp_path / "t.arrow", _table(10).schema) as w:
        w.write_table(_table(10))
    data = (tmp_path / "t.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut.arrow: not a readable Arrow IPC file .*pass "
                                         r"--format"):
        list(read_input(expand_inputs(str(tmp_path / "cut.arrow"))[0]))
    (tmp_path / "t.arrow.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(InputError, match="Arrow IPC compresses its buffers itself"):
        list(read_input(expand_inputs(str(tmp_path / "t.arrow.zst"))[0]))

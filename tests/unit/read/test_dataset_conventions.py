"""Dataset follows Python's sequence conventions (issue 41 item 7): negative indices, slices
(a list of records, as ``ds[i]`` is one), and a repr that says what the dataset holds."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import write_jsonl_corpus
from zephon_store import SeqOutOfRangeError, convert, open_dataset
from zephon_store.write.shardwriter import WriteOptions


@pytest.fixture(scope="module")
def ds_and_records(tmp_path_factory):
    d = tmp_path_factory.mktemp("conventions")
    records = write_jsonl_corpus(d / "src", files=2, records=60, seed=3)
    convert([str(d / "src")], str(d / "ds"),
            options=WriteOptions(target_shard_bytes=8 << 10, row_group_rows=7))
    return open_dataset(str(d / "ds")), records


def test_negative_indices_count_from_the_end(ds_and_records):
    ds, records = ds_and_records
    n = len(ds)
    assert ds[-1] == records[-1] == ds[n - 1]
    assert ds[-n] == records[0]
    assert ds[np.int64(-2)] == records[-2]
    for bad in (-n - 1, n):
        with pytest.raises(SeqOutOfRangeError, match="out of range"):
            ds[bad]
    with pytest.raises(TypeError, match="bool"):
        ds[True]


@pytest.mark.parametrize("sl", [slice(1, 3), slice(None), slice(None, None, -1),
                                slice(-5, None), slice(2, -3, 4), slice(50, 5, -7),
                                slice(5, 5), slice(1000, None), slice(None, -1000)])
def test_slices_are_lists_of_records_as_python_slices(ds_and_records, sl):
    ds, records = ds_and_records
    got = ds[sl]
    assert isinstance(got, list)
    assert got == records[sl]


def test_a_slice_holds_what_indexing_holds(tmp_path):
    windows = np.arange(20 * 4, dtype=np.int32).reshape(20, 4)
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(windows.reshape(-1)), 4)
    pq.write_table(pa.table({"tokens": tokens, "k": pa.array(range(20))}), tmp_path / "w.parquet")
    convert([str(tmp_path / "w.parquet")], str(tmp_path / "ds"),
            options=WriteOptions(row_group_rows=6))
    ds = open_dataset(str(tmp_path / "ds"))
    got = ds[4:14:3]
    assert [r["k"] for r in got] == [4, 7, 10, 13]
    for rec, s in zip(got, range(4, 14, 3)):
        assert isinstance(rec["tokens"], np.ndarray) and rec["tokens"].dtype == np.int32
        assert rec["tokens"].tolist() == windows[s].tolist() == ds[s]["tokens"].tolist()
        assert isinstance(rec["k"], int)


def test_slice_steps_of_zero_are_refused_as_python_does(ds_and_records):
    ds, _ = ds_and_records
    with pytest.raises(ValueError, match="zero"):
        ds[::0]


def test_repr_says_what_the_dataset_holds(ds_and_records):
    ds, _ = ds_and_records
    text = repr(ds)
    assert " at 0x" not in text
    for part in (repr(ds.url), ds.dataset_id, f"num_samples={ds.num_samples}",
                 f"num_shards={ds.num_shards}", "'text': string"):
        assert part in text
    lines = text.splitlines()
    assert len(lines) <= 4 and max(map(len, lines[1:])) <= 100   # the first: the URL


def test_repr_of_a_wide_dataset_stays_short(tmp_path):
    pq.write_table(pa.table({f"c{i:03d}": [i] for i in range(200)}), tmp_path / "w.parquet")
    convert([str(tmp_path / "w.parquet")], str(tmp_path / "ds"))
    text = repr(open_dataset(str(tmp_path / "ds")))
    assert "'c000': int64" in text and "c199" not in text and "190 more" in text
    lines = text.splitlines()
    assert len(lines) <= 8 and max(map(len, lines[1:])) <= 100

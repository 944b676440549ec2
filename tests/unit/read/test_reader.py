"""Index and reader: locate is exact, take reads each needed row group once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import write_jsonl_corpus
from zephon_store import SeqOutOfRangeError, convert, open_dataset
from zephon_store.write.shardwriter import WriteOptions


@pytest.fixture(scope="module")
def ds_and_records(tmp_path_factory):
    d = tmp_path_factory.mktemp("reader")
    records = write_jsonl_corpus(d / "src", files=3, records=350, seed=5)
    convert([str(d / "src")], str(d / "ds"),
            options=WriteOptions(target_shard_bytes=30 << 10, row_group_rows=37))
    return open_dataset(str(d / "ds")), records


def test_locate_matches_a_brute_force_walk(ds_and_records):
    ds, _ = ds_and_records
    m = ds.manifest
    expected = []
    for rg in range(m.num_row_groups):
        shard = int(m.rg_shard[rg])
        for r in range(int(m.rg_rows[rg])):
            expected.append((shard, rg, r, int(m.rg_row_start[rg] - m.shard_row_start[shard]) + r))
    loc = ds.locate(np.arange(ds.num_samples))
    got = list(zip(loc.shard.tolist(), loc.row_group.tolist(), loc.row_in_group.tolist(),
                   loc.row_in_shard.tolist()))
    assert got == expected


@settings(max_examples=40, deadline=None)
@given(seqs=st.lists(st.integers(0, 1049), max_size=80))
def test_take_returns_rows_in_request_order(ds_and_records, seqs):
    ds, records = ds_and_records
    assert ds.take(seqs).to_pylist() == [records[s] for s in seqs]


def test_the_memory_cache_is_sized_by_memory_cache_bytes_and_its_old_name_warns(
        ds_and_records):
    url = ds_and_records[0].url
    assert open_dataset(url, memory_cache_bytes=0).row_groups._lru.budget == 0
    assert open_dataset(url).row_groups._lru.budget == 256 << 20
    with pytest.warns(DeprecationWarning, match=r"decode_cache_bytes=\) is now "
                                                r"memory_cache_bytes="):
        ds = open_dataset(url, decode_cache_bytes=1 << 20)
    assert ds.row_groups._lru.budget == 1 << 20


def test_take_reads_each_row_group_once_per_call(ds_and_records, monkeypatch):
    ds = open_dataset(ds_and_records[0].url, memory_cache_bytes=0)  # count real reads
    calls = []
    orig = ds.storage.read_range
    monkeypatch.setattr(ds.storage, "read_range",
                        lambda *a, **k: calls.append(a[1:3]) or orig(*a, **k))
    seqs = [0, 1, 2, 40, 41, 0, 1000, 2]
    ds.take(seqs)
    rg_reads = [c for c in calls]
    needed = {int(r) for r in ds.locate(seqs).row_group}
    # footers are fetched once per shard and kept; row groups once each
    shards = {int(s) for s in ds.locate(seqs).shard}
    assert len(rg_reads) - len(shards) <= len(needed)
    assert len(set(rg_reads)) == len(rg_reads)


@pytest.mark.parametrize("bad", [-1, 1050, 10**12])
def test_out_of_range_names_the_valid_range(ds_and_records, bad):
    ds, _ = ds_and_records
    with pytest.raises(SeqOutOfRangeError, match=r"0\.\.1049") as e:
        ds.take([0, bad])
    assert isinstance(e.value, IndexError)


def test_empty_take(ds_and_records):
    ds, _ = ds_and_records
    assert ds.take([]).num_rows == 0


def test_pickled_dataset_reads_the_same(ds_and_records):
    import pickle

    ds, records = ds_and_records
    ds2 = pickle.loads(pickle.dumps(ds))
    assert ds2.take([3, 700]).to_pylist() == [records[3], records[700]]


def test_corrupt_local_shard_raises_integrity_error(tmp_path):
    from zephon_store import IntegrityError

    write_jsonl_corpus(tmp_path / "src", files=1, records=200, seed=1)
    convert([str(tmp_path / "src")], str(tmp_path / "ds"),
            options=WriteOptions(target_shard_bytes=1 << 20, row_group_rows=50))
    ds = open_dataset(str(tmp_path / "ds"))
    m = ds.manifest
    path = tmp_path / "ds" / m.shard_path(0)
    data = bytearray(path.read_bytes())
    data[int(m.rg_offset[1]) + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert ds.take([0]).num_rows == 1  # row group 0 is intact
    with pytest.raises(IntegrityError, match="row group 1"):
        ds.take([60])


def test_getitem_is_take_of_one(ds_and_records):
    ds, records = ds_and_records
    for s in (0, 36, 37, 500, ds.num_samples - 1):
        assert ds[s] == records[s]
        assert ds[np.int64(s)] == records[s]
    for bad in (-ds.num_samples - 1, ds.num_samples):   # -1 is the last (issue 41)
        with pytest.raises(SeqOutOfRangeError, match="out of range"):
            ds[bad]
    with pytest.raises(TypeError):
        ds[1.5]


def test_getitem_gives_fixed_size_numeric_lists_as_numpy(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    windows = np.arange(40 * 5, dtype=np.int32).reshape(40, 5)
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(windows.reshape(-1)), 5)
    pq.write_table(pa.table({"tokens": tokens, "k": pa.array(range(40))}), tmp_path / "w.parquet")
    convert([str(tmp_path / "w.parquet")], str(tmp_path / "ds"),
            options=WriteOptions(row_group_rows=7))
    ds = open_dataset(str(tmp_path / "ds"))
    for s in (0, 6, 7, 39):
        rec = ds[s]
        assert isinstance(rec["tokens"], np.ndarray) and rec["tokens"].dtype == np.int32
        assert rec["tokens"].tolist() == windows[s].tolist()
        assert rec["k"] == s and isinstance(rec["k"], int)


@pytest.mark.parametrize("bad", [True, False, np.True_])
def test_bools_are_not_sequence_numbers(ds_and_records, bad):
    ds, _ = ds_and_records
    with pytest.raises(TypeError, match="bool"):
        ds[bad]
    with pytest.raises(TypeError, match="bool"):
        ds.take([bad])
    with pytest.raises(TypeError, match="bool"):
        ds.take(np.array([bad, bad]))


@pytest.mark.parametrize("seqs", [
    np.array([2**63 + 5], dtype=np.uint64),
    [2**64 - 1],
    [10**22],
    [-(10**22)],
])
def test_huge_sequence_numbers_are_out_of_range_not_wrapped(ds_and_records, seqs):
    ds, _ = ds_and_records
    with pytest.raises(SeqOutOfRangeError, match=r"0\.\.1049") as err:
        ds.take(seqs)
    assert str(int(np.asarray(seqs, dtype=object)[0])) in str(err.value)


def test_uint64_sequence_numbers_in_range_read(ds_and_records):
    ds, records = ds_and_records
    got = ds.take(np.array([3, 1049], dtype=np.uint64)).to_pylist()
    assert got == [records[3], records[1049]]


def test_parse_seq_for_the_cli():
    from zephon_store.format.index import parse_seq

    assert parse_seq("17", num_samples=1050) == 17
    assert parse_seq(" 1049 ", num_samples=1050) == 1049
    with pytest.raises(SeqOutOfRangeError, match=r"12345678901234567890123.*0\.\.1049"):
        parse_seq("12345678901234567890123", num_samples=1050)
    with pytest.raises(SeqOutOfRangeError, match="-1"):
        parse_seq("-1", num_samples=1050)
    for bad in ("", "1.5", "x", "1e3", "True"):
        with pytest.raises(ValueError, match="sequence number"):
            parse_seq(bad, num_samples=1050)


def test_gather_of_more_than_2_gib_of_text_works():
    """A take whose text passes 2 GiB (32-bit string offsets) comes back in chunks."""
    from zephon_store.read.dataset import gather_rows

    size = 64 << 20   # two row groups of two 64 MiB strings each, read 34 times over
    tables = [pa.table({"text": pa.array(["ab"[g] * size, "cd"[g] * size]),
                        "k": pa.array([10 * g, 10 * g + 1])}) for g in range(2)]
    inverse = np.array([0, 1] * 17)
    rows = np.array([0, 1, 1, 0] * 8 + [1, 1])
    got = gather_rows(tables, inverse, rows)
    assert got.schema == tables[0].schema and got.num_rows == 34
    assert got.column("text").num_chunks > 1
    assert got.column("k").to_pylist() == (10 * inverse + rows).tolist()
    firsts = []
    for chunk in got.column("text").chunks:   # each value's first byte, read in place
        offsets = np.frombuffer(chunk.buffers()[1], np.int32)[chunk.offset:][:len(chunk)]
        firsts += [chr(b) for b in np.frombuffer(chunk.buffers()[2], np.uint8)[offsets]]
    assert firsts == ["abcd"[2 * r + g] for g, r in zip(inverse, rows)]
    lengths = pc.binary_length(got.column("text"))
    assert pc.min(lengths).as_py() == size == pc.max(lengths).as_py()

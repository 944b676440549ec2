"""The shard writer's dictionary policy: ``use_dictionary`` True, False and "auto"."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_store.write.shardwriter import (
    DICTIONARY_SAMPLE_ROWS,
    WriteOptions,
    dictionary_columns,
    write_shard,
)


def _table(n=200):
    return pa.table({
        "text": pa.array([f"document {i} " + "x" * (i % 13) for i in range(n)]),
        "lang": pa.array([["en", "de", None][i % 3] for i in range(n)]),
        "blob": pa.array([i.to_bytes(4, "little") for i in range(n)], pa.large_binary()),
        "n": pa.array(range(n), pa.int64()),
        "tags": pa.array([[f"t{i}"] for i in range(n)], pa.list_(pa.string())),
        "empty": pa.array([None] * n, pa.string()),
    })


def _dictionary_pages(path):
    md = pq.ParquetFile(path).metadata
    out = {}
    for r in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(r).column(c)
            out.setdefault(col.path_in_schema, set()).add(col.has_dictionary_page)
    return out


def test_dictionary_columns_leaves_out_mostly_distinct_strings():
    t = _table()
    # distinct top-level strings and binaries are plain; repeated strings, numbers, nested
    # leaves and all-null columns keep a dictionary
    assert dictionary_columns(t) == ["lang", "n", "tags.list.element", "empty"]
    assert dictionary_columns(t, exclude={"n"}) == ["lang", "tags.list.element", "empty"]


def test_dictionary_columns_counts_only_valid_values_of_the_first_rows():
    half = [None if i % 2 else f"v{i}" for i in range(100)]   # 50 valid, all distinct
    assert dictionary_columns(pa.table({"s": half})) == []
    n = DICTIONARY_SAMPLE_ROWS
    # repeated in the first rows, distinct after them: the sample decides
    late = [f"r{i % 4}" for i in range(n)] + [f"d{i}" for i in range(5 * n)]
    assert dictionary_columns(pa.table({"s": late})) == ["s"]
    exactly_half = [f"v{i // 2}" for i in range(100)]            # 50 distinct of 100
    assert dictionary_columns(pa.table({"s": exactly_half})) == ["s"]


@pytest.mark.parametrize("policy", [True, False, "auto"])
def test_write_shard_applies_the_policy_and_round_trips(tmp_path, policy):
    t = _table()
    path = str(tmp_path / "s.parquet")
    write_shard(t, [120, 80], path, WriteOptions(use_dictionary=policy))
    pages = _dictionary_pages(path)
    want = {"text": False, "lang": True, "blob": False, "n": True,
            "tags.list.element": True, "empty": True}
    for col, has in pages.items():
        expected = policy if isinstance(policy, bool) else want[col]
        assert has == {expected}, (col, has)
    assert pq.read_table(path).equals(t)


def test_auto_is_the_default_and_bytes_are_deterministic(tmp_path):
    assert WriteOptions().use_dictionary == "auto"
    t = _table()
    a = write_shard(t, [200], str(tmp_path / "a.parquet"), WriteOptions())
    b = write_shard(t, [200], str(tmp_path / "b.parquet"), WriteOptions())
    assert a.name == b.name


def test_use_dictionary_rejects_other_values():
    with pytest.raises(ValueError, match="use_dictionary must be True, False or 'auto'"):
        WriteOptions(use_dictionary="yes")

"""Ingest: schema unification, normalisation, and the fast/fallback JSONL paths agreeing."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import first_parse_fails
from zephon_store.errors import InputError
from zephon_store.ingest import (
    InputFile,
    InputOptions,
    InputStats,
    conform_batch,
    normalize_batch,
    read_input,
    unify_schemas,
)
from zephon_store.ingest import jsonl as jsonl_mod
from zephon_store.ingest.schema import normalize_type


def schema(**types: pa.DataType) -> pa.Schema:
    return pa.schema(list(types.items()))


# -- unify_schemas ----------------------------------------------------------------------------

def test_unify_promotes_permissively():
    got = unify_schemas([
        ("a.jsonl", schema(x=pa.int32(), s=pa.string(), n=pa.null(),
                           m=pa.struct([("k", pa.int64())]))),
        ("b.parquet", schema(x=pa.int64(), s=pa.large_string(), n=pa.float64(),
                             m=pa.struct([("j", pa.string())]), extra=pa.bool_())),
    ])
    assert got == schema(x=pa.int64(), s=pa.large_string(), n=pa.float64(),
                         m=pa.struct([("k", pa.int64()), ("j", pa.string())]), extra=pa.bool_())


def test_unify_a_column_missing_somewhere_becomes_nullable():
    strict = pa.schema([pa.field("x", pa.int64(), nullable=False),
                        pa.field("y", pa.int64(), nullable=False)])
    got = unify_schemas([("a", strict), ("b", pa.schema([pa.field("x", pa.int64(), False)]))])
    assert got.field("x").nullable is False and got.field("y").nullable is True


def test_unify_conflict_names_both_files_and_the_column():
    with pytest.raises(InputError) as err:
        unify_schemas([("a.jsonl", schema(x=pa.int64())), ("b.jsonl", schema(x=pa.string()))])
    assert str(err.value) == ("column 'x' is int64 in a.jsonl but string in b.jsonl; make the "
                              "types agree or convert the files separately")


def test_unify_conflict_names_the_nested_column_and_the_file_that_set_it():
    meta = lambda t: pa.struct([("src", pa.string()), ("score", t)])  # noqa: E731
    with pytest.raises(InputError) as err:
        unify_schemas([
            ("a.jsonl", schema(id=pa.int64())),
            ("b.jsonl", schema(meta=meta(pa.null()))),
            ("c.jsonl", schema(meta=meta(pa.float64()))),
            ("d.jsonl", schema(meta=meta(pa.string()))),
        ])
    assert str(err.value).startswith(
        "column 'meta.score' is double in c.jsonl but string in d.jsonl")
    with pytest.raises(InputError, match=r"column 'tags\[\]' is int64 in a but string in b"):
        unify_schemas([("a", schema(tags=pa.list_(pa.int64()))),
                       ("b", schema(tags=pa.large_list(pa.string())))])
    with pytest.raises(InputError, match="timestamp.*tz=UTC.* in a but timestamp"):
        unify_schemas([("a", schema(t=pa.timestamp("us", "UTC"))),
                       ("b", schema(t=pa.timestamp("us")))])


def test_conform_batch():
    target = unify_schemas([("a", schema(x=pa.int32(), y=pa.string())),
                            ("b", schema(x=pa.int64(), z=pa.list_(pa.int64())))])
    b = pa.record_batch({"y": ["p", None], "x": pa.array([1, 2], pa.int32())})
    got = conform_batch(b, target)
    assert got.schema == target
    assert got.to_pylist() == [{"x": 1, "y": "p", "z": None}, {"x": 2, "y": None, "z": None}]
    with pytest.raises(ValueError, match="columns \\['w'\\]"):
        conform_batch(pa.record_batch({"w": [1]}), target)


# -- normalisation ----------------------------------------------------------------------------

@pytest.mark.parametrize("given_type, want", [
    (pa.dictionary(pa.int8(), pa.string()), pa.string()),
    (pa.list_(pa.field("element", pa.dictionary(pa.int32(), pa.large_string()))),
     pa.list_(pa.large_string())),
    (pa.struct([("c", pa.dictionary(pa.int16(), pa.int64()))]), pa.struct([("c", pa.int64())])),
    (pa.string_view(), pa.large_string()),
    (pa.binary_view(), pa.large_binary()),
    (pa.timestamp("ns", "UTC"), pa.timestamp("ns", "UTC")),
    (pa.large_list(pa.int8()), pa.large_list(pa.int8())),
])
def test_normalize_type(given_type, want):
    assert normalize_type(given_type) == want
    assert str(normalize_type(given_type)) == str(want)


def test_normalize_batch_decodes_and_drops_metadata():
    b = pa.record_batch(
        [pa.array(["x", "y", "x"]).dictionary_encode(), pa.array(["a", None, "c"], pa.string_view())],
        schema=pa.schema([pa.field("c", pa.dictionary(pa.int32(), pa.string()),
                                   metadata={"k": "v"}),
                          pa.field("s", pa.string_view())], metadata={"pandas": "{}"}))
    got = normalize_batch(b)
    assert got.schema == pa.schema([("c", pa.string()), ("s", pa.large_string())])
    assert got.schema.metadata is None and got.schema.field("c").metadata is None
    assert got.to_pylist() == b.to_pylist()
    plain = pa.record_batch({"i": [1]})
    assert normalize_batch(plain) is plain


# -- JSONL: fast path, fallback and safety net agree ------------------------------------------

def _read(path, **kw) -> pa.Table:
    f = InputFile(str(path), "jsonl", None, path.stat().st_size)
    got = list(read_input(f, **kw))
    if not got:
        return pa.table({})
    target = unify_schemas([(f.url, b.schema) for b in got])  # chunks may differ
    return pa.Table.from_batches([conform_batch(b, target) for b in got])


def test_safety_net_finds_what_the_python_rules_missed(tmp_path, monkeypatch):
    """If the Python pass ever lets a line through that pyarrow refuses, bisection names it."""
    monkeypatch.setattr(jsonl_mod, "check_chunk",
                        lambda chunk, file, kinds, **kw: [
                            (chunk.first_line + i, raw)
                            for i, raw in enumerate(chunk.data.split(b"\n")) if raw.strip()])
    lines = [json.dumps({"id": i}) for i in range(20)]
    lines[12] = json.dumps({"id": "twelve"})
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"s\.jsonl line 13: pyarrow refuses the record "
                                         r"\(Column\(/id\) changed from number to string"):
        _read(path)
    stats = InputStats()
    got = _read(path, options=InputOptions(on_error="skip"), stats=stats)
    assert got.column("id").to_pylist() == [i for i in range(20) if i != 12]
    assert stats.schema_mismatch == 1


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                         st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=8), st.sampled_from(["2020-01-01", "2020-01-01 10:00"]))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from("abc"), inner, max_size=3)),
    max_leaves=6)
records = st.lists(st.one_of(st.dictionaries(st.sampled_from("xyz"), json_values, max_size=3),
                             json_values), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=records)
def test_skip_mode_equals_the_clean_file_and_both_paths_agree(tmp_path, rows):
    """Skip mode on any lines == raise mode on the file without the lines it named, types
    included; and on a clean file the forced fallback path == the fast path."""
    path = tmp_path / "h.jsonl"
    lines = [json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    stats = InputStats()
    got = _read(path, options=InputOptions(on_error="skip"), stats=stats)
    assert got.num_rows + stats.skipped == len(rows)
    if stats.skipped > InputStats.MAX_EXAMPLES:
        return
    bad = {int(e.split(" line ")[1].split(":")[0]) for e in stats.examples}
    assert len(bad) == stats.skipped
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(f"{x}\n" for i, x in enumerate(lines, 1) if i not in bad))
    fast = _read(clean)  # raise mode: must not raise
    assert fast.schema == got.schema and fast.equals(got)
    with first_parse_fails("forced"):
        slow = _read(clean)
    assert slow.schema == fast.schema and slow.equals(fast)

"""Ingest: Parquet from several writers, plain text (file and line modes), CSV and TSV."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import zoneinfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_store.errors import InputError
from zephon_store.ingest import InputOptions, InputStats, expand_inputs, read_input, unify_schemas
from zephon_store.ingest import lines as lines_mod
from zephon_store.ingest.options import DEFAULT_OPTIONS

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
UTC = dt.timezone.utc


def read_all(path, options=DEFAULT_OPTIONS, **kw) -> pa.Table:
    (f,) = expand_inputs([str(path)], options=options)
    return pa.Table.from_batches(list(read_input(f, options=options, **kw)))


def batches(path, options=DEFAULT_OPTIONS, **kw) -> list[pa.RecordBatch]:
    (f,) = expand_inputs([str(path)], options=options)
    return list(read_input(f, options=options, **kw))


# -- Parquet ----------------------------------------------------------------------------------

PQ_ROWS = [
    {"text": "a", "cat": "x", "big": "ü" * 3, "tags": ["t1", None], "meta": {"k": 1, "s": "u"},
     "ts": dt.datetime(2020, 1, 1, 12, tzinfo=PARIS), "n": 1},
    {"text": None, "cat": "y", "big": None, "tags": [], "meta": None, "ts": None, "n": None},
    {"text": "c", "cat": None, "big": "", "tags": None, "meta": {"k": None, "s": None},
     "ts": dt.datetime(2021, 6, 1, tzinfo=PARIS), "n": 3},
]


def test_parquet_from_pyarrow_dictionary_nested_large_string_tz(tmp_path):
    table = pa.Table.from_pylist(PQ_ROWS, schema=pa.schema([
        ("text", pa.string()), ("cat", pa.dictionary(pa.int32(), pa.string())),
        ("big", pa.large_string()), ("tags", pa.list_(pa.dictionary(pa.int8(), pa.string()))),
        ("meta", pa.struct([("k", pa.int64()), ("s", pa.string())])),
        ("ts", pa.timestamp("us", "Europe/Paris")), ("n", pa.int32()),
    ]).with_metadata({"huggingface": '{"info": {"features": {}}}'}))
    path = tmp_path / "a.parquet"
    pq.write_table(table, path, row_group_size=2)
    got = read_all(path)
    assert got.to_pylist() == PQ_ROWS
    # Dictionaries decoded, everything else as written, writer metadata dropped.
    assert got.schema == pa.schema([
        ("text", pa.string()), ("cat", pa.string()), ("big", pa.large_string()),
        ("tags", pa.list_(pa.string())),
        ("meta", pa.struct([("k", pa.int64()), ("s", pa.string())])),
        ("ts", pa.timestamp("us", "Europe/Paris")), ("n", pa.int32()),
    ])
    assert got.schema.metadata is None


def test_parquet_batches_follow_batch_rows_across_row_groups(tmp_path):
    path = tmp_path / "many.pq"
    pq.write_table(pa.table({"i": list(range(1000))}), path, row_group_size=300)
    got = batches(path, options=InputOptions(batch_rows=128))
    assert max(b.num_rows for b in got) == 128
    assert [i for b in got for i in b.column(0).to_pylist()] == list(range(1000))


def test_parquet_from_pandas_keeps_a_real_index(tmp_path):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"text": ["a", "b", None], "cat": pd.Categorical(["x", "y", "x"]),
                       "ts": pd.to_datetime(["2020-01-01", None, "2021-01-01"]).tz_localize(UTC)})
    df.to_parquet(tmp_path / "range.parquet")  # RangeIndex: metadata only
    # An evenly spaced integer index would be stored as a RangeIndex (metadata only).
    df.set_index(pd.Index([10, 30, 20], name="doc_id")).to_parquet(tmp_path / "named.parquet")
    df.set_index(pd.Index([7, 9, 8])).to_parquet(tmp_path / "unnamed.parquet")
    plain = read_all(tmp_path / "range.parquet")
    assert plain.column_names == ["text", "cat", "ts"]
    assert plain.column("cat").type == pa.string()
    assert plain.column("text").to_pylist() == ["a", "b", None]
    assert plain.column("ts").to_pylist()[0] == dt.datetime(2020, 1, 1, tzinfo=UTC)
    assert read_all(tmp_path / "named.parquet").column("doc_id").to_pylist() == [10, 30, 20]
    assert read_all(tmp_path / "unnamed.parquet").column("__index_level_0__").to_pylist() == [
        7, 9, 8]


def test_parquet_from_polars(tmp_path):
    pl = pytest.importorskip("polars")
    pl.DataFrame({
        "text": ["a", None, "c"], "cat": pl.Series(["x", "y", "x"], dtype=pl.Categorical),
        "l": [[1, 2], None, []], "s": [{"a": 1, "b": "x"}, None, {"a": 2, "b": None}],
        "ts": [dt.datetime(2020, 1, 1, tzinfo=UTC), None, dt.datetime(2021, 1, 1, tzinfo=UTC)],
    }).write_parquet(tmp_path / "pl.parquet")
    got = read_all(tmp_path / "pl.parquet")
    assert got.to_pylist() == [
        {"text": "a", "cat": "x", "l": [1, 2], "s": {"a": 1, "b": "x"},
         "ts": dt.datetime(2020, 1, 1, tzinfo=UTC)},
        {"text": None, "cat": "y", "l": None, "s": None, "ts": None},
        {"text": "c", "cat": "x", "l": [], "s": {"a": 2, "b": None},
         "ts": dt.datetime(2021, 1, 1, tzinfo=UTC)},
    ]
    assert not any(pa.types.is_dictionary(t) or pa.types.is_string_view(t) for t in got.schema.types)
    assert all(f.metadata is None for f in got.schema)
    # polars' large_string unifies with a pyarrow file's string.
    other = pa.schema([("text", pa.string()), ("cat", pa.string())])
    assert unify_schemas([("pl", got.schema), ("pa", other)]).field("text").type == pa.large_string()


def test_parquet_from_duckdb(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    out = str(tmp_path / "duck.parquet")
    duckdb.connect().execute(
        "COPY (SELECT i::INTEGER AS i, 'row ' || i AS s, [i, i + 1] AS l, {'a': i} AS st, "
        "TIMESTAMPTZ '2020-01-01 00:00:00+00' AS ts, NULL::VARCHAR AS nul "
        f"FROM range(3) t(i)) TO '{out}' (FORMAT PARQUET)")
    got = read_all(out)
    assert got.to_pylist()[2] == {"i": 2, "s": "row 2", "l": [2, 3], "st": {"a": 2},
                                  "ts": dt.datetime(2020, 1, 1, tzinfo=UTC), "nul": None}
    assert str(got.schema.field("l").type) == "list<item: int64>"  # written as "element"


def test_parquet_errors(tmp_path):
    (tmp_path / "not.parquet").write_bytes(b"this is not parquet at all")
    with pytest.raises(InputError, match=r"not\.parquet: not a readable Parquet file"):
        read_all(tmp_path / "not.parquet")
    pq.write_table(pa.table({"i": [1]}), tmp_path / "ok.parquet")
    (tmp_path / "ok.parquet.gz").write_bytes(gzip.compress((tmp_path / "ok.parquet").read_bytes()))
    with pytest.raises(InputError, match="cannot be read through gzip; decompress the file first"):
        read_all(tmp_path / "ok.parquet.gz")
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(InputError, match="empty.parquet: not a readable Parquet file"):
        read_all(tmp_path / "empty.parquet")


# -- text -------------------------------------------------------------------------------------

def test_text_file_mode(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"first\nsecond\r\n\n")
    (tmp_path / "b.md.gz").write_bytes(gzip.compress("# héllo\n".encode("utf-8-sig")))
    (tmp_path / "c.txt").write_bytes(b"")
    rows = [r for f in expand_inputs([str(tmp_path)]) for b in read_input(f)
            for r in b.to_pylist()]
    assert rows == [{"text": "first\nsecond\r\n\n"}, {"text": "# héllo\n"}, {"text": ""}]


def test_text_line_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(lines_mod, "CHUNK_BYTES", 16)  # lines cross chunk boundaries
    text = "one\r\ntwo\n\n  three  \nfour without newline"
    (tmp_path / "l.txt").write_bytes(text.encode())
    opts = InputOptions(text_mode="line", text_column="line", batch_rows=2)
    got = batches(tmp_path / "l.txt", options=opts)
    assert all(b.schema == pa.schema([("line", pa.string())]) for b in got)
    assert [r["line"] for b in got for r in b.to_pylist()] == [
        "one", "two", "", "  three  ", "four without newline"]
    (tmp_path / "n.txt").write_bytes(b"a\n\n")
    assert read_all(tmp_path / "n.txt", options=opts).column("line").to_pylist() == ["a", ""]


def test_text_bad_bytes(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"ok\nstill ok\nbro\xc3ken\nfine\n")
    for mode in ("file", "line"):
        opts = InputOptions(text_mode=mode)
        with pytest.raises(InputError) as err:
            read_all(tmp_path / "bad.txt", options=opts)
        assert str(err.value).startswith(
            f"{tmp_path / 'bad.txt'} line 3: cannot decode byte 0xc3 as utf-8 at byte offset 15 "
            f"(column 4: invalid continuation byte)")
        stats = InputStats()
        got = batches(tmp_path / "bad.txt", InputOptions(text_mode=mode, on_error="skip"),
                      stats=stats)
        assert stats.bad_encoding == 1
        assert [r["text"] for b in got for r in b.to_pylist()] == (
            [] if mode == "file" else ["ok", "still ok", "fine"])
    latin = InputOptions(text_mode="line", encoding="latin-1")
    assert read_all(tmp_path / "bad.txt", options=latin).column("text").to_pylist()[2] == "broÃken"


# -- CSV --------------------------------------------------------------------------------------

CSV_TEXT = ('id,text,label\n1,plain,0\n2,"with, comma",1\n3,"multi\nline ""quoted""",\n'
            '\n4,,x\n')
CSV_ROWS = [{"id": "1", "text": "plain", "label": "0"},
            {"id": "2", "text": "with, comma", "label": "1"},
            {"id": "3", "text": 'multi\nline "quoted"', "label": ""},
            {"id": "4", "text": "", "label": "x"}]


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_csv_round_trip_as_strings(tmp_path, suffix, monkeypatch):
    monkeypatch.setattr(lines_mod, "CHUNK_BYTES", 8)
    data = CSV_TEXT.encode()
    (tmp_path / f"a.csv{suffix}").write_bytes(gzip.compress(data) if suffix else data)
    got = read_all(tmp_path / f"a.csv{suffix}")
    assert got.schema == pa.schema([("id", pa.string()), ("text", pa.string()),
                                    ("label", pa.string())])
    assert got.to_pylist() == CSV_ROWS


def test_tsv_and_other_delimiters(tmp_path):
    (tmp_path / "a.tsv").write_text("a\tb\n1\tx,y\n")
    assert read_all(tmp_path / "a.tsv").to_pylist() == [{"a": "1", "b": "x,y"}]
    (tmp_path / "b.csv").write_text("a;b\n1;x,y\n")
    assert read_all(tmp_path / "b.csv", options=InputOptions(csv_delimiter=";")).to_pylist() == [
        {"a": "1", "b": "x,y"}]


def test_csv_other_encoding(tmp_path):
    (tmp_path / "l.csv").write_bytes("name,city\nJosé,Zürich\n".encode("latin-1"))
    got = read_all(tmp_path / "l.csv", options=InputOptions(encoding="latin-1"))
    assert got.to_pylist() == [{"name": "José", "city": "Zürich"}]


def test_csv_bad_rows_name_the_line(tmp_path):
    text = CSV_TEXT + "5,too,many,fields\n6,ok,1\n7\n"
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(InputError) as err:
        read_all(tmp_path / "bad.csv")
    # Line 8 counts the blank line and both lines of the quoted record.
    assert str(err.value) == (
        f"{tmp_path / 'bad.csv'} line 8: expected 3 fields, got 4: '5,too,many,fields'; "
        f"fix the row or pass --on-error skip to skip bad records")
    assert err.value.line == 8
    stats = InputStats()
    got = read_all(tmp_path / "bad.csv", options=InputOptions(on_error="skip"), stats=stats)
    assert got.to_pylist() == CSV_ROWS + [{"id": "6", "text": "ok", "label": "1"}]
    assert stats.bad_row == 2 and stats.examples[1].startswith(f"{tmp_path / 'bad.csv'} line 10:")


def test_csv_edge_cases(tmp_path):
    (tmp_path / "h.csv").write_text("a,b\n")
    assert batches(tmp_path / "h.csv") == []
    (tmp_path / "e.csv").write_bytes(b"")
    assert batches(tmp_path / "e.csv") == []
    (tmp_path / "d.csv").write_text("a,b,a\n1,2,3\n")
    with pytest.raises(InputError, match=r"d\.csv line 1: the header names \['a'\] more than once"):
        read_all(tmp_path / "d.csv")
    (tmp_path / "u.csv").write_bytes(b"a,b\n1,\xff\n2,ok\n")
    with pytest.raises(InputError, match=r"u\.csv line 2: cannot decode byte 0xff"):
        read_all(tmp_path / "u.csv")
    stats = InputStats()
    assert read_all(tmp_path / "u.csv", options=InputOptions(on_error="skip"),
                    stats=stats).to_pylist() == [{"a": "2", "b": "ok"}]
    assert stats.bad_encoding == 1


def test_csv_bad_bytes_deep_in_the_stream(tmp_path, monkeypatch):
    monkeypatch.setattr(lines_mod, "CHUNK_BYTES", 16)  # the error comes from inside pyarrow's read
    (tmp_path / "e.csv").write_bytes(b"a,b\n" + b"1,x\n" * 50 + b"2,\xff\n3,y\n")
    with pytest.raises(InputError, match=r"e\.csv line 52: cannot decode byte 0xff .* offset 206"):
        read_all(tmp_path / "e.csv")


def test_pandas_csv_round_trip(tmp_path):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"t": ["x\ty", 'q"uote', "nl\nx", "", "ü"], "n": ["1", "2", "3", "4", "5"]})
    buf = io.StringIO()
    df.to_csv(buf, sep="\t", index=False)
    (tmp_path / "p.tsv").write_text(buf.getvalue())
    assert read_all(tmp_path / "p.tsv").to_pylist() == df.to_dict("records")

"""Ingest: options, input expansion and detection, compression, JSON Lines (both paths)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import pickle
import uuid

import fsspec
import pyarrow as pa
import pytest
import zstandard

from tests.helpers import first_parse_fails
from zephon_store.errors import InputError, InputNotFoundError
from zephon_store.ingest import (
    InputFile,
    InputOptions,
    InputStats,
    detect_kind,
    expand_inputs,
    read_input,
    unify_schemas,
)
from zephon_store.ingest import lines as lines_mod

RECORDS = [
    {"id": 0, "text": "héllo ∑ wörld", "score": 0.5, "tags": ["a", "b"], "meta": {"src": "web", "n": 1}},
    {"id": 1, "text": "", "score": None, "tags": [], "meta": {"src": "book", "n": None}},
    {"id": 2, "text": "line\nbreak \"quoted\"", "score": 2.25, "tags": None, "meta": None},
    {"id": 3, "text": "no score key", "tags": ["c"], "meta": {"src": "x", "n": 7}},
]
COLUMNS = ["id", "text", "score", "tags", "meta"]


def expected(records: list[dict]) -> list[dict]:
    return [{c: r.get(c) for c in COLUMNS} for r in records]


def jsonl_bytes(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def read_all(f: InputFile, **kw) -> pa.Table:
    return pa.Table.from_batches(list(read_input(f, **kw)))


def one(path, **kw) -> InputFile:
    (f,) = expand_inputs([str(path)], **kw)
    return f


# -- options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"batch_rows": 0}, "batch_rows must be > 0, got 0"),
    ({"batch_rows": True}, "batch_rows must be an int, got True"),
    ({"format": "xml"}, "format must be one of jsonl|parquet|text|csv|arrow or None, got 'xml'"),
    ({"text_mode": "para"}, "text_mode must be one of file|line, got 'para'"),
    ({"on_error": "ignore"}, "on_error must be one of raise|skip, got 'ignore'"),
    ({"text_column": ""}, "text_column must be a non-empty string"),
    ({"csv_delimiter": ";;"}, "csv_delimiter must be one character"),
    ({"encoding": "no-such-codec"}, "encoding must be a codec Python knows"),
    ({"encoding": "utf-16"}, "encoding must be ASCII-compatible"),
])
def test_options_are_validated(kwargs, message):
    with pytest.raises(ValueError) as err:
        InputOptions(**kwargs)
    assert message in str(err.value)


def test_input_file_is_frozen_and_validated():
    f = InputFile("/d/a.jsonl", "jsonl", None, 3)
    with pytest.raises(AttributeError):
        f.kind = "csv"  # type: ignore[misc]
    with pytest.raises(ValueError, match="kind must be one of"):
        InputFile("/d/a", "xml", None, 0)


def test_stats_merge_and_dict():
    a, b = InputStats(), InputStats()
    a.record_skip("malformed_json", "a line 1")
    for i in range(12):
        b.record_skip("bad_row", f"b line {i}")
    a.merge(b)
    assert (a.malformed_json, a.bad_row, a.skipped) == (1, 12, 13)
    assert len(a.examples) == InputStats.MAX_EXAMPLES and a.examples[0] == "a line 1"
    assert a.to_dict()["skipped"] == 13
    assert pickle.loads(pickle.dumps(a)) == a  # parser processes send theirs back
    with pytest.raises(ValueError):
        a.record_skip("nope", "x")


# -- detection and expansion -----------------------------------------------------------------

@pytest.mark.parametrize("name, kind", [
    ("a.jsonl", "jsonl"), ("a.JSON.gz", "jsonl"), ("s3://b/k/a.ndjson.zst", "jsonl"),
    ("a.jsonl.zstd", "jsonl"), ("a.parquet", "parquet"), ("a.pq", "parquet"),
    ("a.txt.bz2", "text"), ("README.md", "text"), ("x.py", "text"), ("a.rst.xz", "text"),
    ("a.csv", "csv"), ("a.tsv.gz", "csv"),
])
def test_detect_kind(name, kind):
    assert detect_kind(name) == kind


def test_unknown_kind_says_what_to_pass():
    with pytest.raises(InputError) as err:
        detect_kind("data/part-0000.bin.gz")
    assert str(err.value) == ("cannot tell the format of data/part-0000.bin.gz; "
                              "pass --format jsonl|parquet|text|csv|arrow")
    assert detect_kind("data/part-0000.bin.gz", "jsonl") == "jsonl"


def test_expand_directories_globs_and_duplicates(tmp_path):
    for rel in ["a.jsonl", "sub/b.jsonl.gz", "sub/deeper/c.csv", "_SUCCESS", ".hidden.jsonl",
                "_tmp/d.jsonl", ".git/e.jsonl", "sub/.f.jsonl", "empty.txt"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"" if rel == "empty.txt" else b"{}\n")
    files = expand_inputs([str(tmp_path), str(tmp_path / "*.jsonl"), str(tmp_path / "a.jsonl")])
    rels = [f.url[len(str(tmp_path)) + 1:] for f in files]
    assert rels == ["a.jsonl", "empty.txt", "sub/b.jsonl.gz", "sub/deeper/c.csv"]
    assert [(f.kind, f.compression) for f in files] == [
        ("jsonl", None), ("text", None), ("jsonl", "gzip"), ("csv", None)]
    assert files[1].size == 0 and files[0].size == 3  # an empty file is not an error
    # A glob skips hidden names below its wildcard unless it spells the dot itself; the
    # directories it matches are walked.
    assert expand_inputs([str(tmp_path / "*")]) == files
    hidden = expand_inputs([str(tmp_path / ".h*.jsonl")])
    assert [f.url for f in hidden] == [str(tmp_path / ".hidden.jsonl")]
    # A file named directly is taken even when its name starts with '_' or '.'.
    assert one(tmp_path / "_tmp" / "d.jsonl").url == str(tmp_path / "_tmp" / "d.jsonl")
    recursive = expand_inputs([str(tmp_path / "**" / "*.jsonl*")])
    assert {f.url.rsplit("/", 1)[1] for f in recursive} == {"a.jsonl", "b.jsonl.gz"}


def test_expand_relative_paths_are_absolute(tmp_path, monkeypatch):
    (tmp_path / "a.jsonl").write_bytes(b"{}\n")
    monkeypatch.chdir(tmp_path)
    assert expand_inputs(["a.jsonl", "./a.jsonl", "*.jsonl", f"file://{tmp_path}/a.jsonl"]) == [
        InputFile(str(tmp_path / "a.jsonl"), "jsonl", None, 3)]


def test_expand_nothing_matched(tmp_path):
    with pytest.raises(InputNotFoundError, match=r"nope/\*\.jsonl matched no input files"):
        expand_inputs([str(tmp_path / "nope" / "*.jsonl")])
    with pytest.raises(InputNotFoundError, match="missing.jsonl matched no input files"):
        expand_inputs([str(tmp_path / "missing.jsonl")])
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "_SUCCESS").write_bytes(b"")
    with pytest.raises(FileNotFoundError):  # InputNotFoundError is a FileNotFoundError
        expand_inputs([str(tmp_path / "only")])


def test_expand_format_forces_kind_and_unknown_files_fail_early(tmp_path):
    (tmp_path / "part-0").write_bytes(b"{}\n")
    with pytest.raises(InputError, match="cannot tell the format of .*part-0"):
        expand_inputs([str(tmp_path)])
    (f,) = expand_inputs([str(tmp_path)], options=InputOptions(format="jsonl"))
    assert f.kind == "jsonl" and read_all(f).num_rows == 1


@pytest.fixture
def memdir():
    root = f"memory://ingest-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    fs.rm(root.removeprefix("memory://"), recursive=True)


def test_memory_urls(memdir):
    fs = fsspec.filesystem("memory")
    for name, data in [("x/a.jsonl", jsonl_bytes(RECORDS[:2])),
                       ("x/b.jsonl.gz", gzip.compress(jsonl_bytes(RECORDS[2:]))),
                       ("x/_c.jsonl", b"{}\n")]:
        with fs.open(f"{memdir}/{name}", "wb") as fh:
            fh.write(data)
    by_dir = expand_inputs([f"{memdir}/x"])
    by_glob = expand_inputs([f"{memdir}/x/*.jsonl*"])
    assert by_dir == by_glob and [f.url.rsplit("/", 1)[1] for f in by_dir] == [
        "a.jsonl", "b.jsonl.gz"]
    assert by_dir[0].url.startswith("memory://")
    rows = [r for f in by_dir for r in read_all(f).to_pylist()]
    assert rows == expected(RECORDS)


# -- JSON Lines: round trips -----------------------------------------------------------------

def _zstd_multiframe(data: bytes) -> bytes:
    c = zstandard.ZstdCompressor(level=3)
    third = len(data) // 3
    return b"".join(c.compress(part) for part in (data[:third], data[third:2 * third],
                                                   data[2 * third:]))


COMPRESSORS = {
    "": lambda d: d,
    ".gz": lambda d: gzip.compress(d, mtime=0),
    ".zst": _zstd_multiframe,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
}


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_jsonl_round_trip(tmp_path, suffix):
    records = RECORDS * 50
    path = tmp_path / f"data.jsonl{suffix}"
    path.write_bytes(COMPRESSORS[suffix](jsonl_bytes(records)))
    f = one(path)
    batches = list(read_input(f, options=InputOptions(batch_rows=64)))
    assert max(b.num_rows for b in batches) == 64
    table = pa.Table.from_batches(batches)
    assert table.to_pylist() == expected(records)
    assert table.schema == pa.schema([
        ("id", pa.int64()), ("text", pa.string()), ("score", pa.float64()),
        ("tags", pa.list_(pa.string())), ("meta", pa.struct([("src", pa.string()),
                                                             ("n", pa.int64())]))])


def test_multi_member_gzip(tmp_path):
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes(RECORDS[:2])) + gzip.compress(jsonl_bytes(RECORDS[2:])))
    assert read_all(one(path)).to_pylist() == expected(RECORDS)


def test_jsonl_details(tmp_path):
    """Blank lines skipped, CRLF, BOM, no final newline, date-like strings stay strings."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1, "t": "2020-01-01T00:00:00Z"}\r\n\r\n   \n'
                     b'{"a": 2.5, "t": "2021-02-03", "n": NaN}\n{"b": [1, 2.5]}')
    table = read_all(one(path))
    assert table.schema == pa.schema([("a", pa.float64()), ("t", pa.string()),
                                      ("n", pa.float64()), ("b", pa.list_(pa.float64()))])
    rows = table.to_pylist()
    assert rows[0] == {"a": 1.0, "t": "2020-01-01T00:00:00Z", "n": None, "b": None}
    assert rows[1]["t"] == "2021-02-03" and rows[1]["n"] != rows[1]["n"]  # NaN
    assert rows[2] == {"a": None, "t": None, "n": None, "b": [1.0, 2.5]}


@pytest.mark.parametrize("records", [
    [{"b": [None, 1]}, {"b": [5]}],  # leading nulls in a list: pyarrow drops them, invalid array
    [{"y": {"b": [None, "zz"]}}],
    [{"b": [None, None]}, {"b": [None]}, {"b": []}, {"b": None}],  # list<null>: rebuilt
    [{"y": [{"b": [None, None]}, None, {"b": [None]}]}],
    [{"b": [[None, 1], [None]]}],
    [{"t": ["2020-01-01", None]}, {"t": [None, None, "2020-01-02 10:00"]}],
])
def test_jsonl_pyarrow_list_pitfalls(tmp_path, records):
    path = tmp_path / "p.jsonl"
    path.write_bytes(jsonl_bytes(records))
    table = read_all(one(path))
    table.validate(full=True)
    assert table.to_pylist() == records


@pytest.mark.parametrize("data", [b"null\n", b"  null\r\n\n", b'{"a": 1}\n' + b"null\n" * 5000])
def test_jsonl_null_lines_never_reach_pyarrow(tmp_path, data):
    path = tmp_path / "n.jsonl"
    path.write_bytes(data)
    with pytest.raises(InputError, match="n.jsonl line [12]: a null is not a record"):
        read_all(one(path))
    stats = InputStats()
    got = list(read_input(one(path), options=InputOptions(on_error="skip"), stats=stats))
    assert sum(b.num_rows for b in got) == data.count(b"{") and stats.not_an_object >= 1


def test_jsonl_empty_file_yields_nothing(tmp_path):
    (tmp_path / "e.jsonl").write_bytes(b"")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b"\n\n"))
    stats = InputStats()
    for f in expand_inputs([str(tmp_path)]):
        assert list(read_input(f, stats=stats)) == []
    assert stats.files == 2 and stats.rows == 0


def test_jsonl_other_encoding(tmp_path):
    path = tmp_path / "l1.jsonl"
    path.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    with pytest.raises(InputError, match="line 1: cannot decode byte 0xe9"):
        read_all(one(path))
    assert read_all(one(path), options=InputOptions(encoding="latin-1")).to_pylist() == [
        {"text": "café"}]


def test_jsonl_corrupt_compression(tmp_path):
    data = gzip.compress(jsonl_bytes(RECORDS * 200))
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "n.jsonl.zst").write_bytes(b"not zstd at all\n")
    t, n = expand_inputs([str(tmp_path)])[::-1]
    with pytest.raises(InputError, match=f"{t.url}: truncated compressed stream: the gzip data "
                                         f"ends after {len(data) // 2} of its bytes"):
        read_all(t)
    with pytest.raises(InputError, match=f"{n.url}: not a zstd file: it starts with the bytes "
                                         f"6e 6f 74 20 7a 73, not 28 b5 2f fd"):
        read_all(n)


# -- JSON Lines: bad records -----------------------------------------------------------------

BAD_CASES = [
    # (bad line, stats kind, message after "<file> line 3: ")
    (b'{"id": 9, "text": "x",}', "malformed_json",
     "malformed JSON (Expecting property name enclosed in double quotes: line 1 column 23); "
     "fix the line or pass --on-error skip to skip bad records"),
    (b'{"id": 9, "text": "\xff\xfe"}', "bad_encoding",
     "cannot decode byte 0xff as utf-8 at byte offset {offset} (column 20: invalid start byte); "
     "fix the bytes, pass --encoding if the file is not UTF-8, or pass --on-error skip"),
    (b'[1, 2, 3]', "not_an_object", "an array is not a record; each line must hold one JSON "
                                    "object; fix the line or pass --on-error skip"),
    (b'"just a string"', "not_an_object", "a string is not a record"),
    # pyarrow 26 would read this as a row of nulls, or crash on a block of only such lines.
    (b'null', "not_an_object", "a null is not a record"),
    (b'{"id": "nine"}', "schema_mismatch",
     "column 'id' is a string here but a number in earlier records (first at line 1); "
     "make the types agree or pass --on-error skip to skip bad records"),
    (b'{"meta": {"src": 5}}', "schema_mismatch",
     "column 'meta.src' is a number here but a string in earlier records (first at line 1)"),
    (b'{"tags": ["a", 1]}', "schema_mismatch",
     "column 'tags[]' is a number here but a string in earlier records (first at line 1)"),
    (b'{"id": 1, "id": 2}', "malformed_json", "malformed JSON (key 'id' appears twice"),
    (b'{"text": "\\ud800"}', "malformed_json", "lone surrogate"),
    (b'{"id": 1} trailing', "malformed_json", "malformed JSON (Extra data: line 1 column 11)"),
]


def _dirty_file(tmp_path, bad: bytes, suffix: str = "") -> tuple[object, list[dict]]:
    good = RECORDS[:2] + RECORDS[2:]
    lines = [json.dumps(r).encode() for r in good]
    data = b"\n".join(lines[:2] + [bad] + lines[2:]) + b"\n"
    path = tmp_path / f"dirty.jsonl{suffix}"
    path.write_bytes(COMPRESSORS[suffix](data))
    return path, good


@pytest.mark.parametrize("bad, kind, message", BAD_CASES)
def test_jsonl_bad_record_raises_with_file_and_line(tmp_path, bad, kind, message):
    path, _ = _dirty_file(tmp_path, bad)
    f = one(path)
    with pytest.raises(InputError) as err:
        read_all(f)
    assert str(err.value).startswith(f"{f.url} line 3: ")
    assert message.format(offset=path.read_bytes().find(b"\xff")) in str(err.value)
    assert (err.value.path, err.value.line) == (f.url, 3)


@pytest.mark.parametrize("bad, kind, message", BAD_CASES)
def test_jsonl_skip_mode_counts_and_keeps_the_rest(tmp_path, bad, kind, message):
    path, good = _dirty_file(tmp_path, bad, ".zst")
    stats = InputStats()
    table = read_all(one(path), options=InputOptions(on_error="skip"), stats=stats)
    assert table.to_pylist() == expected(good)
    assert getattr(stats, kind) == 1 and stats.skipped == 1 and stats.rows == len(good)
    assert stats.examples[0].startswith(f"{path} line 3: ")
    # Skip mode gives exactly what the clean file gives, types included.
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(jsonl_bytes(good))
    assert table.schema == read_all(one(clean)).schema


def test_jsonl_many_bad_lines_in_skip_mode(tmp_path):
    lines = []
    for i in range(300):
        lines.append(json.dumps({"id": i, "v": "s"}) if i % 3 else '{"id": "bad"')
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    stats = InputStats()
    table = read_all(one(path), options=InputOptions(on_error="skip"), stats=stats)
    assert table.num_rows == 200 and stats.malformed_json == 100
    assert len(stats.examples) == InputStats.MAX_EXAMPLES
    assert stats.examples[1].startswith(f"{path} line 4: malformed JSON")


def test_first_line_array_hint(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('[{"a": 1}, {"a": 2}]\n')
    with pytest.raises(InputError, match=r"line 1: an array is not a record \(a file holding one "
                                         r"JSON array must be converted to JSON Lines first"):
        read_all(one(path))


# -- JSON Lines: the two paths agree, and chunks agree ---------------------------------------

def test_fallback_path_gives_identical_types(tmp_path):
    records = RECORDS + [{"id": 4, "x": None, "when": "2024-05-06", "deep": {"l": [[1], []]}},
                         {"id": 5, "x": [], "score": 3}]
    path = tmp_path / "same.jsonl"
    path.write_bytes(jsonl_bytes(records))
    fast = read_all(one(path))
    with first_parse_fails("JSON parse error: forced") as calls:
        slow = read_all(one(path))
    assert len(calls) == 2  # the fast call failed, the fallback built the table
    assert slow.schema == fast.schema and slow.equals(fast)


def test_chunks_are_unified_and_conflicts_named_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(lines_mod, "CHUNK_BYTES", 64)
    records = [{"i": i, "v": i} for i in range(40)] + [{"i": 40, "v": 0.5, "w": "new"}]
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes(records)))
    batches = list(read_input(one(path)))
    assert len(batches) > 5  # many chunks
    schema = unify_schemas([(str(path), b.schema) for b in batches])
    assert schema == pa.schema([("i", pa.int64()), ("v", pa.float64()), ("w", pa.string())])
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["i"] for r in rows] == list(range(41))

    lines = [json.dumps({"i": i, "v": i}) for i in range(40)]
    lines[33] = json.dumps({"i": 33, "v": "text"})
    path2 = tmp_path / "c2.jsonl"
    path2.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"c2.jsonl line 34: column 'v' is a string here but "
                                         r"a number in an earlier part of the file"):
        list(read_input(one(path2)))
    stats = InputStats()
    got = list(read_input(one(path2), options=InputOptions(on_error="skip"), stats=stats))
    assert sum(b.num_rows for b in got) == 39 and stats.schema_mismatch == 1


def test_very_long_line_spans_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(lines_mod, "CHUNK_BYTES", 32)
    records = [{"t": "x" * 200_000}, {"t": "short"}]
    path = tmp_path / "long.jsonl"
    path.write_bytes(jsonl_bytes(records))
    assert read_all(one(path)).to_pylist() == records


def test_conflicts_far_apart_in_one_chunk_raise_cleanly(tmp_path):
    """With several parse blocks pyarrow 26 segfaults on this; one block per chunk raises."""
    lines = [json.dumps({"y": i, "pad": "p" * 100}) for i in range(50_000)]
    lines.append(json.dumps({"y": {"c": 1}}))
    path = tmp_path / "far.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="far.jsonl line 50001: column 'y' is an object here"):
        read_all(one(path))


def test_chained_url_inputs_are_read(tmp_path):
    """``simplecache::memory://...``: fsspec builds chained filesystems; resolve hands them on."""
    import fsspec

    from zephon_store import convert, open_dataset

    fsspec.filesystem("memory").pipe("/chained/a.jsonl", b'{"x": 1}\n{"x": 2}\n')
    out = str(tmp_path / "ds")
    assert convert(["simplecache::memory://chained/a.jsonl"], out).num_samples == 2
    assert open_dataset(out).take([0, 1]).to_pylist() == [{"x": 1}, {"x": 2}]

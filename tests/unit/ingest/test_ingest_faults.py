"""Ingest under damage: truncated and corrupt containers, Parquet page checksums, CSV quoting,
symlinked folders, and messages that say what, where and what to do."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.helpers import ROOT
from zephon_store.errors import InputError
from zephon_store.ingest import InputOptions, InputStats, expand_inputs, read_input
from zephon_store.ingest.files import COMPRESSION_SUFFIXES


def _zstd(data: bytes) -> bytes:
    # Two frames, so that a cut in the second one is covered too.
    c = zstandard.ZstdCompressor(level=3)
    half = len(data) // 2
    return c.compress(data[:half]) + c.compress(data[half:])


COMPRESS = {"gzip": lambda d: gzip.compress(d, mtime=0), "bz2": bz2.compress,
            "xz": lzma.compress, "zstd": _zstd}
SUFFIX = {"gzip": ".gz", "bz2": ".bz2", "xz": ".xz", "zstd": ".zst"}
# Every kind that is read as a byte stream (Parquet refuses a compression suffix).
KINDS = {
    "jsonl": (".jsonl", lambda i: json.dumps({"id": i, "text": f"record {i} " + "x" * (i % 37)}) + "\n",
              InputOptions()),
    "text": (".txt", lambda i: f"line {i} " + "y" * (i % 41) + "\n", InputOptions(text_mode="line")),
    "textfile": (".txt", lambda i: f"line {i} " + "y" * (i % 41) + "\n", InputOptions()),
    "csv": (".csv", lambda i: f'{i},"value {i}, ' + "z" * (i % 29) + '"\n', InputOptions()),
}


def _payload(kind: str) -> bytes:
    _, row, _ = KINDS[kind]
    head = "id,text\n" if kind == "csv" else ""
    return (head + "".join(row(i) for i in range(4000))).encode()


def _rows(path, options: InputOptions, stats: InputStats | None = None) -> int:
    (f,) = expand_inputs([str(path)])
    return sum(b.num_rows for b in read_input(f, options=options, stats=stats))


def test_every_accepted_compression_is_covered():
    assert set(COMPRESSION_SUFFIXES.values()) == set(COMPRESS)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("compression", list(COMPRESS))
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_truncated_container_always_raises(tmp_path, kind, compression, on_error):
    suffix, _, options = KINDS[kind]
    data = COMPRESS[compression](_payload(kind))
    whole = tmp_path / f"whole{suffix}{SUFFIX[compression]}"
    whole.write_bytes(data)
    options = InputOptions(**{**options.__dict__, "on_error": on_error})
    assert _rows(whole, options) == (1 if kind == "textfile" else 4000)
    for cut in (len(data) // 3, len(data) - 1, 7):
        path = tmp_path / f"cut{cut}{suffix}{SUFFIX[compression]}"
        path.write_bytes(data[:cut])
        stats = InputStats()
        with pytest.raises(InputError) as err:
            _rows(path, options, stats)
        msg = str(err.value)
        assert msg.startswith(f"{path}: truncated compressed stream: ")
        assert f"{compression} data ends after {cut} of its bytes" in msg
        assert "decompressed bytes" in msg and "re-create or re-download" in msg
        assert err.value.path == str(path) and stats.skipped == 0


@pytest.mark.parametrize("compression", list(COMPRESS))
def test_damaged_container_names_the_member_and_offsets(tmp_path, compression):
    raw = _payload("jsonl")
    data = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(raw)
                     if compression == "zstd" else COMPRESS[compression](raw))
    data[len(data) // 2] ^= 0x10
    path = tmp_path / f"d.jsonl{SUFFIX[compression]}"
    path.write_bytes(bytes(data))
    for on_error in ("raise", "skip"):
        with pytest.raises(InputError, match=rf"d\.jsonl\.\w+: corrupt {compression} stream in "
                                             rf"{compression} \w+ 1, within compressed bytes "
                                             rf"0-{len(data)} \(after \d+ decompressed bytes\)"):
            _rows(path, InputOptions(on_error=on_error))


@pytest.mark.parametrize("compression", list(COMPRESS))
def test_members_padding_and_garbage_after_the_end(tmp_path, compression):
    one, two = _payload("text")[:5000], _payload("text")[5000:9000]
    joined = COMPRESS[compression](one) + COMPRESS[compression](two)
    path = tmp_path / f"m.txt{SUFFIX[compression]}"
    path.write_bytes(joined + b"\0" * 8)  # zero padding after the last member is allowed
    (f,) = expand_inputs([str(path)])
    (batch,) = read_input(f)
    assert batch.column(0)[0].as_py() == (one + two).decode()
    path.write_bytes(joined + b"junk appended")
    with pytest.raises(InputError, match=rf"m\.txt\.\w+: corrupt {compression} stream: after "
                                         rf"{compression} \w+ [24] ends at compressed byte "
                                         rf"{len(joined)} \(after 9000 decompressed bytes\) come "
                                         rf"bytes that start no new one \(6a 75 6e 6b 20 61\)"):
        list(read_input(f))


def test_convert_of_a_truncated_input_fails_even_in_skip_mode(tmp_path):
    from zephon_store.write.convert import convert

    data = COMPRESS["zstd"](_payload("jsonl"))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.zst").write_bytes(data[: len(data) // 3])
    with pytest.raises(InputError, match="a.jsonl.zst: truncated compressed stream"):
        convert([str(tmp_path / "in")], str(tmp_path / "out"), progress=False,
                input_options=InputOptions(on_error="skip"))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_empty_compressed_file_is_an_empty_input(tmp_path):
    # Like an empty plain file; a cut inside the header is a truncation (see above).
    (tmp_path / "e.jsonl.zst").write_bytes(b"")
    assert _rows(tmp_path / "e.jsonl.zst", InputOptions()) == 0


# -- Parquet page checksums -------------------------------------------------------------------

def _flip_value(path, value: int) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(struct.pack("<q", value))
    assert at > 0
    data[at + 5] ^= 0x01  # 993 would read as 281474976711649
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_parquet_page_checksum_is_verified(tmp_path, on_error):
    table = pa.table({"id": pa.array(range(3000), pa.int64())})
    path = tmp_path / "crc.parquet"
    pq.write_table(table, path, write_page_checksum=True, compression="none",
                   use_dictionary=False, row_group_size=1000)
    _flip_value(path, 2993)
    with pytest.raises(InputError) as err:
        _rows(path, InputOptions(on_error=on_error))
    assert str(err.value).startswith(
        f"{path} row group 2 (rows from 2000): a page fails its CRC checksum (")
    assert "the file is damaged: re-create or re-download it" in str(err.value)
    assert err.value.row == 2000


def test_parquet_without_checksums_still_reads(tmp_path):
    # Checksums are optional in Parquet; most writers leave them out (nothing to verify).
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"id": list(range(10))}), path)
    assert _rows(path, InputOptions()) == 10


# -- CSV quoting ------------------------------------------------------------------------------

def _csv(tmp_path, text: str, name: str = "q.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _csv_rows(path, **kw) -> tuple[list[dict], InputStats]:
    stats = InputStats()
    (f,) = expand_inputs([str(path)])
    got = [r for b in read_input(f, options=InputOptions(**kw), stats=stats) for r in b.to_pylist()]
    return got, stats


def test_csv_unterminated_quote_is_a_bad_record_not_the_rest_of_the_file(tmp_path):
    path = _csv(tmp_path, 'id,text\n0,ok\n1,"hello\n2,world\n3,x\n')
    with pytest.raises(InputError) as err:
        _csv_rows(path)
    assert str(err.value) == (
        f"{path} line 3: unterminated quote: the record that starts on this line is still "
        f"inside a quoted field at the end of the file; close the quote (a quote inside a "
        f"quoted field is written \"\") or pass --on-error skip to skip bad records")
    assert err.value.line == 3
    got, stats = _csv_rows(path, on_error="skip")
    # Only the line with the stray quote is dropped; the records after it are read as records.
    assert got == [{"id": "0", "text": "ok"}, {"id": "2", "text": "world"}, {"id": "3", "text": "x"}]
    assert stats.bad_row == 1 and stats.examples[0].startswith(f"{path} line 3: unterminated quote")


def test_csv_stray_quote_closed_by_a_later_one_is_caught(tmp_path):
    path = _csv(tmp_path, 'id,text\n1,"hello\n2,world\n3,"multi\nline"\n4,x\n')
    with pytest.raises(InputError, match=r"q\.csv line 2: malformed quoting in the record that "
                                         r"starts on this line \(on line 4: ',' expected after "
                                         r"'\"'\): a closing quote must be followed by the "
                                         r"delimiter or the end of the line"):
        _csv_rows(path)
    got, stats = _csv_rows(path, on_error="skip")
    assert got == [{"id": "2", "text": "world"}, {"id": "3", "text": "multi\nline"},
                   {"id": "4", "text": "x"}]
    assert stats.bad_row == 1


def test_csv_multiline_fields_follow_the_option(tmp_path):
    text = 'id,text\n1,"two\nlines"\n2,"say ""hi""\n, ok"\n3,x\n'
    path = _csv(tmp_path, text)
    want = [{"id": "1", "text": "two\nlines"}, {"id": "2", "text": 'say "hi"\n, ok'},
            {"id": "3", "text": "x"}]
    assert _csv_rows(path)[0] == want
    with pytest.raises(InputError, match=r"q\.csv line 2: unterminated quote: the record that "
                                         r"starts on this line is still inside a quoted field at "
                                         r"the end of the line \(--no-csv-newlines-in-values"):
        _csv_rows(path, csv_newlines_in_values=False)
    got, stats = _csv_rows(path, csv_newlines_in_values=False, on_error="skip")
    # Each line is a record of its own: lines with an open quote are bad, lines with the wrong
    # field count too, and the rest is read as written (', ok"' is two fields).
    assert got == [{"id": "", "text": ' ok"'}, {"id": "3", "text": "x"}] and stats.bad_row == 3


# -- symbolic links ---------------------------------------------------------------------------

def _tree(tmp_path):
    """in/real/a.jsonl, in/linked -> other (other/sub/b.jsonl), in/f.jsonl -> other/c.jsonl."""
    (tmp_path / "in" / "real").mkdir(parents=True)
    (tmp_path / "other" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "real" / "a.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "other" / "sub" / "b.jsonl").write_text('{"a": 2}\n')
    (tmp_path / "other" / "c.jsonl").write_text('{"a": 3}\n')
    (tmp_path / "in" / "linked").symlink_to(tmp_path / "other", target_is_directory=True)
    (tmp_path / "in" / "f.jsonl").symlink_to(tmp_path / "other" / "c.jsonl")
    return tmp_path / "in"


def _names(files, root) -> list[str]:
    return [os.path.relpath(f.url, root) for f in files]


def test_walk_follows_directory_symlinks(tmp_path):
    root = _tree(tmp_path)
    files = expand_inputs([str(root)])
    # f.jsonl and linked/c.jsonl are one file: it is read once, under its first name.
    assert _names(files, root) == ["f.jsonl", "linked/sub/b.jsonl", "real/a.jsonl"]
    assert [f.size for f in files] == [9, 9, 9]
    rows = sorted(r["a"] for f in files for b in read_input(f) for r in b.to_pylist())
    assert rows == [1, 2, 3]
    by_glob = expand_inputs([f"{root}/**/*.jsonl"])
    assert _names(by_glob, root) == _names(files, root)
    assert _names(expand_inputs([f"{root}/*"]), root) == _names(files, root)


def test_two_links_to_one_folder_read_it_once(tmp_path):
    root = _tree(tmp_path)
    (root / "again").symlink_to(tmp_path / "other", target_is_directory=True)
    assert _names(expand_inputs([str(root)]), root) == [
        "again/c.jsonl", "again/sub/b.jsonl", "real/a.jsonl"]


def test_symlink_loop_is_a_clear_error(tmp_path):
    root = _tree(tmp_path)
    (root / "real" / "up").symlink_to(root, target_is_directory=True)
    for pattern in (str(root), f"{root}/**/*.jsonl"):
        with pytest.raises(InputError) as err:
            expand_inputs([pattern])
        assert str(err.value) == (
            f"{root}/real/up: symbolic link loop: it leads back to {root}, a folder that holds "
            f"it; remove the link, or name the folders to read separately")


def test_broken_link_and_special_files_are_named(tmp_path):
    root = _tree(tmp_path)
    (root / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises(InputError, match=rf"{root}/gone\.jsonl: broken symbolic link to "
                                         rf"{tmp_path}/nowhere\.jsonl \(nothing is there\); fix "
                                         rf"or remove the link"):
        expand_inputs([str(root)])
    (root / "gone.jsonl").unlink()
    os.mkfifo(root / "pipe.jsonl")
    with pytest.raises(InputError, match=rf"{root}/pipe\.jsonl: not a regular file or folder "
                                         rf"\(a FIFO, socket or device\); move it out of the "
                                         rf"input folder"):
        expand_inputs([str(root)])


# -- messages ---------------------------------------------------------------------------------

def _deep(tmp_path, lists: int):
    path = tmp_path / f"deep{lists}.jsonl"
    path.write_text('{"a": 1}\n{"x": ' + "[" * lists + "]" * lists + '}\n{"a": 2}\n')
    return path


def test_json_nesting_up_to_the_limit_reads(tmp_path):
    assert _rows(_deep(tmp_path, 99), InputOptions()) == 3  # 100 levels with the object


@pytest.mark.parametrize("lists", [100, 5000, 100_000])  # 100k levels crashed pyarrow (SIGSEGV)
def test_json_nested_too_deeply_names_line_depth_and_what_to_do(tmp_path, lists):
    path = _deep(tmp_path, lists)
    with pytest.raises(InputError) as err:
        _rows(path, InputOptions())
    assert str(err.value) == (
        f"{path} line 2: the record is nested {lists + 1} levels deep, more than the 100 levels "
        f"ingest reads; flatten it, or keep the deep part as a JSON string, or pass --on-error "
        f"skip to skip bad records")
    stats = InputStats()
    assert _rows(path, InputOptions(on_error="skip"), stats) == 2 and stats.malformed_json == 1


def test_brackets_inside_strings_keep_the_fast_path(tmp_path, monkeypatch):
    """Source code in a text field holds thousands of brackets; only real nesting may send a
    chunk to the slow exact pass (it made converting a code corpus 3x slower)."""
    from zephon_store.ingest import jsonl as jsonl_mod

    def no_exact_pass(*args, **kwargs):
        raise AssertionError("the chunk took the exact pass")

    monkeypatch.setattr(jsonl_mod, "check_chunk", no_exact_pass)
    path = tmp_path / "code.jsonl"
    code = "def f(x):\n    return [[{'k': x[i]} for i in range(3)]]\n" * 500
    records = [{"path": f"m{i}.py", "text": code + '"\\'} for i in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert _rows(path, InputOptions()) == 20


def test_messages_name_only_options_the_cli_has():
    """Every '--flag' an ingest message suggests exists on 'zephon convert'."""
    import re
    from pathlib import Path

    from zephon_store.cli.main import build_parser

    parser = build_parser()
    convert = next(a for a in parser._subparsers._group_actions[0].choices.values()
                   if a.prog.endswith("convert"))
    flags = {s for a in convert._actions for s in a.option_strings}
    src = Path(ROOT) / "zephon_store" / "ingest"
    code = "\n".join(line.split("#")[0] for p in src.glob("*.py")
                     for line in p.read_text().splitlines())  # comments are not messages
    named = set(re.findall(r"--[a-z][a-z-]+", code))
    assert named and named <= flags, sorted(named - flags)

"""CSV and TSV with a header row, read by pyarrow.csv as a stream.

Every column is read as a string, exactly as written ("" for an empty cell): CSV carries no
types, and pyarrow's guess is made per block, so a column could flip from int64 to string at
a block boundary deep into a large file. Cast after conversion if you need numbers.
"""

from __future__ import annotations

import csv as pycsv
import dataclasses
import io
import itertools
import sys
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.csv as pacsv

from ..errors import InputError
from .files import open_stream, split_compression
from .lines import LineChunk, bad_record, iter_line_chunks
from .options import InputFile, InputOptions, InputStats

# pyarrow.csv parses this much per call; larger blocks only cost memory.
BLOCK_BYTES = 4 << 20


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of LineChunks, for parsers that want a file object."""

    def __init__(self, chunks: Iterable[LineChunk]) -> None:
        self._chunks = iter(chunks)
        self._buf, self._pos = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while self._pos >= len(self._buf):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buf, self._pos = chunk.data, 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos:self._pos + n]
        self._pos += n
        return n


def delimiter_for(file: InputFile, options: InputOptions) -> str:
    """Tab for ``.tsv`` files unless a delimiter other than the default was asked for."""
    base, _ = split_compression(file.url)
    if base.lower().endswith(".tsv") and options.csv_delimiter == ",":
        return "\t"
    return options.csv_delimiter


def read_csv(file: InputFile, *, options: InputOptions, storage_options: dict | None,
             stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    """String-typed record batches of one CSV/TSV file; rows with the wrong field count are bad."""
    delimiter = delimiter_for(file, options)
    bad: list[tuple[int | None, str]] = []  # (record number, reason) of the first bad rows
    count = 0

    def on_invalid(row: pacsv.InvalidRow) -> str:
        nonlocal count
        count += 1
        if len(bad) < InputStats.MAX_EXAMPLES:
            bad.append((row.number, f"expected {row.expected_columns} fields, got "
                                    f"{row.actual_columns}: {row.text[:80]!r}"))
        return "error" if options.on_error == "raise" else "skip"

    with open_stream(file, storage_options) as stream:
        chunks = iter_line_chunks(stream, file, options=options, stats=stats)
        first = next(chunks, None)
        names = _header(first, delimiter) if first is not None else []
        if not names:
            return
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InputError(f"{file.url} line 1: the header names {dupes} more than once; "
                             f"rename the columns", path=file.url, line=1)
        try:
            # use_threads=False: only the serial reader tells on_invalid the row's number.
            reader = pacsv.open_csv(
                io.BufferedReader(_ChunkReader(itertools.chain([first], chunks))),
                read_options=pacsv.ReadOptions(use_threads=False, block_size=BLOCK_BYTES),
                parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True,
                                                 invalid_row_handler=on_invalid),
                convert_options=pacsv.ConvertOptions(
                    column_types={n: pa.string() for n in names}, strings_can_be_null=False),
            )
            for batch in reader:
                for start in range(0, batch.num_rows, options.batch_rows):
                    yield batch.slice(start, options.batch_rows)
        except pa.ArrowInvalid as exc:
            if not bad or options.on_error == "skip":  # not a row pyarrow handed to on_invalid
                raise InputError(f"{file.url}: CSV parse error ({exc}); fix the file",
                                 path=file.url) from exc
    lines = _record_lines(file, [n for n, _ in bad if n is not None], delimiter,
                          options=options, storage_options=storage_options)
    for number, reason in bad:
        bad_record("bad_row", file, lines.get(number), reason, "fix the row",
                   options=options, stats=stats)
    if stats is not None:  # rows past the examples are only counted
        stats.bad_row += count - len(bad)


def _header(first: LineChunk, delimiter: str) -> list[str]:
    # A header longer than 1 MiB is not a header; a character cut at the end does not matter.
    head = first.data[: 1 << 20].decode("utf-8", errors="ignore")
    for row in pycsv.reader(io.StringIO(head), delimiter=delimiter):
        if row:
            return row
    return []


def _record_lines(file: InputFile, numbers: list[int], delimiter: str, *,
                  options: InputOptions, storage_options: dict | None) -> dict[int, int]:
    """Map pyarrow's 1-based record numbers (header = 1, blank lines not counted) to the line
    each record starts on, by re-reading the file with Python's csv module up to the last."""
    if not numbers:
        return {}
    wanted, out, record = set(numbers), {}, 0
    quiet = dataclasses.replace(options, on_error="skip")
    limit = pycsv.field_size_limit()
    pycsv.field_size_limit(sys.maxsize)  # a record may hold a whole document
    try:
        with open_stream(file, storage_options) as stream:
            chunks = iter_line_chunks(stream, file, options=quiet, stats=None)
            text = io.TextIOWrapper(io.BufferedReader(_ChunkReader(chunks)), encoding="utf-8",
                                    newline="")
            reader = pycsv.reader(text, delimiter=delimiter, strict=False)
            while len(out) < len(wanted):
                before = reader.line_num
                row = next(reader, None)
                if row is None:
                    break
                if row:
                    record += 1
                    if record in wanted:
                        out[record] = before + 1
    finally:
        pycsv.field_size_limit(limit)
    return out

"""CSV and TSV with a header row, parsed strictly with Python's csv module.

Every column is read as a string, exactly as written ("" for an empty cell): CSV carries no
types, and a guess made per block could flip a column from int64 to string deep into a large
file. Cast after conversion if you need numbers.

The quoting rule (RFC 4180, documented in docs/inputs.md): a field that starts with a quote
ends at the next single quote (``""`` is a quote inside it), and that quote must be followed by
the delimiter or the end of the line. A quoted field may span lines while
``InputOptions.csv_newlines_in_values`` is on (the default). A record still inside a quoted
field at the end of the file (or of its line, with the option off), or with anything after a
closing quote, is a bad record named by the line it starts on; in skip mode only that first
line is dropped and reading resumes on the next one, so a stray quote never swallows the
records after it. pyarrow.csv is not used: it has no strict mode and reads a stray quote as
one value running to the next quote or to the end of the file, without an error.
"""

from __future__ import annotations

import csv as pycsv
from collections import deque
from collections.abc import Iterator

import pyarrow as pa

from ..errors import InputError
from .files import open_stream, split_compression
from .lines import bad_record, iter_line_chunks
from .options import InputFile, InputOptions, InputStats

# The longest field, in characters. It bounds the memory one record can take, and the text
# one unterminated quote can hold before it is reported; a field of a whole book fits.
MAX_FIELD_CHARS = 1 << 27
_QUOTE_HINT = 'close the quote (a quote inside a quoted field is written "")'

Line = tuple[int, str]  # (1-based line number, text with its "\n")


def delimiter_for(file: InputFile, options: InputOptions) -> str:
    """Tab for ``.tsv`` files unless a delimiter other than the default was asked for."""
    base, _ = split_compression(file.url)
    if base.lower().endswith(".tsv") and options.csv_delimiter == ",":
        return "\t"
    return options.csv_delimiter


def read_csv(file: InputFile, *, options: InputOptions, storage_options: dict | None,
             stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    """String-typed record batches of one CSV/TSV file; malformed records are bad rows."""
    delimiter = delimiter_for(file, options)
    limit = pycsv.field_size_limit()
    pycsv.field_size_limit(MAX_FIELD_CHARS)
    try:
        with open_stream(file, storage_options) as stream:
            lines = _lines(iter_line_chunks(stream, file, options=options, stats=stats,
                                            want_text=True))
            records = _records(lines, file, delimiter, options=options, stats=stats)
            header = next(records, None)
            if header is None:
                return
            names = header[1]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise InputError(f"{file.url} line {header[0]}: the header names {dupes} more "
                                 f"than once; rename the columns", path=file.url, line=header[0])
            width, rows = len(names), []
            for line, row, taken in records:
                if len(row) != width:
                    text = "".join(t for _, t in taken).rstrip("\r\n")
                    bad_record("bad_row", file, line, f"expected {width} fields, got "
                               f"{len(row)}: {text[:80]!r}", "fix the row",
                               options=options, stats=stats)
                    continue
                rows.append(row)
                if len(rows) >= options.batch_rows:
                    yield _batch(names, rows)
                    rows = []
            if rows:
                yield _batch(names, rows)
    finally:
        pycsv.field_size_limit(limit)


def _batch(names: list[str], rows: list[list[str]]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(c, pa.string()) for c in zip(*rows, strict=True)],
                           schema=pa.schema([(n, pa.string()) for n in names]))


def _lines(chunks) -> Iterator[Line]:
    for chunk in chunks:
        assert chunk.text is not None
        parts = chunk.text.split("\n")
        last = parts.pop()  # "" after a final newline, else the file's unterminated tail
        for i, part in enumerate(parts):
            yield chunk.first_line + i, part + "\n"
        if last:
            yield chunk.first_line + len(parts), last


def _records(lines: Iterator[Line], file: InputFile, delimiter: str, *, options: InputOptions,
             stats: InputStats | None) -> Iterator[tuple[int, list[str], list[Line]]]:
    """``(first line, fields, lines)`` of each non-blank record; ``lines`` is only valid until
    the next record is asked for. Records with broken quoting are reported here."""
    pending: deque[Line] = deque()  # lines to read again after a bad record
    taken: list[Line] = []  # the lines of the record being read

    def feed() -> Iterator[str]:
        while True:
            item = pending.popleft() if pending else next(lines, None)
            if item is None:
                return
            taken.append(item)
            yield item[1]

    reader = pycsv.reader(feed(), delimiter=delimiter, strict=True)
    while True:
        taken.clear()
        try:
            row = next(reader)
        except StopIteration:
            return
        except pycsv.Error as exc:
            reason = _quoting_problem(exc, taken[-1][0])
        else:
            if len(taken) == 1 or options.csv_newlines_in_values:
                if row:  # a blank line is no record
                    yield taken[0][0], row, taken
                continue
            reason = ("unterminated quote: the record that starts on this line is still inside "
                      "a quoted field at the end of the line (--no-csv-newlines-in-values)")
        bad_record("bad_row", file, taken[0][0], reason, _QUOTE_HINT, options=options,
                   stats=stats)
        # Skip mode: drop only the first line and read the others again as new records.
        pending.extendleft(reversed(taken[1:]))
        reader = pycsv.reader(feed(), delimiter=delimiter, strict=True)


def _quoting_problem(exc: pycsv.Error, line: int) -> str:
    text = str(exc)
    if text == "unexpected end of data":
        return ("unterminated quote: the record that starts on this line is still inside a "
                "quoted field at the end of the file")
    if text.startswith("field larger than field limit"):
        return (f"a field of the record that starts on this line is longer than "
                f"{MAX_FIELD_CHARS} characters (an unterminated quote?)")
    if "expected after" in text:
        return (f"malformed quoting in the record that starts on this line (on line {line}: "
                f"{text}): a closing quote must be followed by the delimiter or the end of "
                f"the line")
    return f"malformed record (on line {line}: {text})"

"""JSON Lines: pyarrow's parser per chunk of lines, and an exact Python pass when it refuses one.

Both paths end in the same call (:func:`parse_lines`) on the same bytes minus the bad lines,
so a table's types never depend on which path built it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa
import pyarrow.json as pajson

from ..errors import InputError
from .jsonl_check import check_chunk, kinds_from_schema
from .lines import LineChunk, bad_record, iter_line_chunks
from .options import InputFile, InputOptions, InputStats
from .schema import normalize_batch

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                 UnicodeDecodeError)
_NON_BLANK = re.compile(rb"\S")
_NULL_FIRST = re.compile(rb"[ \t\r\n]*null[ \t\r]*(?:\n|\Z)")
_NULL_LINE = re.compile(rb"\n[ \t\r]*null[ \t\r]*(?:\n|\Z)")
# pyarrow parses blocks in parallel: 4 MiB blocks give 16 per 64 MiB chunk, enough to keep
# the cores of one parser process busy, at 1/4 of pyarrow's per-block overhead at its 1 MiB
# default. Inference across blocks equals inference over one block (types unified in
# order), so this only tunes speed.
BLOCK_BYTES = 4 << 20


def read_jsonl(stream: BinaryIO, file: InputFile, *, options: InputOptions,
               stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    """Record batches of one JSONL stream; bad lines raise InputError or are skipped and counted."""
    seen: pa.Schema | None = None  # what earlier chunks of this file settled on
    for chunk in iter_line_chunks(stream, file, options=options, stats=stats):
        if not _NON_BLANK.search(chunk.data):
            continue
        table = None
        if not has_null_lines(chunk.data):
            try:
                table = parse_lines(chunk.data)
                if seen is not None:  # a later chunk may disagree with earlier ones
                    pa.unify_schemas([seen, table.schema], promote_options="permissive")
            except _ARROW_ERRORS:
                table = None
        if table is None:
            table = _fallback(chunk, file, seen, options=options, stats=stats)
        if table.num_rows == 0:
            continue
        seen = table.schema if seen is None else pa.unify_schemas(
            [seen, table.schema], promote_options="permissive")
        for batch in table.to_batches(max_chunksize=options.batch_rows):
            if batch.num_rows:
                yield normalize_batch(batch)


def has_null_lines(data: bytes) -> bool:
    """True when a line is a bare JSON ``null``.

    pyarrow (26) reads such a line as a row of nulls instead of refusing it, and crashes the
    process (SIGSEGV) when a parse block holds nothing else, so these lines must never reach
    it. The regexes start with a newline (or are anchored), which keeps them near 2 GB/s.

    >>> has_null_lines(b'{"a": null}\\n'), has_null_lines(b'{"a": 1}\\n  null\\n')
    (False, True)
    """
    return bool(_NULL_FIRST.match(data) or _NULL_LINE.search(data))


def parse_lines(data: bytes) -> pa.Table:
    """Parse JSON Lines bytes with pyarrow; JSON strings stay strings (no timestamp guessing).

    >>> parse_lines(b'{"a": 1, "t": "2020-01-01"}\\n').schema
    a: int64
    t: string
    """
    table = _read(data)
    # pyarrow turns strings that look like dates into timestamps, so a column's type would
    # hinge on whether every value in a chunk parses as a date, and the text would be lost.
    # Re-parse those columns as the strings they are.
    plain = pa.schema([f.with_type(_untime(f.type)) for f in table.schema])
    return table if plain == table.schema else _read(data, plain)


def _read(data: bytes, schema: pa.Schema | None = None) -> pa.Table:
    parse = pajson.ParseOptions(explicit_schema=schema)
    try:
        return pajson.read_json(pa.BufferReader(data), parse_options=parse,
                                read_options=pajson.ReadOptions(block_size=BLOCK_BYTES))
    except pa.ArrowNotImplementedError:
        pass  # pyarrow 26 cannot merge some nested types across blocks (null then struct<ts>)
    except pa.ArrowInvalid as exc:
        if "straddl" not in str(exc):
            raise
        # A line longer than a block.
    # Read the chunk as one block: inference is then one sequential pass.
    return pajson.read_json(pa.BufferReader(data), parse_options=parse,
                            read_options=pajson.ReadOptions(block_size=len(data) + 1))


def _untime(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_untime(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_untime(t.value_type)))
    return t


def _fallback(chunk: LineChunk, file: InputFile, seen: pa.Schema | None, *,
              options: InputOptions, stats: InputStats | None) -> pa.Table:
    good = check_chunk(chunk, file, kinds_from_schema(seen), options=options, stats=stats)
    # Safety net for anything the Python rules let through but pyarrow refuses: find the first
    # line whose prefix fails by bisection, report it, drop it, try again.
    while good:
        try:
            table = parse_lines(b"\n".join(raw for _, raw in good) + b"\n")
            if seen is not None:
                pa.unify_schemas([seen, table.schema], promote_options="permissive")
            return table
        except _ARROW_ERRORS as exc:
            i = _first_failing(good, seen)
            if i is None:  # the lines parse one by one but not together: nothing to blame
                raise InputError(f"{file.url}: cannot read JSON Lines ({exc})", path=file.url) from exc
            line, raw = good.pop(i)
            reason = str(exc).removeprefix("JSON parse error: ")
            bad_record("schema_mismatch", file, line, f"pyarrow refuses the record ({reason})",
                       "fix the line", options=options, stats=stats)
    return pa.table({})


def _first_failing(good: list[tuple[int, bytes]], seen: pa.Schema | None) -> int | None:
    def fails(n: int) -> bool:
        try:
            schema = parse_lines(b"\n".join(raw for _, raw in good[:n]) + b"\n").schema
            if seen is not None:
                pa.unify_schemas([seen, schema], promote_options="permissive")
        except _ARROW_ERRORS:
            return True
        return False

    lo, hi = 1, len(good)  # invariant: the first n lines fail for n = hi, not for n < lo
    if not fails(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi - 1

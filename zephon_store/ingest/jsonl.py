"""JSON Lines: pyarrow's parser per chunk of lines, and an exact Python pass when it refuses one.

Both paths end in the same call (:func:`parse_lines`) on the same bytes minus the bad lines,
so a table's types never depend on which path built it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa

from ..errors import InputError
from .arrow_json import has_null_lines, may_be_too_deep, parse_lines
from .jsonl_check import check_chunk, kinds_from_schema
from .lines import LineChunk, bad_record, iter_line_chunks
from .options import InputFile, InputOptions, InputStats
from .schema import normalize_batch

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                 UnicodeDecodeError)
_NON_BLANK = re.compile(rb"\S")


def read_jsonl(stream: BinaryIO, file: InputFile, *, options: InputOptions,
               stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    """Record batches of one JSONL stream; bad lines raise InputError or are skipped and counted."""
    seen: pa.Schema | None = None  # what earlier chunks of this file settled on
    for chunk in iter_line_chunks(stream, file, options=options, stats=stats):
        if not _NON_BLANK.search(chunk.data):
            continue
        table = None
        if not has_null_lines(chunk.data) and not may_be_too_deep(chunk.data):
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

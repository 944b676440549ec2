"""pyarrow.json with its pitfalls handled: the one place JSON Lines bytes become an Arrow table.

pyarrow 26 has four that matter here, each pinned by a test:

- it guesses timestamps from date-like strings (lossy, and chunk-dependent);
- a list whose first elements are nulls, before the item type is known, loses those nulls
  and comes out as an *invalid* array (``{"b": [null, 1]}``); an explicit schema avoids it,
  except for ``list<null>``, which is parsed with a stand-in type and rebuilt;
- a line that is a bare ``null`` becomes a row of nulls, and a parse block holding nothing
  else crashes the process (SIGSEGV): such lines must never reach it (:func:`has_null_lines`);
- parse blocks that disagree on a column's type can crash it too, so a chunk is parsed as
  one block;
- it recurses per nesting level and crashes (SIGSEGV) on a record some thousands of levels
  deep: a chunk where a line might be deeper than :data:`MAX_DEPTH` takes the exact path,
  which refuses such lines (:func:`may_be_too_deep`, :func:`json_depth`).
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

# The deepest record read: the type helpers here and in pyarrow's Python layer recurse two or
# three frames per level (Python stops at 1,000 frames); no real record type comes near 100.
MAX_DEPTH = 100
# pyarrow 26 itself crashed between 3,000 and 20,000 levels (8 MiB stack; threads may have
# less), so a line that may be deeper than this never reaches it.
_ARROW_SAFE_DEPTH = 1000
_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_NULL_FIRST = re.compile(rb"[ \t\r\n]*null[ \t\r]*(?:\n|\Z)")
_NULL_LINE = re.compile(rb"\n[ \t\r]*null[ \t\r]*(?:\n|\Z)")


def has_null_lines(data: bytes) -> bool:
    """True when a line is a bare JSON ``null`` (such lines must not reach pyarrow).

    The regexes start with a newline (or are anchored), which keeps them near 2 GB/s.

    >>> has_null_lines(b'{"a": null}\\n'), has_null_lines(b'{"a": 1}\\n  null\\n')
    (False, True)
    """
    return bool(_NULL_FIRST.match(data) or _NULL_LINE.search(data))


def may_be_too_deep(data: bytes, limit: int = _ARROW_SAFE_DEPTH) -> bool:
    """True when some line of ``data`` may nest containers more than ``limit`` deep; only such
    lines can crash pyarrow, and only chunks holding one take the slow exact path.

    Brackets inside JSON strings do not count (source code in a ``text`` field is full of
    them), so this is the exact depth of every well-formed line; a line whose quotes do not
    pair up (malformed anyway) counts as too deep, and the exact path names it.

    >>> may_be_too_deep(b'{"a": [[1]]}\\n'), may_be_too_deep(b"[" * 1001)
    (False, True)
    >>> may_be_too_deep(b'{"code": "' + b"[" * 2000 + b'"}\\n')
    False
    """
    if len(data) <= limit:
        return False   # too short to open more than ``limit`` brackets
    # A line nests at most as deep as the brackets it opens, so only lines opening more than
    # ``limit`` take the exact pass (a few lines of a code corpus; run over every byte it was
    # a third of a text conversion's parse). A malformed line left out cannot crash pyarrow
    # either: pyarrow rejects it and the chunk goes to the exact path. Slices of
    # _SCREEN_BYTES keep the temporaries small (a chunk is up to 64 MiB, one per parse thread).
    a = np.frombuffer(data, np.uint8)
    newlines = np.concatenate([np.flatnonzero(a[i:i + _SCREEN_BYTES] == 0x0A) + i
                               for i in range(0, len(a), _SCREEN_BYTES)])
    per_line = np.zeros(newlines.size + 1, np.int64)
    for i in range(0, len(a), _SCREEN_BYTES):
        opens = np.flatnonzero((a[i:i + _SCREEN_BYTES] | 0x20) == 0x7B) + i  # "[" or "{"
        per_line += np.bincount(np.searchsorted(newlines, opens), minlength=per_line.size)
    heavy = np.flatnonzero(per_line > limit)
    if not heavy.size:
        return False
    starts, ends = np.r_[0, newlines + 1], np.r_[newlines, len(data)]
    return _max_line_depth(b"\n".join(data[starts[i]:ends[i]] for i in heavy)) > limit


_SCREEN_BYTES = 4 << 20
_SPECIAL = np.zeros(256, bool)
_SPECIAL[[0x0A, 0x22, 0x5B, 0x5C, 0x5D, 0x7B, 0x7D]] = True   # \n " [ \\ ] { }


def _max_line_depth(data: bytes) -> int:
    """The deepest nesting of any line, brackets inside strings aside (vectorised: O(n) in
    numpy, no per-line Python); ``limit``-breaking sentinel for lines with unpaired quotes."""
    a = np.frombuffer(data, np.uint8)
    n = len(a)
    # One pass over the bytes finds every byte that matters; the rest works on those few.
    at = np.flatnonzero(_SPECIAL[a])
    kind = a[at]
    quotes = at[kind == 0x22]
    slashes = at[kind == 0x5C]
    if slashes.size and quotes.size:
        # A quote is escaped when an odd run of backslashes ends right before it.
        breaks = np.flatnonzero(np.diff(slashes) != 1)
        starts = slashes[np.r_[0, breaks + 1]]
        ends = slashes[np.r_[breaks, slashes.size - 1]]
        after = (ends + 1)[((ends - starts) % 2 == 0) & (ends + 1 < n)]
        escaped = after[a[after] == 0x22]
        if escaped.size:
            quotes = np.setdiff1d(quotes, escaped, assume_unique=True)
    line_ends = np.append(at[kind == 0x0A], n)
    per_line = np.diff(np.searchsorted(quotes, line_ends), prepend=0)
    if np.any(per_line % 2):
        return np.iinfo(np.int64).max   # unpaired quotes: let the exact pass decide
    opens = at[(kind == 0x5B) | (kind == 0x7B)]
    closes = at[(kind == 0x5D) | (kind == 0x7D)]
    # Quotes pair up within each line, so an even count of quotes before a bracket means it
    # stands outside every string.
    opens = opens[np.searchsorted(quotes, opens) % 2 == 0]
    if not opens.size:
        return 0
    closes = closes[np.searchsorted(quotes, closes) % 2 == 0]
    pos = np.concatenate([opens, closes])
    step = np.concatenate([np.ones(opens.size, np.int64), -np.ones(closes.size, np.int64)])
    order = np.argsort(pos, kind="stable")
    pos, step = pos[order], step[order]
    depth = np.cumsum(step)
    # Depth counts from each line's start: subtract the running depth before its first event.
    line = np.searchsorted(line_ends, pos)
    first = np.flatnonzero(np.r_[True, line[1:] != line[:-1]])
    base = np.repeat(depth[first] - step[first], np.diff(np.r_[first, pos.size]))
    return int((depth - base).max())


def record_depth(schema: pa.Schema) -> int:
    """How deeply a record of ``schema`` nests, the record itself being level 1."""
    deepest, todo = 1, [(f.type, 2) for f in schema]
    while todo:
        t, level = todo.pop()
        if pa.types.is_nested(t):
            deepest = max(deepest, level)
            todo += [(t.field(i).type, level + 1) for i in range(t.num_fields)]
    return deepest


def json_depth(line: bytes) -> int:
    """How deeply the containers of one JSON line nest (``{}`` is 1), brackets in strings aside.

    >>> json_depth(b'{"a": [1, {"b": "[[["}]}')
    3
    """
    a = np.frombuffer(_STRING.sub(b"", line), np.uint8)
    steps = (a == 0x5B).astype(np.int64) + (a == 0x7B) - (a == 0x5D) - (a == 0x7D)
    return int(np.cumsum(steps).max(initial=0))


def parse_lines(data: bytes) -> pa.Table:
    """Parse JSON Lines bytes with pyarrow's inference; JSON strings stay strings.

    Raises pyarrow's errors for input it refuses. The types are those pyarrow infers, with
    timestamps turned back into strings.

    >>> parse_lines(b'{"a": 1, "t": "2020-01-01", "l": [null, 2]}\\n').to_pylist()
    [{'a': 1, 't': '2020-01-01', 'l': [None, 2]}]
    """
    table = _read(data)
    if record_depth(table.schema) > MAX_DEPTH:  # the exact pass names the line
        raise pa.ArrowInvalid(f"a record is nested more than {MAX_DEPTH} levels deep")
    plain = pa.schema([f.with_type(_untime(f.type)) for f in table.schema])
    if _same(plain, table.schema) and _valid(table):
        return table
    table = _read(data, plain)
    if _valid(table):
        return table
    stand_in = pa.schema([f.with_type(_no_null_items(f.type)) for f in plain])
    parsed = _read(data, stand_in)
    table = pa.Table.from_arrays(
        [pa.chunked_array([_rebuild(c, f.type) for c in col.chunks], f.type)
         for col, f in zip(parsed.columns, plain, strict=True)], schema=plain)
    table.validate(full=True)  # if pyarrow still builds an invalid table, refuse it loudly
    return table


def _read(data: bytes, schema: pa.Schema | None = None) -> pa.Table:
    # Always one parse block: when blocks disagree on a column's type (number, then object),
    # pyarrow 26 crashes instead of raising, and merging some nested types across blocks is
    # not implemented. One block is one sequential inference pass, which only costs the
    # intra-chunk parallelism; the converter parses files in parallel processes anyway.
    return pajson.read_json(
        pa.BufferReader(data), parse_options=pajson.ParseOptions(explicit_schema=schema),
        read_options=pajson.ReadOptions(block_size=len(data) + 1, use_threads=False))


def _same(a: pa.Schema, b: pa.Schema) -> bool:
    return a == b and str(a) == str(b)


def _valid(table: pa.Table) -> bool:
    try:
        table.validate()
    except pa.ArrowInvalid:
        return False
    return True


def _untime(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_untime(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_untime(t.value_type)))
    return t


def _no_null_items(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t):
        item = pa.string() if pa.types.is_null(t.value_type) else _no_null_items(t.value_type)
        return pa.list_(t.value_field.with_type(item))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_no_null_items(f.type)) for f in t])
    return t


def _rebuild(array: pa.Array, t: pa.DataType) -> pa.Array:
    """``array`` (parsed with stand-in types, offset 0) rebuilt with type ``t``."""
    if _same(pa.schema([("x", array.type)]), pa.schema([("x", t)])):
        return array
    if pa.types.is_null(t):
        return pa.nulls(len(array))
    mask = array.is_null() if array.null_count else None
    if pa.types.is_list(t):
        return pa.ListArray.from_arrays(array.offsets, _rebuild(array.values, t.value_type),
                                        type=t, mask=mask)
    children = [_rebuild(array.field(i), f.type) for i, f in enumerate(t)]
    return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)

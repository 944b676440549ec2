"""The exact, slow JSONL pass: decode and parse each line with Python to name every bad one.

It runs only on chunks that pyarrow's parser refused. Its rules mirror what pyarrow accepts,
so the lines it keeps parse with pyarrow, and the table built from them has the types the
fast path would have inferred for a file without the bad lines.

Types are tracked as JSON kinds per column path (``/meta/tags/[]``), as pyarrow does: a
column's kind is fixed by its first non-null value; ints and floats are both ``number``.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa

from .arrow_json import MAX_DEPTH, json_depth, may_be_too_deep
from .lines import LineChunk, bad_record
from .options import InputFile, InputOptions, InputStats

Kinds = dict[str, tuple[str, int | None]]  # column path -> (JSON kind, line that fixed it)

_ARTICLE = {"boolean": "a boolean", "number": "a number", "string": "a string",
            "array": "an array", "object": "an object"}
_SURROGATE = re.compile(rb"\\[uU][dD][89a-fA-F]")
_FIX = "fix the line"


class _DuplicateKey(ValueError):
    pass


def _pairs(pairs: list[tuple[str, object]]) -> dict:
    # pyarrow refuses an object that names a key twice; Python would silently keep the last.
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(f"key {key!r} appears twice in one object")
            seen.add(key)
    return out


def kinds_from_schema(schema: pa.Schema | None) -> Kinds:
    """The JSON kinds an Arrow schema (of earlier chunks of the same file) has fixed."""
    out: Kinds = {}
    for field in schema or ():
        _seed(field.type, f"/{field.name}", out)
    return out


def _seed(t: pa.DataType, path: str, out: Kinds) -> None:
    if pa.types.is_null(t):
        return
    if pa.types.is_boolean(t):
        out[path] = ("boolean", None)
    elif pa.types.is_integer(t) or pa.types.is_floating(t):
        out[path] = ("number", None)
    elif pa.types.is_struct(t):
        out[path] = ("object", None)
        for field in t:
            _seed(field.type, f"{path}/{field.name}", out)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        out[path] = ("array", None)
        _seed(t.value_type, f"{path}/[]", out)
    else:
        out[path] = ("string", None)


def _kind(value: object) -> str | None:
    if value is None:
        return None
    if value is True or value is False:
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _conflict(record: dict, kinds: Kinds, new: dict[str, str]) -> tuple[str, str, str] | None:
    """The first (path, known kind, this kind) that disagrees; else None, with ``new`` filled."""
    stack: list[tuple[str, object]] = [("", record)]
    while stack:
        path, node = stack.pop()
        items = node.items() if isinstance(node, dict) else (("[]", v) for v in node)
        for key, value in items:
            kind = _kind(value)
            if kind is None:
                continue
            p = f"{path}/{key}"
            known = kinds[p][0] if p in kinds else new.get(p)
            if known is None:
                new[p] = kind
            elif known != kind:
                return p, known, kind
            if kind in ("object", "array"):
                stack.append((p, value))
    return None


def column_name(path: str) -> str:
    """``/meta/tags/[]`` -> ``meta.tags[]``."""
    out = ""
    for part in path.strip("/").split("/"):
        out += "[]" if part == "[]" else (f".{part}" if out else part)
    return out


def _lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_lone_surrogate(k) or _lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_lone_surrogate(v) for v in value)
    return False


def check_chunk(chunk: LineChunk, file: InputFile, kinds: Kinds, *, options: InputOptions,
                stats: InputStats | None) -> list[tuple[int, bytes]]:
    """The good ``(line, bytes)`` of ``chunk``; each bad line raises, or is counted in skip mode.

    ``kinds`` holds what earlier lines fixed and is extended with this chunk's good lines.
    """
    good: list[tuple[int, bytes]] = []
    pos = 0
    for i, raw in enumerate(chunk.data.split(b"\n")):
        line, start = chunk.first_line + i, pos
        pos += len(raw) + 1
        if not raw.strip():  # blank lines (and lines dropped for bad bytes) are no records
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad_record("bad_encoding", file, line,
                       f"cannot decode byte 0x{raw[exc.start:exc.start + 1].hex()} as utf-8 at "
                       f"byte offset {chunk.offset + start + exc.start} (column {exc.start + 1}: "
                       f"{exc.reason})",
                       "fix the bytes, pass --encoding if the file is not UTF-8,",
                       options=options, stats=stats)
            continue
        if may_be_too_deep(raw, MAX_DEPTH) and json_depth(raw) > MAX_DEPTH:
            bad_record("malformed_json", file, line,
                       f"the record is nested {json_depth(raw)} levels deep, more than the "
                       f"{MAX_DEPTH} levels ingest reads",
                       "flatten it, or keep the deep part as a JSON string,",
                       options=options, stats=stats)
            continue
        reason = None
        try:
            record = json.loads(text, object_pairs_hook=_pairs)
        except json.JSONDecodeError as exc:
            reason = f"malformed JSON ({exc.msg}: line {exc.lineno} column {exc.colno})"
        except _DuplicateKey as exc:
            reason = f"malformed JSON ({exc})"
        except RecursionError:
            reason = "malformed JSON (nested too deeply)"
        else:
            if _SURROGATE.search(raw) and _lone_surrogate(record):
                reason = "malformed JSON (a \\u escape is a lone surrogate, which is not Unicode)"
        if reason is not None:
            bad_record("malformed_json", file, line, reason, _FIX, options=options, stats=stats)
            continue
        if not isinstance(record, dict):
            kind = _kind(record) or "null"
            hint = " (a file holding one JSON array must be converted to JSON Lines first, " \
                   "e.g. jq -c '.[]')" if kind == "array" and line == 1 else ""
            bad_record("not_an_object", file, line,
                       f"{_ARTICLE.get(kind, 'a null')} is not a record{hint}",
                       "each line must hold one JSON object; fix the line",
                       options=options, stats=stats)
            continue
        new: dict[str, str] = {}
        clash = _conflict(record, kinds, new)
        if clash is not None:
            path, known, got = clash
            if path not in kinds:
                where = "earlier in the same line"
            elif kinds[path][1] is None:
                where = "in an earlier part of the file"
            else:
                where = f"in earlier records (first at line {kinds[path][1]})"
            bad_record("schema_mismatch", file, line,
                       f"column '{column_name(path)}' is {_ARTICLE[got]} here but "
                       f"{_ARTICLE[known]} {where}",
                       "make the types agree", options=options, stats=stats)
            continue
        for path, kind in new.items():
            kinds[path] = (kind, line)
        good.append((line, raw))
    return good

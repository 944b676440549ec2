"""Line-aligned chunks of a decompressed stream, transcoded to UTF-8, with line provenance.

JSONL, CSV and text-per-line all read through here, so encoding errors are reported (or
skipped) the same way everywhere and every later error can name its 1-based line.
"""

from __future__ import annotations

import codecs
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import pyarrow as pa

from ..errors import InputError
from .files import read_blocks
from .options import InputFile, InputOptions, InputStats, is_utf8

# 64 MiB of lines per chunk bounds memory on multi-GB inputs while keeping per-call
# overhead (one pyarrow parse per chunk) negligible. Tests shrink it to exercise boundaries.
CHUNK_BYTES = 64 << 20
_BOM = codecs.BOM_UTF8
SKIP_HINT = "pass --on-error skip to skip bad records"


@dataclass(frozen=True)
class LineChunk:
    """Whole lines of one file. ``data`` is UTF-8 and ends with ``\\n`` unless it is the file's tail.

    Lines dropped for bad bytes (skip mode) are left as empty lines so that line numbers of
    everything after them stay exact; ``dropped`` holds their 1-based numbers.
    """

    data: bytes
    first_line: int  # 1-based number of the first line in ``data``
    offset: int  # byte offset of ``data`` in the decompressed source
    dropped: frozenset[int] = frozenset()
    text: str | None = None  # ``data`` decoded, when the reader asked for text


def bad_record(kind: str, file: InputFile, line: int | None, reason: str, hint: str, *,
               options: InputOptions, stats: InputStats | None) -> None:
    """Raise the InputError for a bad record, or in skip mode count it in ``stats``.

    >>> bad_record("malformed_json", InputFile("a.jsonl", "jsonl", None, 9), 3, "malformed JSON (x)",
    ...            "fix the line", options=InputOptions(), stats=None)
    Traceback (most recent call last):
    zephon_store.errors.InputError: a.jsonl line 3: malformed JSON (x); fix the line or pass --on-error skip to skip bad records
    """
    where = f"{file.url} line {line}" if line is not None else file.url
    if options.on_error == "raise":
        raise InputError(f"{where}: {reason}; {hint} or {SKIP_HINT}", path=file.url, line=line)
    if stats is not None:
        stats.record_skip(kind, f"{where}: {reason}")


def iter_line_chunks(stream: BinaryIO, file: InputFile, *, options: InputOptions,
                     stats: InputStats | None, want_text: bool = False,
                     chunk_bytes: int | None = None) -> Iterator[LineChunk]:
    """Cut ``stream`` into chunks of whole lines of about ``chunk_bytes``, valid UTF-8.

    Bad bytes are reported here with their line and byte offset (or the line is blanked in
    skip mode). pyarrow.json cannot be relied on for that: it copies invalid UTF-8 into string
    columns unchecked. ``want_text`` also keeps the decoded str.
    """
    size = chunk_bytes or CHUNK_BYTES
    transcode = not is_utf8(options.encoding)
    carry, line, offset = b"", 1, 0
    blocks = read_blocks(stream, size)
    block = next(blocks, None)
    if block is not None and not transcode and block.startswith(_BOM):
        block, offset = block[len(_BOM):], len(_BOM)  # an encoding marker, not data
    while block is not None:
        # One block of lookahead, so that the tail of a file without a final newline joins
        # the chunk before it rather than becoming a chunk (and a schema) of its own.
        following = next(blocks, None)
        buf = carry + block if carry else block
        cut = len(buf) if following is None else buf.rfind(b"\n") + 1
        block = following
        if cut == 0:  # one line longer than a chunk: keep reading until it ends
            carry = buf
            continue
        data, carry = buf[:cut], buf[cut:]
        if data:
            yield _checked(data, line, offset, file, options, stats, want_text)
        line += data.count(b"\n")
        offset += cut


def _checked(data: bytes, first_line: int, offset: int, file: InputFile, options: InputOptions,
             stats: InputStats | None, want_text: bool) -> LineChunk:
    encoding = options.encoding
    utf8 = is_utf8(encoding)
    if utf8 and not want_text and _valid_utf8(data):
        return LineChunk(data, first_line, offset)
    try:
        text = data.decode("utf-8" if utf8 else encoding)
        return LineChunk(data if utf8 else text.encode("utf-8"), first_line, offset, text=text)
    except UnicodeDecodeError:
        pass
    # Slow path, only for chunks holding bad bytes: decode line by line to name each one.
    texts, dropped, pos = [], set(), 0
    for i, raw in enumerate(data.split(b"\n")):
        try:
            texts.append(raw.decode("utf-8" if utf8 else encoding))
        except UnicodeDecodeError as exc:
            bad = raw[exc.start:exc.start + 1].hex()
            bad_record(
                "bad_encoding", file, first_line + i,
                f"cannot decode byte 0x{bad} as {encoding} at byte offset {offset + pos + exc.start} "
                f"(column {exc.start + 1}: {exc.reason})",
                "fix the bytes, pass --encoding if the file is not UTF-8,",
                options=options, stats=stats,
            )
            texts.append("")
            dropped.add(first_line + i)
        pos += len(raw) + 1
    text = "\n".join(texts)
    return LineChunk(text.encode("utf-8"), first_line, offset, frozenset(dropped), text)


def _valid_utf8(data: bytes) -> bool:
    # Arrow's validator checks without building a str (bytes.decode would build one and
    # throw it away; docs/benchmarks.md, "Why the code is shaped this way").
    offsets = pa.py_buffer(struct.pack("<qq", 0, len(data)))
    array = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)])
    try:
        array.cast(pa.large_string())
    except pa.ArrowInvalid:
        return False
    return True

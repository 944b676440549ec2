"""Plain text: one sample per file, or one sample per line."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa

from ..errors import InputError
from .files import read_blocks
from .lines import bad_record, iter_line_chunks
from .options import InputFile, InputOptions, InputStats, is_utf8

# Arrow's string type addresses 2 GiB per array; one sample per file must fit in one.
MAX_FILE_SAMPLE_BYTES = (1 << 31) - 1


def read_text(stream: BinaryIO, file: InputFile, *, options: InputOptions,
              stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    """Batches with the single string column ``options.text_column``."""
    if options.text_mode == "line":
        yield from _lines(stream, file, options=options, stats=stats)
    else:
        yield from _whole(stream, file, options=options, stats=stats)


def _batch(texts: list[str], options: InputOptions) -> pa.RecordBatch:
    return pa.record_batch([pa.array(texts, pa.string())],
                           schema=pa.schema([(options.text_column, pa.string())]))


def _lines(stream: BinaryIO, file: InputFile, *, options: InputOptions,
           stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    for chunk in iter_line_chunks(stream, file, options=options, stats=stats, want_text=True):
        assert chunk.text is not None
        texts = chunk.text.split("\n")
        if texts[-1] == "":  # the newline ending the last line opens no new line
            texts.pop()
        if chunk.dropped:
            keep = [i for i in range(len(texts)) if chunk.first_line + i not in chunk.dropped]
            texts = [texts[i] for i in keep]
        # "\r\n" endings: the "\r" is part of the line ending, not of the sample.
        texts = [t[:-1] if t.endswith("\r") else t for t in texts]
        for start in range(0, len(texts), options.batch_rows):
            yield _batch(texts[start:start + options.batch_rows], options)


def _whole(stream: BinaryIO, file: InputFile, *, options: InputOptions,
           stats: InputStats | None) -> Iterator[pa.RecordBatch]:
    data = b"".join(read_blocks(stream, 64 << 20))
    utf8, bom = is_utf8(options.encoding), 0
    if utf8 and data.startswith(codecs.BOM_UTF8):
        data, bom = data[len(codecs.BOM_UTF8):], len(codecs.BOM_UTF8)
    encoding = "utf-8" if utf8 else options.encoding
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        bad_record("bad_encoding", file, line,
                   f"cannot decode byte 0x{data[exc.start:exc.start + 1].hex()} as {options.encoding} "
                   f"at byte offset {bom + exc.start} (column {column}: {exc.reason}); the whole file is "
                   f"one sample", "fix the bytes, pass --encoding if the file is not UTF-8,",
                   options=options, stats=stats)
        return
    if (len(data) if utf8 else len(text.encode("utf-8"))) > MAX_FILE_SAMPLE_BYTES:
        raise InputError(
            f"{file.url}: {len(data) / 2**30:.1f} GiB of text is too large for one sample "
            f"(limit 2 GiB); pass --text-mode line or split the file", path=file.url)
    yield _batch([text], options)

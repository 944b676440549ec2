"""Format v6's document table: every packed document's origin, size, text hash and spans.

A packed window holds pieces of many documents, so provenance, ``where`` and takedowns must
answer per document. The table (``formats/SPEC.md``, section 4.2) is three parts:

- ``tables.document_inputs``: one row per input file, in conversion order (``input``,
  ``first_document``, ``documents``): documents are numbered in input order, records in file
  order, so a document's input follows from its number;
- ``tables.documents``: one row per chunk of ``K = documents_per_chunk`` documents
  (``documents``, ``tokens``, the window range ``[first_window, end_window)`` its spans lie
  in, the ``xxh3`` and ``bytes`` of the chunk's file);
- the **chunks**, ``index/<xxh3>.arrow`` each, one row per document: ``record``, ``tokens``,
  ``text_xxh3`` and ``spans`` (``window``, ``offset``, ``length``), fetched on first use.

Everything here is pure: schemas, building chunk tables, and checking one chunk against the
index row that names it. Reading lives in :mod:`zephon_store.read.documents`, writing in
:mod:`zephon_store.write.documents`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .._util.arrow import column_np
from ..errors import ManifestError

__all__ = [
    "DOCUMENTS_PER_CHUNK", "DOCUMENT_CHUNK_SCHEMA", "DOCUMENT_INDEX_SCHEMA",
    "DOCUMENT_INPUTS_SCHEMA", "SPAN_TYPE", "DocumentChunk", "document_chunk_table",
    "parse_document_chunk",
]

# 16,384 documents a chunk: ~0.5 MiB compressed (the 16-byte text hashes do not compress),
# so a point lookup (a document, a window's documents) fetches about as much as one row group.
DOCUMENTS_PER_CHUNK = 16384
SPAN_TYPE = pa.struct([pa.field("window", pa.int64(), nullable=False),
                       pa.field("offset", pa.int32(), nullable=False),
                       pa.field("length", pa.int32(), nullable=False)])
DOCUMENT_CHUNK_SCHEMA = pa.schema([
    ("record", pa.int64()),
    ("tokens", pa.int64()),
    ("text_xxh3", pa.binary(16)),
    ("spans", pa.list_(pa.field("item", SPAN_TYPE, nullable=False))),
])
DOCUMENT_INDEX_SCHEMA = pa.schema([
    ("documents", pa.int64()),
    ("tokens", pa.int64()),
    ("first_window", pa.int64()),
    ("end_window", pa.int64()),
    ("xxh3", pa.binary(16)),
    ("bytes", pa.int64()),
])
DOCUMENT_INPUTS_SCHEMA = pa.schema([
    ("input", pa.string()),
    ("first_document", pa.int64()),
    ("documents", pa.int64()),
])


class DocumentChunk:
    """One chunk's columns as numpy arrays: ``record``, ``tokens``, ``text_xxh3`` (``(n, 16)``
    uint8), and the spans flattened (``span_offsets`` ``[n + 1]`` into ``window``,
    ``offset``, ``length``).

    >>> c = DocumentChunk.from_table(document_chunk_table(
    ...     np.array([0, 1]), np.array([5, 3]), np.zeros((2, 16), np.uint8),
    ...     np.array([0, 1, 3]), np.array([0, 0, 1]), np.array([0, 5, 0]), np.array([5, 3, 0])))
    >>> c.spans_of(1)
    (array([0, 1]), array([5, 0]), array([3, 0]))
    """

    def __init__(self, record, tokens, text_xxh3, span_offsets, window, offset, length) -> None:
        self.record, self.tokens, self.text_xxh3 = record, tokens, text_xxh3
        self.span_offsets, self.window, self.offset, self.length = (span_offsets, window,
                                                                    offset, length)

    @property
    def num_documents(self) -> int:
        return len(self.record)

    def spans_of(self, row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(window, offset, length)`` of the document at ``row`` of this chunk."""
        a, b = int(self.span_offsets[row]), int(self.span_offsets[row + 1])
        return self.window[a:b], self.offset[a:b], self.length[a:b]

    @classmethod
    def from_table(cls, table: pa.Table) -> DocumentChunk:
        n = table.num_rows
        spans = table.column("spans").combine_chunks()
        flat = spans.flatten()
        digests = table.column("text_xxh3").combine_chunks()
        text = (np.frombuffer(digests.buffers()[1], np.uint8, count=16 * n,
                              offset=16 * digests.offset).reshape(n, 16) if n
                else np.zeros((0, 16), np.uint8))
        offs = column_np(spans.offsets).astype(np.int64)
        return cls(column_np(table.column("record")), column_np(table.column("tokens")), text,
                   offs - offs[0], column_np(flat.field("window")).astype(np.int64),
                   column_np(flat.field("offset")).astype(np.int64),
                   column_np(flat.field("length")).astype(np.int64))


def document_chunk_table(record, tokens, text_xxh3, span_offsets, window, offset,
                         length) -> pa.Table:
    """A chunk table from numpy columns (``span_offsets``: ``[n + 1]`` positions into the
    flat span columns, starting at 0)."""
    n = len(record)
    digests = np.ascontiguousarray(text_xxh3, dtype=np.uint8).reshape(n, 16)
    flat = pa.StructArray.from_arrays(
        [pa.array(np.asarray(window, np.int64)), pa.array(np.asarray(offset, np.int32)),
         pa.array(np.asarray(length, np.int32))], fields=list(SPAN_TYPE))
    spans = pa.ListArray.from_arrays(pa.array(np.asarray(span_offsets, np.int32)), flat,
                                     type=DOCUMENT_CHUNK_SCHEMA.field("spans").type)
    return pa.table([
        pa.array(np.asarray(record, np.int64)),
        pa.array(np.asarray(tokens, np.int64)),
        pa.Array.from_buffers(pa.binary(16), n, [None, pa.py_buffer(digests.tobytes())]),
        spans,
    ], schema=DOCUMENT_CHUNK_SCHEMA)


def parse_document_chunk(data: bytes, where: str, *, documents: int, tokens: int,
                         first_window: int, end_window: int, window: int) -> DocumentChunk:
    """A chunk file's columns, checked against the index row that names it: ``documents``
    rows whose token counts add up to ``tokens``; spans inside ``[first_window, end_window)``,
    each of 1 to ``window`` tokens inside its window, covering at most their document's
    tokens. ManifestError (naming ``where``) otherwise."""
    def bad(what: str) -> ManifestError:
        return ManifestError(f"{where}: {what}; the document table is corrupted or forged: "
                             "restore it or re-convert")

    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise bad(f"not a readable Arrow IPC file ({type(exc).__name__}: {exc})") from exc
    if not table.schema.equals(DOCUMENT_CHUNK_SCHEMA):
        raise bad(f"schema {table.schema}, expected {DOCUMENT_CHUNK_SCHEMA}")
    if any(col.null_count for col in table.columns) or table.column(
            "spans").combine_chunks().flatten().null_count:
        raise bad("nulls")
    if table.num_rows != documents:
        raise bad(f"{table.num_rows} documents, not the {documents} its index row records")
    c = DocumentChunk.from_table(table)
    if c.num_documents and (int(c.tokens.min()) < 0 or int(c.record.min()) < 0):
        raise bad("a negative record number or token count")
    if int(c.tokens.sum()) != tokens:
        raise bad(f"token counts add up to {int(c.tokens.sum())}, not {tokens}")
    if c.window.size:
        if int(c.window.min()) < first_window or int(c.window.max()) >= end_window:
            raise bad(f"a span outside windows [{first_window}, {end_window})")
        end = c.offset + c.length
        if int(c.offset.min()) < 0 or int(c.length.min()) < 1 or int(end.max()) > window:
            raise bad(f"a span outside its window of {window} tokens")
        per_doc = np.add.reduceat(c.length, c.span_offsets[:-1][np.diff(c.span_offsets) > 0])
        if np.any(per_doc > c.tokens[np.diff(c.span_offsets) > 0]):
            raise bad("spans longer than their document")
    return c

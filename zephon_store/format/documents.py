"""Format v6's document table: every packed document's origin, size, text hash and spans.

A packed window holds pieces of many documents, so provenance, ``where`` and takedowns must
answer per document. The table (``formats/SPEC.md``, section 4.2) has four parts:

- ``tables.document_inputs``: one row per input file, in conversion order (``input``,
  ``first_document``, ``documents``): documents are numbered in input order, records in file
  order, so a document's input follows from its number;
- ``tables.documents``: one row per chunk of ``K = documents_per_chunk`` documents
  (``documents``, ``tokens``, the window range ``[first_window, end_window)`` its spans lie
  in, the ``xxh3`` and ``bytes`` of the chunk's file);
- the **chunks**, ``index/<xxh3>.arrow`` each, one row per document: ``record``, ``tokens``,
  ``text_xxh3`` and ``spans`` (``window``, ``offset``, ``length``), fetched on first use;
- ``tables.document_hashes``, the text-hash index: ``2**bits`` buckets of ``(text_xxh3,
  document)`` pairs sorted by hash, a bucket per file, so a lookup by text hash fetches one.

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
    "DOCUMENTS_PER_CHUNK", "DOCUMENT_CHUNK_SCHEMA", "DOCUMENT_HASHES_SCHEMA",
    "DOCUMENT_INDEX_SCHEMA", "DOCUMENT_INPUTS_SCHEMA", "HASH_BUCKET_SCHEMA", "SPAN_TYPE",
    "DocumentChunk", "digest_rows", "document_chunk_table", "hash_bucket_bits",
    "hash_buckets", "parse_document_chunk", "parse_hash_bucket", "sort_keys",
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
        spans = table.column("spans").combine_chunks()
        flat = spans.flatten()
        text = digest_rows(table.column("text_xxh3"))
        offs = column_np(spans.offsets).astype(np.int64)
        return cls(column_np(table.column("record")), column_np(table.column("tokens")), text,
                   offs - offs[0], column_np(flat.field("window")).astype(np.int64),
                   column_np(flat.field("offset")).astype(np.int64),
                   column_np(flat.field("length")).astype(np.int64))


def digest_rows(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A ``fixed_size_binary(16)`` column as an ``(n, 16)`` uint8 array (a view when the
    column is one chunk).

    >>> digest_rows(pa.array([b"a" * 16], pa.binary(16))).shape
    (1, 16)
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    n = len(col)
    if not n:
        return np.zeros((0, 16), np.uint8)
    return np.frombuffer(col.buffers()[1], np.uint8, count=16 * n,
                         offset=16 * col.offset).reshape(n, 16)


def _problem(where: str):
    """The ManifestError maker of one document-table file named ``where``."""
    def bad(what: str) -> ManifestError:
        return ManifestError(f"{where}: {what}; the document table is corrupted or forged: "
                             "restore it or re-convert")
    return bad


def _read_table(data: bytes, schema: pa.Schema, bad) -> pa.Table:
    """An Arrow IPC file of exactly ``schema`` without nulls, else ``bad(...)`` raised."""
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise bad(f"not a readable Arrow IPC file ({type(exc).__name__}: {exc})") from exc
    if not table.schema.equals(schema):
        raise bad(f"schema {table.schema}, expected {schema}")
    if any(col.null_count for col in table.columns):
        raise bad("nulls")
    return table


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
    bad = _problem(where)
    table = _read_table(data, DOCUMENT_CHUNK_SCHEMA, bad)
    if table.column("spans").combine_chunks().flatten().null_count:
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


# -- the text-hash index (tables.document_hashes) -----------------------------------------
# 2**bits buckets of (text_xxh3, document) pairs, bucket b holding the hashes whose first 64
# bits start with b (big-endian), sorted by hash then document: a lookup by text hash fetches
# one bucket of about documents_per_chunk pairs.
HASH_BUCKET_SCHEMA = pa.schema([("text_xxh3", pa.binary(16)), ("document", pa.int64())])
DOCUMENT_HASHES_SCHEMA = pa.schema([
    ("documents", pa.int64()),
    ("xxh3", pa.binary(16)),
    ("bytes", pa.int64()),
])


def hash_bucket_bits(documents: int, per_chunk: int) -> int:
    """``bits``: the hash index has ``2**bits`` buckets, the fewest that hold at most about
    ``per_chunk`` documents each.

    >>> hash_bucket_bits(0, 16384), hash_bucket_bits(16384, 16384), hash_bucket_bits(16385, 16384)
    (0, 0, 1)
    """
    need = max(1, -(-documents // per_chunk))
    return (need - 1).bit_length()


def hash_buckets(digests: np.ndarray, bits: int) -> np.ndarray:
    """The bucket of each ``(n, 16)`` uint8 digest: its first ``bits`` bits."""
    if bits == 0:
        return np.zeros(len(digests), np.int64)
    top = np.ascontiguousarray(digests[:, :8]).view(">u8").reshape(-1)
    return (top >> np.uint64(64 - bits)).astype(np.int64)


def sort_keys(digests: np.ndarray) -> np.ndarray:
    """Digests as fixed 16-byte strings: numpy orders them as the bytes compare."""
    return np.ascontiguousarray(digests, dtype=np.uint8).view("S16").reshape(-1)


def parse_hash_bucket(data: bytes, where: str, *, bucket: int, bits: int, documents: int,
                      num_documents: int) -> tuple[np.ndarray, np.ndarray]:
    """A hash bucket's ``(digests (n, 16), documents)``, checked: exactly ``documents`` rows,
    every hash in bucket ``bucket``, sorted, every document number in range."""
    bad = _problem(where)
    table = _read_table(data, HASH_BUCKET_SCHEMA, bad)
    if table.num_rows != documents:
        raise bad(f"{table.num_rows} hashes, not the {documents} its index row records")
    n = table.num_rows
    digests = digest_rows(table.column("text_xxh3"))
    docs = column_np(table.column("document")).astype(np.int64)
    keys = sort_keys(digests)
    if n and (np.any(hash_buckets(digests, bits) != bucket) or np.any(keys[1:] < keys[:-1])
              or int(docs.min()) < 0 or int(docs.max()) >= num_documents):
        raise bad("a hash outside its bucket, out of order, or a document out of range")
    return digests, docs

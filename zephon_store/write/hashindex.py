"""Write the document table's text-hash index (formats/SPEC.md 4.2) in bounded memory.

Every document's ``(text_xxh3, document)`` pair goes to one of ``2**bits`` buckets by the
first bits of its hash (:func:`~zephon_store.format.documents.hash_buckets`). Pairs arrive in
document order, chunk by chunk; they are spilled to local scratch files, one per **group** of
consecutive buckets, each group sized to sort in memory (:data:`GROUP_PAIRS` pairs, 24 bytes
each). :meth:`HashIndexWriter.finish` sorts one group at a time, writes each of its buckets to
``index/<xxh3>.arrow`` and returns the ``document_hashes`` table. Memory: one group.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from .._util.hashing import xxh3_hex
from ..format.documents import (
    DOCUMENT_HASHES_SCHEMA,
    HASH_BUCKET_SCHEMA,
    digest_rows,
    hash_bucket_bits,
    hash_buckets,
    sort_keys,
)
from ..format.manifest import INDEX_DIR, SIDE_TABLE_COMPRESSION, table_to_ipc
from .publish import _side_table, stored_intact

__all__ = ["GROUP_PAIRS", "HashIndexWriter"]

# Pairs sorted in memory at once (~100 MB): a corpus of up to 4M documents is one group.
GROUP_PAIRS = 4 << 20


class HashIndexWriter:
    """Collects ``(text_xxh3, document)`` of ``documents`` documents (:meth:`add`, in
    document order), then writes the buckets (:meth:`finish`)."""

    def __init__(self, area, out, documents: int, per_chunk: int) -> None:
        self.area, self.out, self.documents = area, out, documents
        self.bits = hash_bucket_bits(documents, per_chunk)
        groups = max(1, -(-documents // GROUP_PAIRS))
        self.group_bits = min(self.bits, (groups - 1).bit_length())
        self._paths: list[str] = []
        self._writers: list[pa.ipc.RecordBatchFileWriter] = []
        for g in range(1 << self.group_bits):
            path = area.scratch(f"hashes/{g:06d}.arrow")
            if not area.local:   # a remote area's scratch is a local temp name already
                os.makedirs(os.path.dirname(path), exist_ok=True)
            self._paths.append(path)
            self._writers.append(pa.ipc.new_file(path, HASH_BUCKET_SCHEMA))

    def add(self, first: int, digests: np.ndarray) -> None:
        """The digests ``(n, 16)`` of documents ``first, first + 1, ...``."""
        docs = np.arange(first, first + len(digests), dtype=np.int64)
        group = hash_buckets(digests, self.bits) >> (self.bits - self.group_bits)
        for g in np.unique(group):
            sel = group == g
            self._writers[int(g)].write_table(_pairs(digests[sel], docs[sel]))

    def finish(self) -> pa.Table:
        """Write every bucket; the ``document_hashes`` table (one row per bucket)."""
        rows = {k: [] for k in DOCUMENT_HASHES_SCHEMA.names}
        per_group = 1 << (self.bits - self.group_bits)
        for g, (path, writer) in enumerate(zip(self._paths, self._writers)):
            writer.close()
            table = pa.ipc.open_file(pa.memory_map(path)).read_all()
            os.remove(path)
            digests = digest_rows(table.column("text_xxh3"))
            docs = table.column("document").to_numpy()
            # Stable: equal hashes (the same text twice) stay in document order.
            order = np.argsort(sort_keys(digests), kind="stable")
            digests, docs = digests[order], docs[order]
            bounds = np.searchsorted(hash_buckets(digests, self.bits),
                                     np.arange(g * per_group, (g + 1) * per_group + 1))
            for b in range(per_group):
                lo, hi = int(bounds[b]), int(bounds[b + 1])
                data = table_to_ipc(_pairs(digests[lo:hi], docs[lo:hi]),
                                    compression=SIDE_TABLE_COMPRESSION)
                h = xxh3_hex(data)
                rel = f"{INDEX_DIR}/{h}.arrow"
                if not stored_intact(self.out, rel, len(data), h):
                    self.out.write_atomic(rel, data)
                rows["documents"].append(hi - lo)
                rows["xxh3"].append(bytes.fromhex(h))
                rows["bytes"].append(len(data))
        return _side_table(rows, DOCUMENT_HASHES_SCHEMA)


def _pairs(digests: np.ndarray, docs: np.ndarray) -> pa.Table:
    n = len(docs)
    buf = pa.py_buffer(np.ascontiguousarray(digests, dtype=np.uint8).tobytes())
    return pa.table([pa.Array.from_buffers(pa.binary(16), n, [None, buf]),
                     pa.array(docs, pa.int64())], schema=HASH_BUCKET_SCHEMA)

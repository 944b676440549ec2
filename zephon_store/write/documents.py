"""Write a packed dataset's document table (formats/SPEC.md 4.2) from staged parts.

Packing stages the document rows it knows as **parts**, Arrow IPC files of
:data:`~zephon_store.format.documents.DOCUMENT_CHUNK_SCHEMA` (one row per document, in
document order) whose span windows count from the part's own first window. Read in order,
the parts hold every document once. :class:`DocumentParts` records them; at publish time
:meth:`DocumentParts.write` streams them, shifts their windows to dataset window ids, cuts
chunks of ``K`` documents (global boundaries: the same chunks for any worker count), and
writes each chunk to ``index/<xxh3>.arrow`` at once, so memory stays one chunk whatever the
corpus size. It returns the two small tables the manifest names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .._util.hashing import xxh3_hex
from ..format.documents import (
    DOCUMENT_INDEX_SCHEMA,
    DOCUMENT_INPUTS_SCHEMA,
    DOCUMENTS_PER_CHUNK,
    DocumentChunk,
    digest_rows,
    document_chunk_table,
)
from ..format.manifest import INDEX_DIR, SIDE_TABLE_COMPRESSION, table_to_ipc
from .hashindex import HashIndexWriter
from .publish import _side_table, stored_intact

__all__ = ["DOCUMENT_PARTS", "DocumentParts", "concat_spans", "stage_concat_documents"]

# The key of a restream's findings (write/convert.py) that holds the staged parts.
DOCUMENT_PARTS = "document_parts"


def concat_spans(starts: np.ndarray, ends: np.ndarray, window: int,
                 limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Spans of documents at global tokens ``[starts, ends)`` of a stream cut into windows of
    ``window`` tokens, of which the first ``limit`` tokens are kept (the rest: the dropped
    tail). Returns ``span_offsets`` (``[docs + 1]``) and ``window``, ``offset``, ``length``.

    >>> concat_spans(np.array([0, 3]), np.array([3, 10]), 4, 8)
    (array([0, 1, 3]), array([0, 0, 1]), array([0, 3, 0]), array([3, 1, 4]))
    """
    starts = np.asarray(starts, np.int64)
    ends = np.minimum(np.asarray(ends, np.int64), limit)
    kept = ends > starts
    first = starts // window
    count = np.where(kept, (np.maximum(ends, starts + 1) - 1) // window - first + 1, 0)
    span_offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    k = np.arange(int(span_offsets[-1]), dtype=np.int64) - np.repeat(span_offsets[:-1], count)
    win = np.repeat(first, count) + k
    lo = np.maximum(np.repeat(starts, count), win * window)
    hi = np.minimum(np.repeat(ends, count), (win + 1) * window)
    return span_offsets, win, lo - win * window, hi - lo


@dataclass(frozen=True)
class DocumentParts:
    """The staged parts of a document table: ``rels`` (staging-relative ``.arrow`` paths, in
    document order), ``window_offsets`` (the dataset window id of each part's window 0) and
    ``input_documents`` (documents per input file, in input order)."""

    rels: tuple[str, ...]
    window_offsets: tuple[int, ...]
    input_documents: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"rels": list(self.rels), "window_offsets": list(self.window_offsets),
                "input_documents": list(self.input_documents)}

    @classmethod
    def from_dict(cls, d: dict) -> DocumentParts:
        return cls(tuple(d["rels"]), tuple(int(x) for x in d["window_offsets"]),
                   tuple(int(x) for x in d["input_documents"]))

    def write(self, area, out, input_names: list[str], *,
              per_chunk: int = DOCUMENTS_PER_CHUNK) -> dict[str, pa.Table]:
        """Write every chunk and hash bucket to ``out`` (skipping one already stored intact)
        and return the ``documents``, ``document_inputs`` and ``document_hashes`` tables."""
        index = {k: [] for k in DOCUMENT_INDEX_SCHEMA.names}
        hashes = HashIndexWriter(area, out, sum(self.input_documents), per_chunk)
        first = 0
        for chunk in self._chunks(area, per_chunk):
            hashes.add(first, chunk.text_xxh3)
            first += chunk.num_documents
            table = document_chunk_table(chunk.record, chunk.tokens, chunk.text_xxh3,
                                         chunk.span_offsets, chunk.window, chunk.offset,
                                         chunk.length)
            data = table_to_ipc(table, compression=SIDE_TABLE_COMPRESSION)
            h = xxh3_hex(data)
            rel = f"{INDEX_DIR}/{h}.arrow"
            if not stored_intact(out, rel, len(data), h):
                out.write_atomic(rel, data)
            has = chunk.window.size > 0
            index["documents"].append(chunk.num_documents)
            index["tokens"].append(int(chunk.tokens.sum()))
            index["first_window"].append(int(chunk.window.min()) if has else 0)
            index["end_window"].append(int(chunk.window.max()) + 1 if has else 0)
            index["xxh3"].append(bytes.fromhex(h))
            index["bytes"].append(len(data))
        counts = np.asarray(self.input_documents, np.int64)
        inputs = {"input": list(input_names),
                  "first_document": (np.cumsum(counts) - counts).tolist(),
                  "documents": counts.tolist()}
        return {"documents": _side_table(index, DOCUMENT_INDEX_SCHEMA),
                "document_inputs": _side_table(inputs, DOCUMENT_INPUTS_SCHEMA),
                "document_hashes": hashes.finish()}

    def _chunks(self, area, per_chunk: int):
        """The parts' rows regrouped into chunks of ``per_chunk`` documents, windows shifted."""
        pending: list[DocumentChunk] = []
        have = 0
        for rel, shift in zip(self.rels, self.window_offsets):
            reader = area.open_arrow(rel)
            for j in range(reader.num_record_batches):
                part = DocumentChunk.from_table(pa.Table.from_batches([reader.get_batch(j)]))
                part.window = part.window + shift
                pending.append(part)
                have += part.num_documents
                while have >= per_chunk:
                    chunk, pending = _take(pending, per_chunk)
                    have -= per_chunk
                    yield chunk
        if have:
            yield _take(pending, have)[0]


def _take(parts: list[DocumentChunk], n: int) -> tuple[DocumentChunk, list[DocumentChunk]]:
    """The first ``n`` documents of ``parts`` as one chunk, and what remains."""
    whole = _concat(parts)
    cut = int(whole.span_offsets[n])
    head = DocumentChunk(whole.record[:n], whole.tokens[:n], whole.text_xxh3[:n],
                         whole.span_offsets[:n + 1], whole.window[:cut], whole.offset[:cut],
                         whole.length[:cut])
    rest = DocumentChunk(whole.record[n:], whole.tokens[n:], whole.text_xxh3[n:],
                         whole.span_offsets[n:] - cut, whole.window[cut:], whole.offset[cut:],
                         whole.length[cut:])
    return head, ([rest] if rest.num_documents else [])


def _concat(parts: list[DocumentChunk]) -> DocumentChunk:
    if len(parts) == 1:
        return parts[0]
    bases = np.cumsum([0] + [len(p.window) for p in parts[:-1]])
    return DocumentChunk(
        np.concatenate([p.record for p in parts]), np.concatenate([p.tokens for p in parts]),
        np.concatenate([p.text_xxh3 for p in parts]),
        np.concatenate([[0]] + [p.span_offsets[1:] + b for p, b in zip(parts, bases)]),
        np.concatenate([p.window for p in parts]), np.concatenate([p.offset for p in parts]),
        np.concatenate([p.length for p in parts]))



def stage_concat_documents(task) -> tuple[int, dict]:
    """The document part of input ``i`` under concatenation (``packed/<i>.docs.arrow``): its
    documents' spans follow from their global token ranges alone (:func:`concat_spans`).
    Returns ``(i, counts)``."""
    from ..format.documents import DOCUMENT_CHUNK_SCHEMA

    i, area, rel, file_start, window, limit = task
    base = f"packed/{i:06d}.docs"
    counts = {"documents": 0, "documents_split": 0, "split_pieces": 0}
    tmp = area.scratch(f"{base}.arrow")
    with pa.ipc.new_file(tmp, DOCUMENT_CHUNK_SCHEMA, options=area.ipc_options) as out:
        reader = area.open_arrow(rel) if rel is not None else None
        pos = int(file_start)
        for j in range(reader.num_record_batches if reader is not None else 0):
            batch = reader.get_batch(j)
            offs = np.asarray(batch.column(0).offsets, dtype=np.int64)
            starts = pos + offs[:-1] - offs[0]
            ends = pos + offs[1:] - offs[0]
            pos = int(ends[-1]) if len(ends) else pos
            span_offsets, win, off, length = concat_spans(starts, ends, window, limit)
            out.write_table(document_chunk_table(np.asarray(batch.column(1)), ends - starts,
                                                 digest_rows(batch.column(2)), span_offsets,
                                                 win, off, length))
            pieces = np.diff(span_offsets)
            counts["documents"] += batch.num_rows
            counts["documents_split"] += int((pieces > 1).sum())
            counts["split_pieces"] += int(pieces[pieces > 1].sum())
    area.put(f"{base}.arrow", tmp)
    area.write_json(f"{base}.json", counts)   # written last: the part's done marker
    return i, counts

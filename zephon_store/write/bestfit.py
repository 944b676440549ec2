"""Best-fit packing of documents into windows ("Fewer Truncations Improve Language Modeling",
Ding et al., ICML 2024), over buffers whose boundaries depend on the token stream alone.

A document longer than a window of ``w`` tokens is split into ``w``-token pieces and a
remainder; every piece is then placed by **best-fit decreasing**: pieces sorted by length,
longest first (ties in document order), each into the open window with the least free space
that still holds it, else into a new window. A window's pieces are laid out in document
order, its free space at the end is padding.

The buffers (``buffer_tokens`` = ``buffer_windows * w``): buffer ``b`` packs the documents
whose first token lies in global tokens ``[b * T, (b + 1) * T)`` of the concatenated stream,
so its boundaries are fixed by the documents' lengths, never by how many workers pack them,
and a worker holds one buffer at a time (memory ``T`` tokens plus one document).

>>> place_pieces(np.array([3, 5, 2, 4]), window=8)    # lengths -> (window, offset) per piece
(array([0, 0, 1, 1]), array([0, 3, 0, 2]))
"""

from __future__ import annotations

import bisect
import os

import numpy as np
import pyarrow as pa

from ..format.documents import digest_rows

__all__ = ["place_pieces", "split_documents", "BufferLayout", "layout_buffer"]


def split_documents(lengths: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of documents of ``lengths`` tokens: ``(document, start, length)`` per piece,
    in document order; a document of ``n > window`` tokens gives ``n // window`` full pieces
    and its remainder; an empty document gives none.

    >>> split_documents(np.array([3, 10, 0, 4]), 4)
    (array([0, 1, 1, 1, 3]), array([0, 0, 4, 8, 0]), array([3, 4, 4, 2, 4]))
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = -(-lengths // window)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    k = np.arange(len(doc), dtype=np.int64) - np.repeat(first, counts)
    start = k * window
    length = np.minimum(window, lengths[doc] - start)
    return doc, start, length


def place_pieces(lengths: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing: the ``(window, offset)`` of each piece of ``lengths`` (each
    ``1..window`` tokens), windows numbered by their first piece in the input order, each
    window's pieces in input order."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    bins = np.empty(n, dtype=np.int64)
    free: list[tuple[int, int]] = []   # (free tokens, bin) of the open windows, sorted
    n_bins = 0
    # Longest first; a stable sort keeps equal lengths in input order (deterministic).
    for i in np.argsort(-lengths, kind="stable").tolist():
        need = int(lengths[i])
        j = bisect.bisect_left(free, (need, -1))
        if j < len(free):
            room, b = free.pop(j)
        else:
            room, b = window, n_bins
            n_bins += 1
        bins[i] = b
        if room - need:
            bisect.insort(free, (room - need, b))
    # Renumber windows by their first piece in input order, and lay pieces out in that order.
    first_seen = np.full(n_bins, n, dtype=np.int64)
    np.minimum.at(first_seen, bins, np.arange(n, dtype=np.int64))
    rank = np.empty(n_bins, dtype=np.int64)
    rank[np.argsort(first_seen, kind="stable")] = np.arange(n_bins, dtype=np.int64)
    win = rank[bins]
    order = np.lexsort((np.arange(n), win))
    offset = np.empty(n, dtype=np.int64)
    sorted_len = lengths[order]
    ends = np.cumsum(sorted_len)
    starts_of_win = np.searchsorted(win[order], np.arange(n_bins), side="left")
    base = np.concatenate([[0], ends])[starts_of_win][win[order]]
    offset[order] = ends - sorted_len - base
    return win, offset


class BufferLayout:
    """One buffer packed: ``tokens`` ``[windows, w]`` (padding ``pad_id``), ``num_tokens``
    per window, ``seg_offsets`` (``[windows + 1]`` into ``seg_starts``, every piece's offset
    in its window, in order), and per piece ``document``, ``window``, ``offset``, ``length``
    (in document order)."""

    def __init__(self, tokens, num_tokens, seg_offsets, seg_starts, doc, window, offset,
                 length) -> None:
        self.tokens, self.num_tokens = tokens, num_tokens
        self.seg_offsets, self.seg_starts = seg_offsets, seg_starts
        self.document, self.window, self.offset, self.length = doc, window, offset, length

    @property
    def num_windows(self) -> int:
        return len(self.num_tokens)


def layout_buffer(values: np.ndarray, doc_offsets: np.ndarray, window: int,
                  pad_id: int) -> BufferLayout:
    """Pack the documents of one buffer: ``values`` their tokens back to back,
    ``doc_offsets`` (``[docs + 1]``) where each begins in ``values``."""
    lengths = np.diff(doc_offsets)
    doc, start, length = split_documents(lengths, window)
    win, offset = place_pieces(length, window)
    n_win = int(win.max()) + 1 if win.size else 0
    tokens = np.full((n_win, window), pad_id, dtype=np.int32)
    # Every token's destination, piece by piece: one vectorised scatter.
    within = np.arange(int(length.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(length) - length, length)
    src = np.repeat(doc_offsets[:-1][doc] + start, length) + within
    dst = np.repeat(win * window + offset, length) + within
    tokens.reshape(-1)[dst] = values[src]
    num_tokens = np.bincount(win, weights=length, minlength=n_win).astype(np.int32)
    seg = np.lexsort((offset, win))
    seg_offsets = np.searchsorted(win[seg], np.arange(n_win + 1), side="left")
    return BufferLayout(tokens, num_tokens, seg_offsets, offset[seg], doc, win, offset, length)


# -- staging (a pool task per input: the buffers whose first token lies in it) -------------
class _Batches:
    """The staged parsed record batches of the inputs overlapping global tokens ``[a, z]``
    in stream order, with their global token ranges ``[lo, hi)``; a batch is read when first
    used, one kept at a time."""

    def __init__(self, area, rels: list, batch_tokens: list, file_starts: np.ndarray,
                 a: int, z: int) -> None:
        self.area, self.rels = area, rels
        where, lo, hi = [], [], []
        for i, counts in enumerate(batch_tokens):
            if file_starts[i + 1] < a or file_starts[i] > z:
                continue
            base = int(file_starts[i])
            for j, n in enumerate(counts):
                where.append((i, j))
                lo.append(base)
                hi.append(base + int(n))
                base += int(n)
        self.where = where
        self.lo, self.hi = np.array(lo, np.int64), np.array(hi, np.int64)
        self._reader: tuple[int, object] | None = None

    def get(self, k: int) -> pa.RecordBatch:
        i, j = self.where[k]
        if self._reader is None or self._reader[0] != i:
            self._reader = (i, self.area.open_arrow(self.rels[i]))
        return self._reader[1].get_batch(j)

    def documents(self, a: int, b: int):
        """The documents whose first token lies in ``[a, b)`` (an empty document's first
        token: where it sits): ``(values, doc_offsets, record, text_xxh3)``."""
        vals, lens, recs, hashes = [], [], [], []
        for k in np.flatnonzero((self.hi >= a) & (self.lo < b)):
            batch = self.get(int(k))
            col = batch.column(0)
            offs = np.asarray(col.offsets, dtype=np.int64)
            starts = int(self.lo[k]) + offs[:-1] - offs[0]
            sel = np.flatnonzero((starts >= a) & (starts < b))
            if not sel.size:
                continue
            r0, r1 = int(sel[0]), int(sel[-1]) + 1
            vals.append(np.asarray(col.values)[offs[r0]:offs[r1]])
            lens.append(np.diff(offs[r0:r1 + 1]))
            recs.append(np.asarray(batch.column(1))[r0:r1])
            hashes.append(digest_rows(batch.column(2))[r0:r1])
        if not vals:
            z = np.zeros(0, np.int64)
            return np.zeros(0, np.int32), np.zeros(1, np.int64), z, np.zeros((0, 16), np.uint8)
        lengths = np.concatenate(lens)
        return (np.concatenate(vals), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                np.concatenate(recs), np.concatenate(hashes))


def stage_buffers(task) -> tuple:
    """Pack buffers ``[b_lo, b_hi)`` (those whose first token lies in input ``i``) and stage
    ``packed/<i>`` (windows) and ``packed/<i>.docs.arrow`` (their documents, windows counted
    from this input's first). Returns the windows' :class:`StagedInput` and the counts."""
    from ..format.documents import DOCUMENT_CHUNK_SCHEMA, document_chunk_table
    from ..format.manifest import schema_to_base64
    from .rowsize import table_row_nbytes
    from .staged import arrow_batch_rows

    (i, b_lo, b_hi, buffer_tokens, last, window, pad_id, schema, rels, batch_tokens,
     file_starts, area, parsed) = task
    base = f"packed/{i:06d}"
    starts = np.asarray(file_starts, dtype=np.int64)
    src = _Batches(area, rels, batch_tokens, starts, b_lo * buffer_tokens,
                   int(starts[-1]) if last else b_hi * buffer_tokens)
    counts = {"windows": 0, "documents": 0, "documents_split": 0, "split_pieces": 0,
              "padded_tokens": 0}
    tmp, dtmp = area.scratch(f"{base}.arrow"), area.scratch(f"{base}.docs.arrow")
    sizes = []
    with pa.ipc.new_file(tmp, schema, options=area.ipc_options) as out, \
            pa.ipc.new_file(dtmp, DOCUMENT_CHUNK_SCHEMA, options=area.ipc_options) as docs:
        for b in range(b_lo, b_hi):
            a = b * buffer_tokens
            z = (b + 1) * buffer_tokens if b + 1 < b_hi or not last else np.iinfo(np.int64).max
            values, doc_offsets, record, digests = src.documents(a, z)
            lay = layout_buffer(values, doc_offsets, window, pad_id)
            if lay.num_windows:
                batch = _windows_batch(lay, schema)
                out.write_batch(batch)
                sizes.append(table_row_nbytes(batch))
            n_docs = len(record)
            pieces = np.bincount(lay.document, minlength=n_docs)
            span_offsets = np.concatenate([[0], np.cumsum(pieces)]).astype(np.int64)
            docs.write_table(document_chunk_table(
                record, np.diff(doc_offsets), digests, span_offsets,
                lay.window + counts["windows"], lay.offset, lay.length))
            counts["windows"] += lay.num_windows
            counts["documents"] += n_docs
            counts["documents_split"] += int((pieces > 1).sum())
            counts["split_pieces"] += int(pieces[pieces > 1].sum())
            counts["padded_tokens"] += lay.num_windows * window - int(lay.num_tokens.sum())
    rows = counts["windows"]
    batch_rows = arrow_batch_rows(tmp) if rows else None
    if rows:
        area.put(f"{base}.arrow", tmp)
    else:
        os.remove(tmp)
    area.put(f"{base}.docs.arrow", dtmp)
    area.save_npy(f"{base}.sizes.npy", np.concatenate(sizes) if sizes else np.zeros(0, np.int64))
    meta = parsed.restaged(rows=rows, base=base, batch_rows=batch_rows,
                           schema_b64=schema_to_base64(schema) if rows else None)
    area.write_json(f"{base}.docs.json", counts)
    area.write_json(f"{base}.json", meta.to_dict())  # written last: the task's done marker
    return meta, counts


def _windows_batch(lay: BufferLayout, schema: pa.Schema) -> pa.RecordBatch:
    """Windows in ``schema`` (packing.window_schema's: tokens, doc_starts if asked for,
    num_tokens)."""
    w = lay.tokens.shape[1]
    cols = [pa.FixedSizeListArray.from_arrays(pa.array(lay.tokens.reshape(-1)), w)]
    if len(schema) == 3:
        cols.append(pa.ListArray.from_arrays(pa.array(lay.seg_offsets.astype(np.int32)),
                                             pa.array(lay.seg_starts.astype(np.int32))))
    cols.append(pa.array(lay.num_tokens, pa.int32()))
    return pa.RecordBatch.from_arrays(cols, schema=schema)

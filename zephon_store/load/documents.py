"""Per-document attention data of packed token windows (``BatchOptions(documents=True)``).

A packed window ``w`` holds ``L + 1`` tokens (``input = w[:-1]``, ``labels = w[1:]``) and
pieces of several documents. Its documents are told apart by ``doc_starts`` (the packing's
column) and by *blank* runs: tokens that are not data (best-fit padding, a deny-listed
window or document). Every boundary starts a segment of the ``L`` input positions:

- position 0 (a window continuing a document counts from 0 again),
- every document start below ``L`` (a start at ``L`` only begins a label),
- every start and end of a blank run: a blank run is its own segment, attended to by
  nothing else and never a label.

From the segments, one function (:func:`document_fields`) computes the keys a batch adds;
names, dtypes and padding follow the two consumers read for this (docs/packing.md,
"Per-document attention data"):

=================  ==============  ============================================================
key                dtype, shape    meaning
=================  ==============  ============================================================
``position_ids``   int64 [B, L]    distance to the segment's first token (RoPE positions;
                                   TorchTitan's ``positions``: its masks start a document
                                   where they are 0)
``cu_seqlens``     int32 [B, L+1]  each row ``0, s1, ..., L``, right-padded with copies of
                                   ``L`` to a fixed length so rows stack (Megatron-Core's
                                   ``GPTDataset`` with ``inter_document_masking``)
``max_seqlen``     int32 [B]       the longest segment of the row
``loss_mask``      float32 [B, L]  1 where the label counts: 0 where the input or the label
                                   token is blank (Megatron's ``loss_mask``)
=================  ==============  ============================================================

:func:`flat_cu_seqlens` merges a batch's rows into the 1-D ``cu_seqlens`` of one token
stream (TorchTitan main's flat batches; Megatron's ``_merge_cu_seqlens_across_micro_batch``):
it equals the offsets where the flattened ``position_ids`` are 0, plus the total.

>>> tokens = np.array([[5, 6, 7, 8, 9, 1, 2]])        # L = 6, documents start at 0 and 3
>>> f = document_fields(tokens, [[0, 3]])
>>> f["position_ids"].tolist(), f["cu_seqlens"].tolist(), f["max_seqlen"].tolist()
([[0, 1, 2, 0, 1, 2]], [[0, 3, 6, 6, 6, 6, 6]], [3])
>>> blank = np.array([[0, 0, 0, 1, 1, 0, 0]], dtype=bool)   # tokens 3-4 blanked
>>> f = document_fields(tokens, [[0, 3, 5]], blank=blank)
>>> f["position_ids"].tolist(), f["loss_mask"].tolist()
([[0, 1, 2, 0, 1, 0]], [[1.0, 1.0, 0.0, 0.0, 0.0, 1.0]])
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

__all__ = ["DOCUMENT_KEYS", "DocumentColumns", "add_document_fields", "blank_spans", "cu_seqlens",
           "document_fields", "flat_cu_seqlens", "segment_starts", "window_positions"]

DOCUMENT_KEYS = ("position_ids", "cu_seqlens", "max_seqlen", "loss_mask")
# The packing's columns (write/packing.py writes these names; a manifest's packing entry
# names them too). NUM_TOKENS: best-fit windows' real tokens; the rest is padding.
TOKENS = "tokens"
DOC_STARTS = "doc_starts"
NUM_TOKENS = "num_tokens"


def segment_starts(rows: int, seq_len: int, doc_starts=None, blank=None) -> np.ndarray:
    """``[rows, seq_len]`` bool: where a segment of the input positions begins.

    ``doc_starts``: one sequence of document starts per row (None: none); ``blank``:
    ``[rows, seq_len + 1]`` bool, the tokens that are not data (None: none).

    >>> segment_starts(1, 5, [[2]]).astype(int).tolist()
    [[1, 0, 1, 0, 0]]
    >>> segment_starts(1, 5, None, np.array([[0, 1, 1, 0, 0, 0]], bool)).astype(int).tolist()
    [[1, 1, 0, 1, 0]]
    """
    starts = np.zeros((rows, seq_len), dtype=bool)
    if seq_len:
        starts[:, 0] = True
    if doc_starts is not None:
        if len(doc_starts) != rows:
            raise ValueError(f"doc_starts has {len(doc_starts)} rows, the batch has {rows}")
        counts = np.fromiter((len(s) for s in doc_starts), dtype=np.int64, count=rows)
        at = np.fromiter(chain.from_iterable(doc_starts), dtype=np.int64,
                         count=int(counts.sum()))
        row = np.repeat(np.arange(rows, dtype=np.int64), counts)
        # A start at position L (the last token of the L+1 window) only begins a label.
        keep = (at >= 0) & (at < seq_len)
        starts[row[keep], at[keep]] = True
    if blank is not None:
        b = np.asarray(blank, dtype=bool)[:, :seq_len]
        starts[:, 1:] |= b[:, 1:] != b[:, :-1]
    return starts


def window_positions(rows: int, seq_len: int, doc_starts=None, blank=None) -> np.ndarray:
    """``[rows, seq_len]`` int64 positions: distance to the latest segment start
    (:func:`segment_starts`).

    >>> window_positions(1, 6, [[0, 4]]).tolist()
    [[0, 1, 2, 3, 0, 1]]
    >>> window_positions(1, 4, [[2]]).tolist()   # continues a document, then a new one
    [[0, 1, 0, 1]]
    """
    return _positions(segment_starts(rows, seq_len, doc_starts, blank))


def _positions(starts: np.ndarray) -> np.ndarray:
    idx = np.arange(starts.shape[1], dtype=np.int64)
    last = np.where(starts, idx, 0)
    np.maximum.accumulate(last, axis=1, out=last)
    return idx - last


def cu_seqlens(starts: np.ndarray) -> np.ndarray:
    """``[rows, L + 1]`` int32 cumulative segment offsets from :func:`segment_starts`, each
    row ``0, s1, ..., L`` right-padded with ``L`` (Megatron-Core's padding: its merge keeps a
    row up to the first ``L``).

    >>> cu_seqlens(np.array([[1, 0, 1, 0], [1, 1, 1, 1]], bool)).tolist()
    [[0, 2, 4, 4, 4], [0, 1, 2, 3, 4]]
    """
    rows, seq_len = starts.shape
    out = np.full((rows, seq_len + 1), seq_len, dtype=np.int32)
    row, col = np.nonzero(starts)             # row-major: each row's starts in order
    counts = starts.sum(axis=1)
    first = np.cumsum(counts) - counts
    out[row, np.arange(row.size) - np.repeat(first, counts)] = col
    return out


def flat_cu_seqlens(cu: np.ndarray) -> np.ndarray:
    """The rows of a ``cu_seqlens`` batch (:func:`cu_seqlens`) as the 1-D offsets of their
    concatenation: each row up to its first ``L``, shifted by the row's start.

    >>> flat_cu_seqlens(np.array([[0, 2, 4, 4, 4], [0, 1, 4, 4, 4]], np.int32)).tolist()
    [0, 2, 4, 5, 8]
    """
    cu = np.asarray(cu)
    rows, width = cu.shape
    seq_len = width - 1
    if rows == 0:
        return np.zeros(1, dtype=np.int32)   # an empty stream: one offset, 0
    ends = np.argmax(cu == seq_len, axis=1)   # every row holds L; its first is the end
    keep = np.arange(width)[None, :] <= ends[:, None]
    keep[1:, 0] = False                       # each later row's 0 is the previous row's end
    shifted = cu.astype(np.int64) + (np.arange(rows, dtype=np.int64) * seq_len)[:, None]
    return shifted[keep].astype(np.int32)


def document_fields(tokens, doc_starts=None, *, blank=None) -> dict[str, np.ndarray]:
    """``position_ids``, ``cu_seqlens``, ``max_seqlen`` and ``loss_mask`` of ``[B, L+1]``
    token windows (module docstring), from their ``doc_starts`` and ``blank`` tokens."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"token windows must be a [batch, L+1] array with L >= 1, got shape "
                         f"{tokens.shape}")
    rows, seq_len = tokens.shape[0], tokens.shape[1] - 1
    if blank is not None:
        blank = np.asarray(blank, dtype=bool)
        if blank.shape != tokens.shape:
            raise ValueError(f"blank has shape {blank.shape}, the windows {tokens.shape}")
    starts = segment_starts(rows, seq_len, doc_starts, blank)
    cu = cu_seqlens(starts)
    if blank is None:
        loss = np.ones((rows, seq_len), dtype=np.float32)
    else:
        loss = (~blank[:, :-1] & ~blank[:, 1:]).astype(np.float32)
    return {"position_ids": _positions(starts), "cu_seqlens": cu,
            "max_seqlen": np.diff(cu, axis=1).max(axis=1, initial=0).astype(np.int32),
            "loss_mask": loss}


@dataclass(frozen=True)
class DocumentColumns:
    """The columns of a packed source the document fields come from (``tokens``,
    ``doc_starts``, and for best-fit windows ``num_tokens``: the tokens from it on are
    padding). :meth:`of` checks a source (every part of a mixture) holds them.

    >>> DocumentColumns().names
    ('tokens', 'doc_starts')
    """

    tokens: str = TOKENS
    doc_starts: str = DOC_STARTS
    num_tokens: str | None = None
    pad_id: int = 0          # what a taken-down document's tokens become (the packing's)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.tokens, self.doc_starts) + ((self.num_tokens,) if self.num_tokens else ())

    def with_columns(self, columns) -> tuple[str, ...] | None:
        """``columns`` (None: all) with these added, for a reader's selection.

        >>> DocumentColumns(num_tokens="num_tokens").with_columns(["tokens"])
        ('tokens', 'doc_starts', 'num_tokens')
        """
        if columns is None:
            return None
        return tuple(columns) + tuple(c for c in self.names if c not in columns)

    @classmethod
    def of(cls, source) -> DocumentColumns:
        """The columns of ``source`` (a dataset, a mixture or its opened parts: anything
        with ``parts()``), refused in one line unless every part is packed token windows
        with document starts."""
        parts = source.parts()
        padded = any(NUM_TOKENS in part.schema.names for _, part in parts)
        pads = {int((getattr(part.manifest, "packing", None) or {}).get("pad_id") or 0)
                for _, part in parts}
        cols = cls(num_tokens=NUM_TOKENS if padded else None,
                   pad_id=pads.pop() if len(pads) == 1 else 0)
        for name, part in parts:
            have = part.schema.names
            label = f"{part.url}" + (f" (source {name!r})" if name else "")
            if cols.tokens not in have:
                raise ValueError(
                    f"documents=True needs packed token windows, but {label} has no "
                    f"{cols.tokens!r} column (columns: {have}); convert with --tokenizer "
                    "--seq-len, or leave documents off")
            if cols.doc_starts not in have:
                raise ValueError(
                    f"documents=True needs document starts, but {label} was packed without "
                    f"a {cols.doc_starts!r} column; re-convert with doc_starts (the default), "
                    "or leave documents off")
        return cols


def blank_spans(batch: dict, columns: DocumentColumns, spans) -> tuple[dict, np.ndarray | None]:
    """``(batch, blank)``: the tokens of ``spans`` (``(row, offset, length)`` arrays, a
    deny list's documents in these windows) replaced by the padding id, and ``[B, L+1]``
    bool marking them (None when there are none). Only those tokens change: every other
    document of the window reads as before. The tokens are copied (they may be read-only
    views of decoded row groups).

    >>> b, blank = blank_spans({"tokens": np.array([[5, 6, 7, 8]])}, DocumentColumns(),
    ...                        (np.array([0]), np.array([1]), np.array([2])))
    >>> b["tokens"].tolist(), blank.astype(int).tolist()
    ([[5, 0, 0, 8]], [[0, 1, 1, 0]])
    """
    rows, offsets, lengths = spans
    if not len(rows):
        return batch, None
    tokens = np.array(batch[columns.tokens])
    blank = np.zeros(tokens.shape, dtype=bool)
    for r, o, n in zip(rows.tolist(), offsets.tolist(), lengths.tolist()):
        blank[r, o:o + n] = True
    tokens[blank] = columns.pad_id
    return {**batch, columns.tokens: tokens}, blank


def add_document_fields(batch: dict, columns: DocumentColumns, masked=None,
                        blank=None) -> dict:
    """``batch`` (a dict of columns, already blanked) with the :data:`DOCUMENT_KEYS`: a
    ``masked`` row (a deny-listed window) is one blank segment, best-fit padding (the
    tokens from ``num_tokens`` on) another, and ``blank`` (``[B, L+1]`` bool, or None)
    marks other blanked tokens. The one place every front end adds them (the loaders'
    pipeline, Grain's random-access source)."""
    tokens = np.asarray(batch[columns.tokens])
    if tokens.ndim != 2:
        raise ValueError(f"column {columns.tokens!r} is not token windows (shape "
                         f"{tokens.shape}); documents=True needs a packed dataset")
    blank = None if blank is None else np.array(blank, dtype=bool)
    real = None if columns.num_tokens is None else batch.get(columns.num_tokens)
    if real is not None:
        # A mixture row from a source without padding holds None: all its tokens are real.
        real = np.array([tokens.shape[1] if n is None else n for n in real], dtype=np.int64)
        pad = np.arange(tokens.shape[1])[None, :] >= real[:, None]
        blank = pad if blank is None else blank | pad
    if masked is not None and np.any(masked):
        blank = np.zeros(tokens.shape, dtype=bool) if blank is None else blank
        blank[np.asarray(masked, dtype=bool)] = True
    out = dict(batch)
    out.update(document_fields(tokens, batch[columns.doc_starts], blank=blank))
    return out

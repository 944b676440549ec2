"""Token windows -> TorchTitan batches (torch + numpy only; no TorchTitan import).

A packed window ``w`` of ``L + 1`` tokens gives ``input = w[:-1]`` and ``labels = w[1:]``.
``positions`` restart at 0 where a document begins (``doc_starts``) and at the start of every
window, exactly like TorchTitan 0.3.0's own ``HuggingFaceTextDataset`` (a document continued
from the previous window counts from 0 again). Without ``doc_starts`` a window is one
segment: ``positions = 0..L-1``. Best-fit windows (``num_tokens``, docs/packing.md) end in padding:
label ``j`` (the token at ``j + 1``) is :data:`IGNORE_INDEX` when ``j + 1 >= num_tokens``, so
padding is never a label; real tokens never attend to it (it comes after them).

Two layouts, chosen by the trainer's build arguments:

- rows (TorchTitan 0.3.0): ``({"input": [B, L], "positions": [B, L]}, labels [B, L])``;
- flat (TorchTitan main, components/data): the ``B`` windows of a micro-batch concatenated,
  ``input``/``positions``/``labels`` of shape ``[B * L]``; window boundaries are segment
  boundaries (positions restart at 0). The token count travels as
  ``input_dict.num_valid_tokens`` (attribute, and ``pop("num_valid_tokens")``), never as a
  key, so it cannot leak into the model's keyword arguments. (At main ``b5bcd76c`` the
  trainer counts ``labels != -100`` itself and reads neither; earlier commits read it.)
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np
import torch

NUM_VALID_TOKENS = "num_valid_tokens"
# TorchTitan's cross-entropy skips labels equal to this (components/loss.py).
IGNORE_INDEX = -100


class TitanInputs(dict):
    """Model inputs (``input``, ``positions``) plus the batch's ``num_valid_tokens``.

    TorchTitan main has read the count both as ``getattr(input_dict, "num_valid_tokens")`` and
    as ``input_dict.pop("num_valid_tokens")``; both work here, and ``**input_dict`` (the
    model's keyword arguments) does not contain it.
    """

    def __init__(self, inputs: dict[str, Any], *, num_valid_tokens: int) -> None:
        super().__init__(inputs)
        self.num_valid_tokens = num_valid_tokens

    def pop(self, key, *default):
        if key == NUM_VALID_TOKENS and key not in self:
            return self.num_valid_tokens
        return super().pop(key, *default)

    def __missing__(self, key):
        if key == NUM_VALID_TOKENS:
            return self.num_valid_tokens
        raise KeyError(key)

    def __reduce__(self):
        return (_rebuild_inputs, (dict(self), self.num_valid_tokens))


def _rebuild_inputs(inputs: dict, num_valid_tokens: int) -> TitanInputs:
    return TitanInputs(inputs, num_valid_tokens=num_valid_tokens)


def window_positions(rows: int, seq_len: int, doc_starts: list | None = None) -> np.ndarray:
    """``[rows, seq_len]`` int64 positions: distance to the latest document start.

    >>> window_positions(1, 6, [[0, 4]]).tolist()
    [[0, 1, 2, 3, 0, 1]]
    >>> window_positions(1, 4, [[2]]).tolist()   # continues a document, then a new one
    [[0, 1, 0, 1]]
    """
    pos = np.broadcast_to(np.arange(seq_len, dtype=np.int64), (rows, seq_len)).copy()
    if doc_starts is None:
        return pos
    if len(doc_starts) != rows:
        raise ValueError(f"doc_starts has {len(doc_starts)} rows, the batch has {rows}")
    counts = np.fromiter((len(s) for s in doc_starts), dtype=np.int64, count=rows)
    starts = np.fromiter(chain.from_iterable(doc_starts), dtype=np.int64, count=int(counts.sum()))
    row = np.repeat(np.arange(rows, dtype=np.int64), counts)
    # A start at position L (the last token of the L+1 window) only begins a label.
    keep = starts < seq_len
    last = np.zeros((rows, seq_len), dtype=np.int64)
    last[row[keep], starts[keep]] = starts[keep]
    np.maximum.accumulate(last, axis=1, out=last)
    return pos - last


def rows_batch(tokens: np.ndarray, doc_starts: list | None = None, *,
               positions: bool = True, num_tokens: np.ndarray | None = None,
               ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """TorchTitan 0.3.0 batch from ``[B, L+1]`` windows: ``({"input", "positions"}, labels)``;
    with ``num_tokens`` (best-fit), labels of padding are :data:`IGNORE_INDEX`.

    >>> x, y = rows_batch(np.array([[5, 6, 7, 8]]), [[0, 2]])
    >>> x["input"].tolist(), x["positions"].tolist(), y.tolist()
    ([[5, 6, 7]], [[0, 1, 0]], [[6, 7, 8]])
    >>> rows_batch(np.array([[5, 6, 0, 0]]), num_tokens=np.array([2]))[1].tolist()
    [[6, -100, -100]]
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"token windows must be a [batch, L+1] array with L >= 1, got shape "
                         f"{tokens.shape}")
    t = torch.from_numpy(tokens.astype(np.int64))
    inputs: dict[str, torch.Tensor] = {"input": t[:, :-1].contiguous()}
    if positions:
        b, w = tokens.shape
        inputs["positions"] = torch.from_numpy(window_positions(b, w - 1, doc_starts))
    labels = t[:, 1:].contiguous()
    if num_tokens is not None:
        pad = np.arange(1, tokens.shape[1])[None, :] >= np.asarray(num_tokens)[:, None]
        labels[torch.from_numpy(pad)] = IGNORE_INDEX
    return inputs, labels


def flat_batch(tokens: np.ndarray, doc_starts: list | None = None, *,
               positions: bool = True, num_tokens: np.ndarray | None = None,
               ) -> tuple[TitanInputs, torch.Tensor]:
    """TorchTitan main batch: the windows' inputs/labels/positions as one 1-D token stream.

    >>> x, y = flat_batch(np.array([[5, 6, 7], [8, 9, 10]]))
    >>> x["input"].tolist(), x["positions"].tolist(), y.tolist(), x.num_valid_tokens
    ([5, 6, 8, 9], [0, 1, 0, 1], [6, 7, 9, 10], 4)
    """
    inputs, labels = rows_batch(tokens, doc_starts, positions=positions, num_tokens=num_tokens)
    flat = {k: v.reshape(-1) for k, v in inputs.items()}
    labels = labels.reshape(-1)
    # Concatenated windows have no padding; best-fit's is ignored (IGNORE_INDEX).
    return TitanInputs(flat, num_valid_tokens=int((labels != IGNORE_INDEX).sum())), labels

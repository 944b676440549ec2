"""Token windows -> TorchTitan batches (torch + numpy only; no TorchTitan import).

A packed window ``w`` of ``L + 1`` tokens gives ``input = w[:-1]`` and ``labels = w[1:]``.
``positions`` restart at 0 where a document begins (``doc_starts``) and at the start of every
window, exactly like TorchTitan 0.3.0's own ``HuggingFaceTextDataset`` (a document continued
from the previous window counts from 0 again). Without ``doc_starts`` a window is one
segment: ``positions = 0..L-1``. Both come from :mod:`zephon_store.load.documents`, the
implementation every front end uses; with ``--dataloader.documents`` the batch's document
fields are taken as they are (``position_ids`` as ``positions``, labels of blank tokens set
to -100) and ``cu_seqlens``/``max_seqlen`` ride on the input dict as attributes, never as
keys: TorchTitan passes every key but ``input`` to the model's ``forward``, which takes
``positions`` and builds its varlen/Flex masks from them itself. Best-fit windows
(``num_tokens``, docs/packing.md) end in padding: label ``j`` (the token at ``j + 1``) is
:data:`IGNORE_INDEX` when ``j + 1 >= num_tokens``, so padding is never a label; real tokens
never attend to it (it comes after them). With documents on, the padding is also its own
segment (``loss_mask`` 0 there).

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

from typing import Any

import numpy as np
import torch

from ..load.documents import flat_cu_seqlens, window_positions

NUM_VALID_TOKENS = "num_valid_tokens"
# TorchTitan's cross-entropy skips labels equal to this (components/loss.py).
IGNORE_INDEX = -100


class TitanInputs(dict):
    """Model inputs (``input``, ``positions``) plus the batch's ``num_valid_tokens`` and,
    with documents on, ``cu_seqlens`` (int32) and ``max_seqlen`` (int) as attributes.

    TorchTitan main has read the count both as ``getattr(input_dict, "num_valid_tokens")`` and
    as ``input_dict.pop("num_valid_tokens")``; both work here, and ``**input_dict`` (the
    model's keyword arguments) does not contain it.
    """

    def __init__(self, inputs: dict[str, Any], *, num_valid_tokens: int,
                 cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> None:
        super().__init__(inputs)
        self.num_valid_tokens = num_valid_tokens
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max_seqlen

    def pop(self, key, *default):
        if key == NUM_VALID_TOKENS and key not in self:
            return self.num_valid_tokens
        return super().pop(key, *default)

    def __missing__(self, key):
        if key == NUM_VALID_TOKENS:
            return self.num_valid_tokens
        raise KeyError(key)

    def __reduce__(self):
        return (_rebuild_inputs, (dict(self), self.num_valid_tokens, self.cu_seqlens,
                                  self.max_seqlen))


def _rebuild_inputs(inputs: dict, num_valid_tokens: int, cu_seqlens=None,
                    max_seqlen=None) -> TitanInputs:
    return TitanInputs(inputs, num_valid_tokens=num_valid_tokens, cu_seqlens=cu_seqlens,
                       max_seqlen=max_seqlen)


def rows_batch(tokens: np.ndarray, doc_starts: list | None = None, *,
               positions: bool = True, num_tokens: np.ndarray | None = None,
               documents: dict | None = None,
               ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """TorchTitan 0.3.0 batch from ``[B, L+1]`` windows: ``({"input", "positions"}, labels)``;
    with ``num_tokens`` (best-fit), labels of padding are :data:`IGNORE_INDEX`.

    ``documents``: the batch's document fields (:func:`~zephon_store.load.documents.
    document_fields`): ``positions`` are its ``position_ids``, a label whose ``loss_mask``
    is 0 is -100, and the inputs are a :class:`TitanInputs` carrying ``cu_seqlens``
    ``[B, L+1]`` (Megatron's row padding) and ``max_seqlen``.

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
    labels = t[:, 1:].contiguous()
    if documents is not None:
        inputs["positions"] = torch.from_numpy(np.asarray(documents["position_ids"], np.int64))
        labels[torch.from_numpy(np.asarray(documents["loss_mask"]) == 0)] = IGNORE_INDEX
        return TitanInputs(inputs, num_valid_tokens=int((labels != IGNORE_INDEX).sum()),
                           cu_seqlens=torch.from_numpy(np.asarray(documents["cu_seqlens"])),
                           max_seqlen=int(np.max(documents["max_seqlen"], initial=0))), labels
    if positions:
        b, w = tokens.shape
        inputs["positions"] = torch.from_numpy(window_positions(b, w - 1, doc_starts))
    if num_tokens is not None:
        pad = np.arange(1, tokens.shape[1])[None, :] >= np.asarray(num_tokens)[:, None]
        labels[torch.from_numpy(pad)] = IGNORE_INDEX
    return inputs, labels


def flat_batch(tokens: np.ndarray, doc_starts: list | None = None, *,
               positions: bool = True, num_tokens: np.ndarray | None = None,
               documents: dict | None = None,
               ) -> tuple[TitanInputs, torch.Tensor]:
    """TorchTitan main batch: the windows' inputs/labels/positions as one 1-D token stream.

    With ``documents`` (as :func:`rows_batch`), ``cu_seqlens`` is the stream's 1-D offsets
    (:func:`~zephon_store.load.documents.flat_cu_seqlens`): what TorchTitan main's
    ``create_varlen_metadata_for_document`` derives from the flat ``positions``.

    >>> x, y = flat_batch(np.array([[5, 6, 7], [8, 9, 10]]))
    >>> x["input"].tolist(), x["positions"].tolist(), y.tolist(), x.num_valid_tokens
    ([5, 6, 8, 9], [0, 1, 0, 1], [6, 7, 9, 10], 4)
    """
    inputs, labels = rows_batch(tokens, doc_starts, positions=positions, num_tokens=num_tokens,
                                documents=documents)
    flat = {k: v.reshape(-1) for k, v in inputs.items()}
    labels = labels.reshape(-1)
    if documents is not None:
        cu = torch.from_numpy(flat_cu_seqlens(np.asarray(documents["cu_seqlens"])))
        return TitanInputs(flat, num_valid_tokens=inputs.num_valid_tokens, cu_seqlens=cu,
                           max_seqlen=inputs.max_seqlen), labels
    # Concatenated windows have no padding; best-fit's is ignored (IGNORE_INDEX).
    return TitanInputs(flat, num_valid_tokens=int((labels != IGNORE_INDEX).sum())), labels

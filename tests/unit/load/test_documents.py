"""Per-document attention data (zephon_store/load/documents.py) against a brute-force
token-by-token reference, and the conventions of its two consumers: Megatron-Core's padded
``cu_seqlens`` rows and TorchTitan main's offsets derived from ``positions == 0``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_store.load.documents import (
    DocumentColumns,
    document_fields,
    flat_cu_seqlens,
)


def brute_force(window, doc_starts, blank=None) -> dict:
    """The fields of one ``L+1`` window, one token at a time: a segment starts at 0, at a
    document start below ``L`` and wherever blank-ness changes."""
    seq_len = len(window) - 1
    blank = [False] * len(window) if blank is None else [bool(b) for b in blank]
    starts = [i for i in range(seq_len)
              if i == 0 or i in set(doc_starts) or blank[i] != blank[i - 1]]
    positions, seg = [], -1
    for i in range(seq_len):
        if i in starts:
            seg = i
        positions.append(i - seg)
    bounds = starts + [seq_len]
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    loss = [0.0 if blank[i] or blank[i + 1] else 1.0 for i in range(seq_len)]
    return {"position_ids": positions, "offsets": bounds, "max_seqlen": max(lengths),
            "loss_mask": loss}


def check_row(fields: dict, r: int, want: dict, seq_len: int) -> None:
    """Row ``r`` of a batch's fields equals the brute force ``want``, Megatron's padding
    included (the row holds its offsets, then copies of L up to L + 1 entries)."""
    assert list(fields["position_ids"][r]) == want["position_ids"]
    cu = [int(v) for v in fields["cu_seqlens"][r]]
    n = len(want["offsets"])
    assert cu[:n] == want["offsets"] and cu[n:] == [seq_len] * (seq_len + 1 - n)
    assert int(fields["max_seqlen"][r]) == want["max_seqlen"]
    assert [float(v) for v in fields["loss_mask"][r]] == want["loss_mask"]


@st.composite
def windows(draw):
    rows = draw(st.integers(0, 4))
    width = draw(st.integers(2, 20))
    tokens = np.arange(rows * width, dtype=np.int32).reshape(rows, width)
    starts = [sorted(draw(st.sets(st.integers(0, width - 1), max_size=width)))
              for _ in range(rows)]
    blank = None
    if draw(st.booleans()):
        blank = np.array(draw(st.lists(st.lists(st.booleans(), min_size=width, max_size=width),
                                       min_size=rows, max_size=rows)), dtype=bool)
        blank = blank.reshape(rows, width)
    return tokens, starts, blank


@settings(max_examples=300, deadline=None)
@given(windows())
def test_fields_equal_a_token_by_token_reference(case) -> None:
    tokens, starts, blank = case
    f = document_fields(tokens, starts, blank=blank)
    rows, seq_len = tokens.shape[0], tokens.shape[1] - 1
    assert f["position_ids"].dtype == np.int64 and f["position_ids"].shape == (rows, seq_len)
    assert f["cu_seqlens"].dtype == np.int32 and f["cu_seqlens"].shape == (rows, seq_len + 1)
    assert f["max_seqlen"].dtype == np.int32 and f["max_seqlen"].shape == (rows,)
    assert f["loss_mask"].dtype == np.float32 and f["loss_mask"].shape == (rows, seq_len)
    for r in range(rows):
        check_row(f, r, brute_force(tokens[r], starts[r], None if blank is None else blank[r]),
                  seq_len)


@settings(max_examples=200, deadline=None)
@given(windows())
def test_flat_offsets_are_torchtitans_and_megatrons(case) -> None:
    """The flat offsets equal TorchTitan main's rule (``create_varlen_metadata_for_document``:
    where the flattened positions are 0, then the token count) and Megatron's merge of the
    padded rows (each row to its first L, shifted by its start)."""
    tokens, starts, blank = case
    f = document_fields(tokens, starts, blank=blank)
    rows, seq_len = tokens.shape[0], tokens.shape[1] - 1
    flat = flat_cu_seqlens(f["cu_seqlens"])
    assert flat.dtype == np.int32
    titan = np.flatnonzero(f["position_ids"].reshape(-1) == 0).tolist() + [rows * seq_len]
    if rows == 0:
        titan = [0]
    assert flat.tolist() == titan
    merged = [0]
    for r in range(rows):
        row = f["cu_seqlens"][r].tolist()
        merged += [v + r * seq_len for v in row[1:row.index(seq_len) + 1]]
    assert flat.tolist() == merged


def test_an_empty_batch_has_empty_fields() -> None:
    f = document_fields(np.zeros((0, 9), dtype=np.int32), [])
    assert {k: v.shape for k, v in f.items()} == {
        "position_ids": (0, 8), "cu_seqlens": (0, 9), "max_seqlen": (0,), "loss_mask": (0, 8)}


def test_documents_refused_in_one_line_on_data_that_is_not_packed(tmp_path) -> None:
    from tests.helpers import small_dataset
    from zephon_store import BatchOptions, Topology, open_dataset
    from zephon_store.load.loader import Loader

    tiny_dataset = small_dataset(str(tmp_path), files=1, records=20, row_group_rows=10)

    with pytest.raises(ValueError, match=r"documents=True needs packed token windows, but .* "
                                         r"has no 'tokens' column .*convert with --tokenizer"):
        DocumentColumns.of(open_dataset(tiny_dataset))
    with pytest.raises(ValueError, match="documents=True needs packed token windows"):
        Loader(tiny_dataset, topology=Topology(4), batch=BatchOptions(documents=True))

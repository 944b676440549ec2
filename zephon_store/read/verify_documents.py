"""``verify``'s checks of a format-v6 document table (formats/SPEC.md 4.2).

Like the row-group index: its two side tables present, matching their hashes and schemas and
consistent with each other; every chunk present, matching its xxh3 and its index row (each
damaged chunk one ``document_chunk`` finding, the others still checked), every bucket of the
text-hash index (``document_hashes``); then, over the whole
table, the totals the manifest's ``packing`` entry records, and no window covered by more
spans than it holds tokens (one int32 per window in memory).
"""

from __future__ import annotations

import numpy as np

from ..errors import ZephonError
from ..format.manifest import Manifest

__all__ = ["check_documents"]


def check_documents(m: Manifest, add) -> None:
    """Call ``add(kind, message)`` for every problem of ``m``'s document table (kinds
    ``document_table``, ``document_chunk``); nothing for a dataset without one."""
    from .documents import DocumentTable

    if not m.has_documents:
        return
    try:
        table = DocumentTable(m)
    except (ZephonError, OSError, KeyError, ValueError) as exc:
        add("document_table", f"document table: {exc}")
        return
    covered = np.zeros(table.num_windows, dtype=np.int32)
    tokens = spans_total = split = pieces = 0
    damaged = 0
    for c in range(table.num_chunks):
        try:
            ch = table.chunk(c)
        except (ZephonError, OSError) as exc:
            add("document_chunk", f"document chunk {c}: {exc}")
            damaged += 1
            continue
        np.add.at(covered, ch.window, ch.length.astype(np.int32))
        per_doc = np.diff(ch.span_offsets)
        tokens += int(ch.tokens.sum())
        spans_total += int(ch.length.sum())
        split += int((per_doc > 1).sum())
        pieces += int(per_doc[per_doc > 1].sum())
    _check_hashes(table, add)
    if damaged:
        return
    packing = m.packing or {}
    want = {"num_documents": table.num_documents, "num_tokens": tokens,
            "documents_split": split, "split_pieces": pieces,
            "packed_tokens": spans_total + int(packing.get("padded_tokens", 0))}
    for key, got in want.items():
        if key in packing and packing[key] != got:
            add("document_table", f"{m.url}: the document table gives {key}={got}, the "
                f"manifest's packing entry {packing[key]}")
    over = np.flatnonzero(covered > table.window)
    if over.size:
        add("document_table", f"{m.url}: spans cover window {int(over[0])} with "
            f"{int(covered[over[0]])} tokens, more than its {table.window} ({over.size} such "
            "windows)")


def _check_hashes(table, add) -> None:
    """Every bucket of the text-hash index present, matching its xxh3 and checked, and every
    document in exactly one of them (one byte per document in memory)."""
    seen = np.zeros(table.num_documents, dtype=bool)
    twice = 0
    for b in range(len(table._hash_digests)):
        try:
            _, docs = table._bucket(b)
        except (ZephonError, OSError) as exc:
            add("document_hashes", f"document hash bucket {b}: {exc}")
            return
        twice += int(seen[docs].sum())
        seen[docs] = True
    if twice or not seen.all():
        add("document_hashes", f"{table._m.url}: the text-hash index lists {twice} documents "
            f"twice and misses {int((~seen).sum())}")

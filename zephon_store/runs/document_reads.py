"""Where a document was read: every step, rank and window that held a piece of it.

A packed dataset's document table (:mod:`zephon_store.read.documents`) gives each document's
spans (window, offset, length); a window is a sample, so the run accounting's own
:meth:`~zephon_store.runs.accounting.RunContext.where` (the order's inverse, and the log's
segments for the step and rank) places each span's window in every epoch. Nothing here
computes an order.

A *read* is one span's window read at one step by one rank. The answer to "which checkpoint
never trained on it" follows from the first read: a checkpoint saved after ``N`` global
steps (the loader state's ``step``; TorchTitan's ``step-N`` folder) holds steps ``[0, N)``,
so it never included the document when ``N <=`` the first read's step. Reads a deny list
masked (the document, or its window, taken down in that segment) never reached the model
and do not count.

:func:`trace_documents` lists the documents of traced steps: per rank and window, the spans
lying in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..read.documents import open_documents
from .audit import AuditRequestError

__all__ = ["document_table", "trace_documents", "where_documents"]


def document_table(ctx, source: int | None):
    """The document table of the dataset (or of mixture source ``source``), refused in one
    line when there is none."""
    from ..errors import NoDocumentTableError

    if ctx.source_names is not None and source is None:
        raise AuditRequestError(f"a mixture's documents belong to a source: pass --source "
                                f"(one of {list(ctx.source_names)})")
    try:
        return open_documents(ctx.part(source))
    except NoDocumentTableError as exc:
        raise AuditRequestError(str(exc)) from None


def where_documents(ctx, refs: Iterable, *, source: int | None = None,
                    epochs: Iterable[int] = (0,), end_step: int | None = None,
                    segments: Sequence | None = None,
                    checkpoint_every: int | None = None) -> list[dict[str, Any]]:
    """For each document ``refs`` name (``"INPUT:RECORD"``, ``"xxh3:<hex>"`` or the deny
    list's dicts; a text hash may name several), in ``ctx``'s dataset or mixture source
    ``source``: its spans and every read of them over ``epochs``, from ``ctx``'s log (or
    ``segments``, e.g. a planned one), and the first step that read it."""
    from ..errors import DocumentNotFoundError

    table = document_table(ctx, source)
    try:
        docs = table.resolve(list(refs))
    except (DocumentNotFoundError, ValueError) as exc:
        raise AuditRequestError(str(exc).strip("'\"")) from None
    epochs = list(epochs)
    deny = _deny_of(ctx, source)
    out = []
    for doc in docs:
        windows = sorted({s.window for s in doc.spans})
        placed = ctx.where(windows, epochs, source=source, end_step=end_step,
                           segments=segments) if windows else []
        reads = []
        for rec in placed:
            for hit in rec.get("consumed", []):
                masked = deny(hit, rec["id"], doc.id)
                reads.append({"epoch": rec["epoch"], "window": rec["id"],
                              "position": rec["global_position"], **hit, "masked": masked})
        reads.sort(key=lambda r: (r["step"], r["window"]))
        trained = [r["step"] for r in reads if not r["masked"]]
        first = min(trained) if trained else None
        out.append({"document": doc.id, "input": doc.input, "record": doc.record,
                    "xxh3": doc.xxh3, "num_tokens": doc.num_tokens,
                    "spans": [{"window": s.window, "offset": s.offset, "length": s.length}
                              for s in doc.spans],
                    "positions": [{"epoch": r["epoch"], "window": r["id"],
                                   "position": r["global_position"]} for r in placed],
                    "reads": reads, "first_step": first,
                    "clean_checkpoint": _clean_checkpoint(first, checkpoint_every)})
    return out


def _clean_checkpoint(first: int | None, every: int | None) -> dict[str, Any] | None:
    """The latest checkpoint that never trained on a document first read at step
    ``first`` (None: never read: every checkpoint is clean)."""
    if first is None:
        return None
    out = {"max_step": first}
    if every:
        out["every"] = every
        out["step"] = (first // every) * every
    return out


def _deny_of(ctx, source: int | None):
    """``masked(hit, window, document)``: whether the segment that made the read ``hit``
    masked that window (a deny list naming it, or the document; docs/audit.md)."""
    lines = {seg.line: seg for seg in (ctx.segments or [])}

    def masked(hit: dict, window: int, document: int) -> bool:
        seg = lines.get(hit.get("line"))
        deny = None if seg is None else ctx.deny_for(seg)
        if deny is None:
            return False
        gid = window if source is None else int(ctx.base_order().global_ids(
            source, np.array([window]))[0])
        return bool(deny.masked(np.array([gid]))[0]) or document in _denied_documents(
            deny, source)

    return masked


def _denied_documents(deny, source: int | None) -> frozenset:
    """The document numbers ``deny`` takes down in ``source`` (None: the one dataset)."""
    k = -1 if source is None else source
    return frozenset(d for s, d in deny.documents if s == k)


def trace_documents(ctx, ids: Sequence[int], sources: Sequence[str] | None) -> list[list[dict]]:
    """For each window ``ids[j]`` (of source ``sources[j]``; a dataset: None), the document
    pieces it holds: ``{"document", "input", "record", "offset", "length"}`` in window
    order."""
    by_source: dict = {}
    for j, i in enumerate(ids):
        k = None if sources is None else ctx.source_index(sources[j])
        by_source.setdefault(k, []).append((j, int(i)))
    out: list[list[dict]] = [[] for _ in ids]
    for k, items in by_source.items():
        table = document_table(ctx, k)
        spans = table.window_spans([i for _, i in items])
        docs = {int(d): table.document(int(d)) for d in np.unique(spans.document)}
        for j, i in items:
            sel = np.flatnonzero(spans.window == i)
            out[j] = [{"document": int(spans.document[s]),
                       "input": docs[int(spans.document[s])].input,
                       "record": docs[int(spans.document[s])].record,
                       "offset": int(spans.offset[s]), "length": int(spans.length[s])}
                      for s in sel]
    return out

"""What a run consumed, by source, input file and metadata column (``zephon audit --summary``).

The figures are the audit's own count: :meth:`~zephon_store.runs.accounting.RunContext.audit`
recomputes every exposure of the run from its log, and an
:class:`~zephon_store.runs.audit.ExposureTally` per source, filled by the same
:class:`~zephon_store.runs.audit.Exposures`, keeps how often each sample reached the model
(``seen``) or was blanked by a deny list (``masked``). This module only groups those counts.

Per group (a source, an input file, a value of a column: ``url`` is grouped by domain):

- ``samples``: the group's samples (windows, for packed data), ``samples_seen`` those read at
  least once, ``exposures`` the reads that reached the model, ``masked`` the reads a deny list
  blanked;
- ``tokens``: tokens that reached the model (packed data: each window's tokens; other data:
  None, not known);
- ``epochs``: ``exposures / samples``, the passes over the group;
- ``documents``: documents read, at least in part (``documents_whole``: every piece of
  it read; ``documents_part``: some; ``documents_unseen``: none): for data that is not
  packed a sample is one input record; packed windows need the dataset's document table
  (a window holds pieces of several documents, which only the table tells apart), which
  also makes ``tokens`` by source and input the documents' own. Without the table these
  are None (a note says so) and ``input`` counts a window for the input of its first
  token.

>>> from zephon_store.runs.audit import ExposureTally
>>> t = ExposureTally(4); t.seen[:] = [2, 1, 0, 1]
>>> g = group_counts(np.array([0, 0, 1, 1]), ["a.jsonl", "b.jsonl"], t, tokens_per_sample=17)
>>> [(r["key"], r["samples_seen"], r["exposures"], r["tokens"], r["epochs"]) for r in g]
[('a.jsonl', 2, 3, 51, 1.5), ('b.jsonl', 1, 1, 17, 0.5)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ..read.documents import has_documents, open_documents
from .audit import AuditRequestError, ExposureTally, RunAudit

__all__ = ["ConsumptionReport", "DocumentCounts", "audit_with_documents", "consumption",
           "group_counts"]

# Dimensions that are not columns.
SOURCE, INPUT = "source", "input"
# A column grouped by something derived from its value.
DERIVED = {"url": "domain"}
DOCUMENT_COLUMNS = ("documents", "documents_whole", "documents_part", "documents_unseen")


@dataclass
class ConsumptionReport:
    """The consumption of one run: the audit it comes from, and one table per dimension."""

    audit: RunAudit
    run_log: str
    dataset_id: str
    tables: dict[str, list[dict[str, Any]]]
    documents_known: bool
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``zephon audit --summary --json``)."""
        return {"kind": "zephon-consumption", "version": 1, "run_log": self.run_log,
                "dataset_id": self.dataset_id, "steps": [self.audit.first_step,
                                                         self.audit.end_step],
                "positions": self.audit.positions, "audit_ok": self.audit.ok,
                "documents_known": self.documents_known, "by": self.tables,
                "notes": self.notes}

    def to_markdown(self) -> str:
        """The Markdown form: a table per dimension, largest by tokens (else reads) first."""
        a = self.audit
        out = [f"# Training data consumed: run log `{self.run_log}`", "",
               f"Dataset `{self.dataset_id}`, steps [{a.first_step}, {a.end_step}), "
               f"{a.positions} positions; exactly-once audit: "
               f"{'passed' if a.ok else 'FAILED'}.", ""]
        cols = ["samples", "samples_seen", "exposures", "masked", "tokens", "documents",
                "documents_whole", "documents_part", "documents_unseen", "epochs"]
        for dim, rows in self.tables.items():
            out += [f"## By {DERIVED.get(dim, dim)}", "",
                    "| " + " | ".join([DERIVED.get(dim, dim)] + cols) + " |",
                    "|" + "---|" * (len(cols) + 1)]
            out += ["| " + " | ".join([_md(r["key"])] + [_md(r[c]) for c in cols]) + " |"
                    for r in rows]
            out.append("")
        out += [f"- {n}" for n in self.notes]
        return "\n".join(out).rstrip() + "\n"


def _md(value) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value).replace("|", "\\|")


def group_counts(group: np.ndarray, keys: list, tally: ExposureTally, *,
                 tokens_per_sample: int | None) -> list[dict[str, Any]]:
    """One row per key: ``group[i]`` is sample ``i``'s index into ``keys``; the counts come
    from ``tally``. ``tokens_per_sample``: a packed window's tokens (None: data that is not
    packed, where a sample is one input record, one document, and tokens are not known)."""
    n = len(keys)
    seen = tally.seen.astype(np.int64)
    samples = np.bincount(group, minlength=n)
    read = np.bincount(group, weights=seen > 0, minlength=n).astype(np.int64)
    exposures = np.bincount(group, weights=seen, minlength=n).astype(np.int64)
    masked = np.bincount(group, weights=tally.masked, minlength=n).astype(np.int64)
    rows = []
    for j, key in enumerate(keys):
        if not samples[j]:
            continue
        unpacked = tokens_per_sample is None
        rows.append({"key": key, "samples": int(samples[j]), "samples_seen": int(read[j]),
                     "exposures": int(exposures[j]), "masked": int(masked[j]),
                     "tokens": None if unpacked else int(exposures[j]) * tokens_per_sample,
                     # A sample of unpacked data is one record: seen is seen whole.
                     "documents": int(read[j]) if unpacked else None,
                     "documents_whole": int(read[j]) if unpacked else None,
                     "documents_part": 0 if unpacked else None,
                     "documents_unseen": int(samples[j] - read[j]) if unpacked else None,
                     "epochs": round(float(exposures[j]) / float(samples[j]), 6)})
    return rows


@dataclass
class DocumentCounts:
    """Per input file of a packed dataset with a document table: its documents read whole
    (every span's window read), in part and not at all, and the tokens of them that reached
    the model (each span's length times its window's reads). Counted chunk by chunk, so
    memory grows with the inputs, not the documents.

    ``per_input``: ``{input: [tokens, whole, part, documents]}``.
    """

    per_input: dict[str, list[int]]

    @classmethod
    def of(cls, table, tally: ExposureTally) -> DocumentCounts:
        """The counts of ``table`` (:class:`~zephon_store.read.documents.DocumentTable`)
        for the windows' exposures in ``tally``; one pass over its chunks."""
        per_input: dict[str, list[int]] = {}
        for chunk in table.iter_chunks():
            spans = chunk.column("spans").combine_chunks()
            offsets = spans.offsets.to_numpy()
            window = spans.values.field("window").to_numpy()
            length = spans.values.field("length").to_numpy().astype(np.int64)
            count = np.diff(offsets)
            n = len(count)
            doc = np.repeat(np.arange(n), count)
            reads = tally.seen[window].astype(np.int64)
            read = np.bincount(doc, weights=reads > 0, minlength=n).astype(np.int64)
            tokens = np.bincount(doc, weights=reads * length, minlength=n).astype(np.int64)
            whole = (count > 0) & (read == count)
            part = (read > 0) & (read < count)
            names, group = np.unique(np.array(chunk.column("input").to_pylist(), dtype=object),
                                     return_inverse=True)
            sums = [np.bincount(group, weights=w, minlength=len(names)).astype(np.int64)
                    for w in (tokens, whole, part, np.ones(n))]
            for j, name in enumerate(names.tolist()):
                acc = per_input.setdefault(name, [0, 0, 0, 0])
                for c in range(4):
                    acc[c] += int(sums[c][j])
        return cls(per_input)

    @staticmethod
    def _row(tokens: int, whole: int, part: int, documents: int) -> dict[str, int]:
        return {"tokens": tokens, "documents": whole + part, "documents_whole": whole,
                "documents_part": part, "documents_unseen": documents - whole - part}

    def by_input(self) -> dict[str, dict[str, int]]:
        """``{input: {tokens, documents, documents_whole, documents_part,
        documents_unseen}}``."""
        return {name: self._row(*acc) for name, acc in self.per_input.items()}

    def total(self) -> dict[str, int]:
        """The same figures over every input."""
        return self._row(*(sum(acc[c] for acc in self.per_input.values()) for c in range(4)))


def consumption(ctx, *, end_step: int | None = None,
                by: tuple[str, ...] = (SOURCE, INPUT)) -> ConsumptionReport:
    """The consumption report of ``ctx``'s run log (``ctx``: a
    :class:`~zephon_store.runs.accounting.RunContext` with a log), grouped by each of ``by``:
    ``"source"``, ``"input"`` or a column the conversion kept (``url`` by domain)."""
    if ctx.segments is None:
        raise AuditRequestError("a consumption report needs the run log: pass --log RUNLOG")
    parts = ctx.source.parts()
    for dim in by:
        if dim not in (SOURCE, INPUT) and not any(dim in d.schema.names for _, d in parts):
            held = "; ".join(f"{name or 'the dataset'} has {d.schema.names}"
                             for name, d in parts)
            raise AuditRequestError(
                f"--by {dim}: no source holds a column {dim!r} ({held}); group by source, "
                "input or a column the conversion kept")
    tallies = [ExposureTally(d.num_samples) for _, d in parts]
    report = ctx.audit(end_step, tallies=tallies)
    docs = [DocumentCounts.of(open_documents(ds), tallies[k]) if has_documents(ds) else None
            for k, (_, ds) in enumerate(parts)]
    tables: dict[str, list[dict]] = {}
    for dim in by:
        rows: dict[Any, dict] = {}
        for k, (name, ds) in enumerate(parts):
            group, keys = _groups(dim, name, ds, ctx.provenance)
            found = group_counts(group, keys, tallies[k], tokens_per_sample=_window_tokens(ds))
            if docs[k] is not None:
                _with_documents(found, docs[k], dim, name or ds.url)
            for row in found:
                _merge(rows, row)
        tables[dim] = sorted(rows.values(), key=lambda r: (-(r["tokens"] or 0),
                                                           -r["exposures"], str(r["key"])))
    known = all(d is not None or _window_tokens(ds) is None
                for d, (_, ds) in zip(docs, parts))
    return ConsumptionReport(report, ctx.log, ctx.dataset_id, tables, known,
                             _notes(parts, docs, by))


def audit_with_documents(ctx, end_step: int | None = None):
    """``(the audit, documents)``: :meth:`RunContext.audit` and, per source with a document
    table, its documents read whole, in part and not at all (``zephon audit``)."""
    parts = ctx.source.parts()
    if not any(has_documents(ds) for _, ds in parts):
        # Nothing to count per document: the audit alone, at its own memory (2 bytes per
        # sample of an open epoch); a tally costs 8 bytes per sample of every source.
        return ctx.audit(end_step), []
    tallies = [ExposureTally(d.num_samples) for _, d in parts]
    report = ctx.audit(end_step, tallies=tallies)
    out = []
    for k, (name, ds) in enumerate(parts):
        if not has_documents(ds):
            continue
        total = DocumentCounts.of(open_documents(ds), tallies[k]).total()
        out.append({"source": name or ds.url, **{c: total[c] for c in (
            "documents_whole", "documents_part", "documents_unseen")}})
    return report, out


def _with_documents(rows: list[dict], counts: DocumentCounts, dim: str, name: str) -> None:
    """``rows`` of one packed source with its document table: tokens and documents from
    the documents (exact per input), where ``dim`` groups documents (source, input)."""
    if dim == SOURCE:
        per = {name: counts.total()}
    elif dim == INPUT:
        per = counts.by_input()
    else:
        return
    for row in rows:
        row.update(per.get(row["key"], {}))


def _notes(parts, docs, by) -> list[str]:
    """What the report cannot say, and why (module docstring)."""
    notes = []
    if any(_window_tokens(ds) is None for _, ds in parts):
        notes.append("data that is not packed: a sample is one input record (one document); "
                     "its tokens are unknown")
    if any(d is None and _window_tokens(ds) is not None for d, (_, ds) in zip(docs, parts)):
        notes.append("documents of packed windows without a document table are unknown (a "
                     "window holds pieces of several documents; re-convert to get one); "
                     "windows and tokens are exact, and 'input' counts each window for the "
                     "input of its first token")
    if any(d is not None for d in docs):
        notes.append("packed data with a document table: tokens and documents by source and "
                     "input are the documents' own (each span's tokens, each read); samples "
                     "and exposures are windows, each counted for the input of its first "
                     "token")
        if any(dim not in (SOURCE, INPUT) for dim in by):
            notes.append("a column groups windows, not documents: its tokens are the windows'")
    return notes


def _merge(rows: dict, row: dict) -> None:
    """Add ``row`` into ``rows`` under its key (a key several sources share)."""
    have = rows.get(row["key"])
    if have is None:
        rows[row["key"]] = row
        return
    for c in ("samples", "samples_seen", "exposures", "masked"):
        have[c] += row[c]
    for c in ("tokens",) + DOCUMENT_COLUMNS:
        have[c] = None if have[c] is None or row[c] is None else have[c] + row[c]
    have["epochs"] = round(have["exposures"] / have["samples"], 6)


def _window_tokens(ds) -> int | None:
    """Tokens per sample of a packed dataset (its windows' ``L + 1``), else None."""
    packing = ds.manifest.packing
    return None if not packing else int(packing["window"])


def _groups(dim: str, name: str | None, ds, provenance) -> tuple[np.ndarray, list]:
    """``(group index per sample, keys)`` of ``ds`` (source ``name``) for ``dim``;
    ``provenance``: the run context's reading of a manifest's provenance table."""
    n = ds.num_samples
    if dim == SOURCE:
        return np.zeros(n, dtype=np.int64), [name or "dataset"]
    if dim == INPUT:
        starts, names, _ = provenance(ds.manifest)      # sorted by sample, empty pieces out
        keys = sorted(set(names.tolist()))
        index = {key: j for j, key in enumerate(keys)}
        key_of_piece = np.array([index[x] for x in names.tolist()], dtype=np.int64)
        piece = np.searchsorted(starts, np.arange(n, dtype=np.int64), side="right") - 1
        return key_of_piece[piece], keys
    if dim not in ds.schema.names:
        return np.zeros(n, dtype=np.int64), [f"(no {dim} column)"]
    values = []
    for rg in range(ds.row_group_table.num_row_groups):
        values += ds.read_row_group(rg).column(dim).to_pylist()
    if dim in DERIVED:
        values = [_domain(v) for v in values]
    keys, group = np.unique(np.array([str(v) if v is not None else "(none)" for v in values],
                                     dtype=object), return_inverse=True)
    return group.astype(np.int64), keys.tolist()


def _domain(url) -> str | None:
    """The host of ``url``, lower case, without a leading ``www.``."""
    if not url:
        return None
    host = (urlsplit(str(url)).hostname or "").lower()
    return host[4:] if host.startswith("www.") else host or None

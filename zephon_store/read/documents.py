"""The document table of a packed dataset: which documents each window holds, and where each
document went.

A packed dataset (``zephon convert --tokenizer``, format v6) records every document: its input
file, record number, token count, the xxh3 of its text, and its **spans**, the pieces of it
in windows (window id, offset, length). A window id is the dataset's sample id, so the
order code maps it to stream positions as for any sample. The table is fetched lazily: only
its small index opens with :func:`open_documents`; each chunk of
:data:`~zephon_store.format.documents.DOCUMENTS_PER_CHUNK` documents is fetched (through the
node cache), checked against its xxh3 and its index row the first time it is needed.

>>> import os
>>> from zephon_store import convert, open_dataset, packing_convert_kwargs, PackingOptions
>>> kw = packing_convert_kwargs(PackingOptions(tokenizer=tiny_tokenizer, seq_len=7))
>>> ds = open_dataset(convert([tiny_jsonl], os.path.join(tmp, "ds"), **kw).url)
>>> docs = open_documents(ds)
>>> d = docs.find("a.jsonl", 1)
>>> d.num_tokens, d.spans
(4, (Span(window=0, offset=4, length=4),))
>>> ds[0]["tokens"][4:8].tolist()   # <s> record 1 </s>
[1, 3, 5, 2]
>>> docs.window_spans([0]).document.tolist()
[0, 1]
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from .._util.arrow import column_np
from ..errors import DocumentNotFoundError, ManifestError, NoDocumentTableError
from ..format.documents import (
    DocumentChunk,
    hash_bucket_bits,
    hash_buckets,
    parse_document_chunk,
    parse_hash_bucket,
    sort_keys,
)
from ..format.manifest import DOCUMENT_TABLES, MAX_COUNT, Manifest

__all__ = ["Document", "DocumentTable", "Span", "SpanArrays", "has_documents", "open_documents"]

_XXH3_RE = re.compile(r"(?:xxh3:)?([0-9a-f]{32})")
# Chunks a table keeps decoded (~1.5 MiB each at 16,384 documents): a step's windows and a
# few lookups stay fetched; the node cache keeps the files on disk anyway.
KEPT_CHUNKS = 64


@dataclass(frozen=True)
class Span:
    """Tokens ``[offset, offset + length)`` of window ``window`` (a dataset sample id)."""

    window: int
    offset: int
    length: int


@dataclass(frozen=True)
class Document:
    """One document: record ``record`` (0-based) of input ``input``; ``num_tokens`` tokens
    (BOS/EOS included); ``xxh3``: the xxh3-128 (hex) of its text's UTF-8 bytes; ``spans``: its
    pieces in windows, in document order (their tokens, concatenated, are the document's;
    only tokens dropped with a final partial window are in no span)."""

    id: int
    input: str
    record: int
    num_tokens: int
    xxh3: str
    spans: tuple[Span, ...]


class SpanArrays(NamedTuple):
    """Spans as parallel int64 arrays, one entry per span: the document it belongs to, its
    window, offset and length."""

    document: np.ndarray
    window: np.ndarray
    offset: np.ndarray
    length: np.ndarray


def _empty_spans() -> SpanArrays:
    z = np.zeros(0, np.int64)
    return SpanArrays(z, z, z, z)


class DocumentTable:
    """A dataset's document table, fetched chunk by chunk on first use; thread-safe.

    Open it with :func:`open_documents`. Documents are numbered ``0 .. num_documents - 1`` in
    conversion order (inputs sorted, records in file order).
    """

    def __init__(self, manifest: Manifest) -> None:
        if not manifest.has_documents:
            raise NoDocumentTableError(_no_table_message(manifest))
        self._m = manifest
        packing = manifest.packing or {}
        self.window = int(packing.get("window") or 0)
        self.per_chunk = int(manifest.documents_per_chunk)
        tables = manifest.side_tables(DOCUMENT_TABLES)
        index, inputs, hashes = (tables[k] for k in DOCUMENT_TABLES)
        self._counts = column_np(index.column("documents"))
        self._tokens = column_np(index.column("tokens"))
        self._first_window = column_np(index.column("first_window"))
        self._end_window = column_np(index.column("end_window"))
        self._digests = [d.hex() for d in index.column("xxh3").to_pylist()]
        self._hash_digests = [d.hex() for d in hashes.column("xxh3").to_pylist()]
        self._hash_counts = column_np(hashes.column("documents"))
        self.inputs: list[str] = inputs.column("input").to_pylist()
        self._input_first = column_np(inputs.column("first_document"))
        self._input_count = column_np(inputs.column("documents"))
        self._input_index = {name: i for i, name in enumerate(self.inputs)}
        self.num_documents = int(self._counts.sum()) if self._counts.size else 0
        self.num_windows = manifest.num_samples
        self._hash_bits = hash_bucket_bits(self.num_documents, self.per_chunk)
        self._check_index()
        self._chunks: OrderedDict[int, DocumentChunk] = OrderedDict()
        self._lock = threading.Lock()

    def _check_index(self) -> None:
        n, k, c = self.num_documents, self.per_chunk, len(self._counts)
        bad = None
        if c != -(-n // k) or (c and (np.any(self._counts[:-1] != k)
                                      or not 1 <= int(self._counts[-1]) <= k)):
            bad = f"its {c} chunks do not hold {k} documents each (the last 1..{k})"
        elif c and (int(self._first_window.min()) < 0 or np.any(
                self._end_window < self._first_window)
                or int(self._end_window.max()) > self.num_windows):
            bad = f"a chunk's window range lies outside [0, {self.num_windows})"
        elif len(self.inputs) != len(self._input_index):
            bad = "an input is listed twice"
        elif self._input_count.size and (
                int(self._input_count.min()) < 0 or self._input_first[0] != 0
                or np.any(self._input_first[1:] != np.cumsum(self._input_count)[:-1])
                or int(self._input_count.sum()) != n):
            bad = "its inputs' document ranges do not partition the documents in order"
        elif int(self._tokens.max(initial=0)) > MAX_COUNT or int(self._tokens.min(initial=0)) < 0:
            bad = f"a chunk's token count lies outside [0, {MAX_COUNT}]"
        elif (len(self._hash_counts) != 1 << self._hash_bits
              or int(self._hash_counts.min()) < 0 or int(self._hash_counts.sum()) != n):
            bad = (f"its text-hash index does not have {1 << self._hash_bits} buckets holding "
                   f"the {n} documents")
        if bad:
            raise ManifestError(f"{self._m.url}: document table: {bad}; the manifest is "
                                "corrupted or forged: restore it or re-convert")

    # -- chunks ----------------------------------------------------------------------------
    @property
    def num_chunks(self) -> int:
        return len(self._counts)

    def chunk(self, c: int) -> DocumentChunk:
        """Chunk ``c``'s columns, fetched, verified and checked on first use; the last
        :data:`KEPT_CHUNKS` used stay in memory (a scan of the whole table does not keep it)."""
        with self._lock:
            got = self._chunks.get(c)
            if got is not None:
                self._chunks.move_to_end(c)
        if got is None:
            if not 0 <= c < self.num_chunks:
                raise IndexError(f"document chunk {c} is out of range [0, {self.num_chunks})")
            h = self._digests[c]
            data = self._m.read_index_file(h, "document chunk")
            got = parse_document_chunk(
                data, f"{self._m.url}: document chunk {c} (index/{h}.arrow)",
                documents=int(self._counts[c]), tokens=int(self._tokens[c]),
                first_window=int(self._first_window[c]), end_window=int(self._end_window[c]),
                window=self.window)
            with self._lock:
                self._chunks[c] = got
                while len(self._chunks) > KEPT_CHUNKS:
                    self._chunks.popitem(last=False)
        return got

    def iter_chunks(self) -> Iterator[pa.Table]:
        """The whole table, one Arrow table per chunk, with a ``document`` column (the
        document number) and an ``input`` column before the stored ones (``record``,
        ``tokens``, ``text_xxh3``, ``spans``)."""
        for c in range(self.num_chunks):
            ch = self.chunk(c)
            ids = np.arange(c * self.per_chunk, c * self.per_chunk + ch.num_documents)
            names = pa.array(self.inputs, pa.string()).take(pa.array(self._input_of(ids)))
            yield pa.table({"document": ids, "input": names, "record": ch.record,
                            "tokens": ch.tokens,
                            "text_xxh3": [bytes(r) for r in ch.text_xxh3],
                            "spans": _span_lists(ch)})

    def _input_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._input_first + self._input_count, ids, side="right")

    # -- lookups ---------------------------------------------------------------------------
    def document(self, doc: int) -> Document:
        """Document number ``doc`` (DocumentNotFoundError when out of range)."""
        doc = int(doc)
        if not 0 <= doc < self.num_documents:
            raise DocumentNotFoundError(f"document {doc} is out of range [0, "
                                        f"{self.num_documents}) in {self._m.url}")
        c, row = divmod(doc, self.per_chunk)
        ch = self.chunk(c)
        w, o, n = ch.spans_of(row)
        return Document(id=doc, input=self.inputs[int(self._input_of(np.array([doc]))[0])],
                        record=int(ch.record[row]), num_tokens=int(ch.tokens[row]),
                        xxh3=ch.text_xxh3[row].tobytes().hex(),
                        spans=tuple(Span(int(a), int(b), int(x)) for a, b, x in zip(w, o, n)))

    def find(self, input: str, record: int) -> Document:
        """The document of record ``record`` (0-based) of input ``input`` (as
        :attr:`inputs` names it, relative to the conversion's common input root)."""
        i = self._input_index.get(input)
        if i is None:
            raise DocumentNotFoundError(
                f"no input {input!r} in the document table of {self._m.url} (its inputs: "
                f"{', '.join(self.inputs[:3])}{', ...' if len(self.inputs) > 3 else ''}); name "
                "the input as 'zephon info' lists it")
        lo = int(self._input_first[i])
        hi = lo + int(self._input_count[i])
        # Usually no record was skipped: document lo + record, one chunk fetched.
        if 0 <= record < hi - lo and self._record_at(lo + record) == record:
            return self.document(lo + record)
        # Records ascend within an input: bisect over the documents, chunk by chunk.
        while lo < hi:
            mid = (lo + hi) // 2
            if self._record_at(mid) < record:
                lo = mid + 1
            else:
                hi = mid
        if lo < int(self._input_first[i] + self._input_count[i]) and \
                self._record_at(lo) == record:
            return self.document(lo)
        raise DocumentNotFoundError(
            f"{input} has no document at record {record} in {self._m.url} (a record with a "
            "null text skipped at conversion is no document)")

    def _record_at(self, doc: int) -> int:
        c, row = divmod(doc, self.per_chunk)
        return int(self.chunk(c).record[row])

    def find_text(self, xxh3: str) -> list[Document]:
        """Every document whose text hashes to ``xxh3`` (``"xxh3:<32 hex>"`` or 32 hex
        digits), in document order: one bucket of the text-hash index, then the chunks of
        the documents found (each checked to hold that hash)."""
        m = _XXH3_RE.fullmatch(xxh3.strip().lower()) if isinstance(xxh3, str) else None
        if m is None:
            raise ValueError(f"{xxh3!r} is not an xxh3 text hash; write it as xxh3:<32 hex "
                             "digits> (the xxh3-128 of the document's UTF-8 text)")
        want = np.frombuffer(bytes.fromhex(m.group(1)), np.uint8).reshape(1, 16)
        digests, docs = self._bucket(int(hash_buckets(want, self._hash_bits)[0]))
        keys = sort_keys(digests)
        key = sort_keys(want)[0]
        lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
        found = [self.document(int(d)) for d in docs[lo:hi]]
        if any(d.xxh3 != m.group(1) for d in found):
            raise ManifestError(f"{self._m.url}: the text-hash index names a document whose "
                                "text hash differs; the document table is corrupted or forged: "
                                "restore it or re-convert")
        return found

    def _bucket(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Bucket ``b`` of the text-hash index, fetched, verified and checked."""
        h = self._hash_digests[b]
        data = self._m.read_index_file(h, "document hash bucket")
        return parse_hash_bucket(data, f"{self._m.url}: document hash bucket {b} "
                                 f"(index/{h}.arrow)", bucket=b, bits=self._hash_bits,
                                 documents=int(self._hash_counts[b]),
                                 num_documents=self.num_documents)

    def resolve(self, refs: Iterable[dict | str]) -> list[Document]:
        """The documents ``refs`` name: ``{"input": ..., "record": ...}`` or ``{"xxh3": ...}``
        (a deny list's entries), or strings ``"INPUT:RECORD"`` / ``"xxh3:<hex>"``. A hash may
        name several documents (the same text twice); each reference must name one at least."""
        out: list[Document] = []
        for ref in refs:
            if isinstance(ref, str):
                ref = _parse_ref(ref)
            if not isinstance(ref, dict) or not (("xxh3" in ref) ^ ("input" in ref)):
                raise ValueError(f"document reference {ref!r}: give either input and record, "
                                 "or xxh3")
            if "xxh3" in ref:
                got = self.find_text(ref["xxh3"])
                if not got:
                    raise DocumentNotFoundError(f"no document's text hashes to {ref['xxh3']} "
                                                f"in {self._m.url}")
                out += got
            else:
                out.append(self.find(ref["input"], int(ref["record"])))
        return out

    def spans(self, doc_ids) -> SpanArrays:
        """Every span of the documents ``doc_ids``, document by document, in their order."""
        ids = np.asarray(doc_ids, dtype=np.int64).reshape(-1)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_documents):
            raise DocumentNotFoundError(f"document ids out of range [0, {self.num_documents})")
        parts = []
        for d in ids:
            c, row = divmod(int(d), self.per_chunk)
            w, o, n = self.chunk(c).spans_of(row)
            parts.append((np.full(len(w), d, np.int64), w, o, n))
        if not parts:
            return _empty_spans()
        return SpanArrays(*(np.concatenate(col) for col in zip(*parts)))

    def window_spans(self, window_ids) -> SpanArrays:
        """Every span lying in the windows ``window_ids`` (dataset sample ids), sorted by
        window, then offset: the documents each window holds and where."""
        wins = np.unique(np.asarray(window_ids, dtype=np.int64).reshape(-1))
        if wins.size and (int(wins[0]) < 0 or int(wins[-1]) >= self.num_windows):
            raise IndexError(f"window ids out of range [0, {self.num_windows})")
        if not wins.size:
            return _empty_spans()
        lo = np.searchsorted(wins, self._first_window, side="left")
        hi = np.searchsorted(wins, self._end_window, side="left")
        parts = []
        for c in np.flatnonzero(hi > lo):
            ch = self.chunk(int(c))
            sel = np.flatnonzero(np.isin(ch.window, wins))
            if not sel.size:
                continue
            rows = np.searchsorted(ch.span_offsets, sel, side="right") - 1
            parts.append((rows + int(c) * self.per_chunk, ch.window[sel], ch.offset[sel],
                          ch.length[sel]))
        if not parts:
            return _empty_spans()
        out = SpanArrays(*(np.concatenate(col) for col in zip(*parts)))
        order = np.lexsort((out.offset, out.window))
        return SpanArrays(*(col[order] for col in out))


def _span_lists(ch: DocumentChunk) -> pa.Array:
    from ..format.documents import DOCUMENT_CHUNK_SCHEMA, SPAN_TYPE

    flat = pa.StructArray.from_arrays(
        [pa.array(ch.window), pa.array(ch.offset.astype(np.int32)),
         pa.array(ch.length.astype(np.int32))], fields=list(SPAN_TYPE))
    return pa.ListArray.from_arrays(pa.array(ch.span_offsets.astype(np.int32)), flat,
                                    type=DOCUMENT_CHUNK_SCHEMA.field("spans").type)


def _parse_ref(text: str) -> dict:
    if text.lower().startswith("xxh3:"):
        return {"xxh3": text}
    name, sep, record = text.rpartition(":")
    if not sep or not name or not record.isdigit():
        raise ValueError(f"document reference {text!r}: write INPUT:RECORD (record 0-based) "
                         "or xxh3:<32 hex digits>")
    return {"input": name, "record": int(record)}


def _no_table_message(manifest: Manifest) -> str:
    why = ("it holds records, not packed token windows" if manifest.packing is None else
           f"it was packed by a format v{manifest.format_version} writer, before document "
           "tables (format v6)")
    return (f"{manifest.url} has no document table: {why}; re-convert with 'zephon convert "
            "--tokenizer ... --seq-len ...' to get one")


def has_documents(source) -> bool:
    """Whether ``source`` (a :class:`~zephon_store.read.dataset.Dataset`) has a document
    table."""
    return _manifest_of(source).has_documents


_TABLES: weakref.WeakKeyDictionary[Manifest, DocumentTable] = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def _table_of(manifest: Manifest) -> DocumentTable:
    with _TABLES_LOCK:
        table = _TABLES.get(manifest)
    if table is None:
        table = DocumentTable(manifest)
        with _TABLES_LOCK:
            table = _TABLES.setdefault(manifest, table)
    return table


def open_documents(source, *, storage_options: dict | None = None) -> DocumentTable:
    """The document table of ``source``: a :class:`~zephon_store.read.dataset.Dataset` or a
    dataset URL. One table per opened dataset: a second call returns the same object (its
    fetched chunks included). Raises :class:`~zephon_store.errors.NoDocumentTableError`
    when the dataset has none, ValueError for a mixture (open each of its ``parts()``)."""
    return _table_of(_manifest_of(source, storage_options))


def _manifest_of(source, storage_options: dict | None = None) -> Manifest:
    if isinstance(source, str):
        from .dataset import open_dataset

        source = open_dataset(source, storage_options=storage_options)
    manifest = getattr(source, "manifest", None)
    if isinstance(manifest, Manifest):
        return manifest
    parts = source.parts() if hasattr(source, "parts") else []
    raise ValueError(f"{type(source).__name__} has no single document table: a mixture has one "
                     f"per source; open each of its parts() ({', '.join(n for n, _ in parts)})")

"""Token packing at conversion time: tokenize documents, concatenate them, cut fixed windows.

Each document becomes ``[BOS] + ids + [EOS]`` (each special token optional), documents are
concatenated in input order (files sorted by URL, records in file order) and the stream is
cut into non-overlapping windows of ``seq_len + 1`` tokens, so a window gives a training
example ``input = w[:-1]``, ``labels = w[1:]``. The final partial window is dropped and
counted. A dataset row is one window::

    tokens:     fixed_size_list<int32>[seq_len + 1]
    doc_starts: list<int32>          # positions in the window where a document begins

The manifest's ``packing`` entry records the tokenizer (file hash, vocabulary size), the
special token ids and the totals (documents, tokens, windows, dropped tail). See
``docs/packing.md``.

The work runs through :func:`~zephon_store.write.convert.convert`'s hooks, so it inherits its
crash-safe staging and its byte-identical output for any number of workers:

- ``parse_fn`` (:class:`TokenizeDocuments`, in the worker processes): one input file ->
  staged Arrow batches with a ``tokens: large_list<int32>`` column, one row per document;
- ``restream`` (:class:`PackWindows`): the global pass. Window ``k`` covers global tokens
  ``[k*(L+1), (k+1)*(L+1))`` and belongs to the input file where it starts; each file's
  windows are staged under ``packed/<index>`` by one task that reads the token range it
  needs (including the head of the following files) from the staged parsed files; the token
  counts it starts from are counted by tasks too, so no tokens pass through the driver.

>>> import os
>>> from zephon_store import convert, open_dataset
>>> kwargs = packing_convert_kwargs(PackingOptions(tokenizer=tiny_tokenizer, seq_len=7))
>>> ds = open_dataset(convert([tiny_jsonl], os.path.join(tmp, "ds"), **kwargs).url)
>>> ds[0]   # <s> record 0 </s> <s> record 1 </s>: two documents fill the window
{'tokens': array([1, 3, 4, 2, 1, 3, 5, 2], dtype=int32), 'doc_starts': [0, 4], 'num_tokens': 8}
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa
import xxhash

from .._util.hashing import xxh3_file
from ..errors import InputError, InputNotFoundError, require
from ..format.documents import DOCUMENTS_PER_CHUNK
from ..format.manifest import schema_to_base64
from .bestfit import stage_buffers
from .documents import DOCUMENT_PARTS, DocumentParts, stage_concat_documents
from .stage_times import stage
from .staged import StagedInput, arrow_batch_rows, read_staged
from .staging import StagingArea

__all__ = [
    "PackingOptions",
    "SpecialTokens",
    "TokenizeDocuments",
    "PackWindows",
    "packing_convert_kwargs",
    "resolve_special_tokens",
    "window_schema",
    "PACKING_VERSION",
    "TOKENS_COLUMN",
    "DOC_STARTS_COLUMN",
    "NUM_TOKENS_COLUMN",
    "STRATEGIES",
]

# 2 (format v6): strategy, pad_id, the document table and the best-fit totals.
PACKING_VERSION = 2
TOKENS_COLUMN = "tokens"
DOC_STARTS_COLUMN = "doc_starts"
NUM_TOKENS_COLUMN = "num_tokens"
STRATEGIES = ("concat", "best-fit")
# Windows per best-fit buffer: see docs/packing.md for what a larger buffer buys.
DEFAULT_BUFFER_WINDOWS = 4096
# Looked up in this order among the tokenizer's special tokens (then its whole vocabulary)
# when neither options nor a tokenizer_config.json name them: Llama 3, SentencePiece
# (Llama 2, Mistral, T5), Gemma, and common custom spellings.
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[BOS]", "<|startoftext|>")
EOS_NAMES = ("<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]", "<|endoftext|>")
# Documents per encode_batch call: big enough for the tokenizer's Rust thread pool to
# pay off, small enough that the Encoding objects of one call stay a few MiB.
_ENCODE_DOCS = 1024
# Tokens per staged record batch of windows (32 MiB of int32): bounds the restream's memory.
_BATCH_TOKENS = 8 << 20
# One row per document: its tokens, its record number in its input, the xxh3 of its text.
PARSED_SCHEMA = pa.schema([pa.field(TOKENS_COLUMN, pa.large_list(pa.int32()), nullable=False),
                           pa.field("record", pa.int64(), nullable=False),
                           pa.field("text_xxh3", pa.binary(16), nullable=False)])


@dataclass(frozen=True)
class PackingOptions:
    """How documents are tokenized and packed; validated on construction.

    ``tokenizer``: a local ``tokenizer.json`` (or a folder holding one); nothing is
    downloaded. ``seq_len``: a window holds ``seq_len + 1`` tokens. ``bos``/``eos``: wrap
    every document in the tokenizer's BOS/EOS token; which token that is comes from
    ``bos_id``/``eos_id``, else ``bos_token``/``eos_token``, else a ``tokenizer_config.json``
    beside the tokenizer, else a special token named like ``<|begin_of_text|>``, ``<s>``,
    ``<bos>`` (see :data:`BOS_NAMES`, :data:`EOS_NAMES`). ``doc_starts``: also store where
    documents begin inside each window. ``strategy``: ``"best-fit"`` (the default: documents
    split only when longer than a window, then packed by best-fit decreasing over buffers of
    ``buffer_windows`` windows; free space is padded with ``pad_id``, default the EOS id,
    else BOS, else 0) or ``"concat"`` (documents back to back, cut every ``seq_len + 1``
    tokens).

    >>> PackingOptions(tokenizer="tok.json", seq_len=0)
    Traceback (most recent call last):
    ...
    ValueError: seq_len must be > 0, got 0
    """

    tokenizer: str
    seq_len: int
    text_column: str = "text"
    bos: bool = True
    eos: bool = True
    bos_token: str | None = None
    eos_token: str | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    doc_starts: bool = True
    # best-fit by measurement (docs/packing.md): on the demo's corpus it cuts 28-58% fewer
    # documents than concat for 0.03-0.05% padding and the same conversion time.
    strategy: str = "best-fit"
    buffer_windows: int = DEFAULT_BUFFER_WINDOWS
    pad_id: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer, (str, os.PathLike)) or not str(self.tokenizer):
            raise ValueError(f"tokenizer must be a path to a tokenizer.json, got {self.tokenizer!r}")
        object.__setattr__(self, "tokenizer", os.fspath(self.tokenizer))
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, (int, np.integer)):
            raise ValueError(f"seq_len must be an int, got {self.seq_len!r}")
        if self.seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {self.seq_len}")
        # Window positions are stored as int32 (doc_starts).
        if self.seq_len >= 2**31 - 1:
            raise ValueError(f"seq_len must be < 2**31 - 1, got {self.seq_len}")
        object.__setattr__(self, "seq_len", int(self.seq_len))
        if not isinstance(self.text_column, str) or not self.text_column:
            raise ValueError(f"text_column must be a non-empty string, got {self.text_column!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got "
                             f"{self.strategy!r}")
        b = self.buffer_windows
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"buffer_windows must be an int >= 1, got {b!r}")
        if self.pad_id is not None and (isinstance(self.pad_id, bool)
                                        or not isinstance(self.pad_id, int) or self.pad_id < 0):
            raise ValueError(f"pad_id must be an int >= 0, got {self.pad_id!r}")
        for name in ("bos", "eos", "doc_starts"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for which in ("bos", "eos"):
            tok, tid = getattr(self, f"{which}_token"), getattr(self, f"{which}_id")
            if tok is not None and tid is not None:
                raise ValueError(f"pass {which}_token or {which}_id, not both")
            if tok is not None and (not isinstance(tok, str) or not tok):
                raise ValueError(f"{which}_token must be a non-empty string, got {tok!r}")
            if tid is not None and (isinstance(tid, bool) or not isinstance(tid, int) or tid < 0):
                raise ValueError(f"{which}_id must be an int >= 0, got {tid!r}")

    @property
    def window(self) -> int:
        """Tokens per stored window: ``seq_len + 1``."""
        return self.seq_len + 1


@dataclass(frozen=True)
class SpecialTokens:
    """The BOS/EOS ids actually added (None when that side is off) and how they were found."""

    bos_id: int | None
    bos_token: str | None
    eos_id: int | None
    eos_token: str | None
    source: str


# -- tokenizer -----------------------------------------------------------------------------
def tokenizer_file(path: str) -> str:
    """The absolute path of the tokenizer.json ``path`` names (a file, or a folder holding one)."""
    p = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(p):
        p = os.path.join(p, "tokenizer.json")
    if not os.path.isfile(p):
        raise InputNotFoundError(
            f"tokenizer file not found: {p}; pass --tokenizer with a local tokenizer.json (or "
            "the folder holding it); tokenizers are never downloaded")
    return p


_LOADED: dict[tuple[str, str], object] = {}


def load_tokenizer(path: str, xxh3: str | None = None):
    """A ``tokenizers.Tokenizer`` from a local file, cached per process and file hash.

    With ``xxh3`` the file must still have that hash (it is what the manifest records).
    """
    tokenizers = require("tokenizers", "tokenize")
    path = tokenizer_file(path)
    digest = xxh3 or xxh3_file(path)
    key = (path, digest)
    if key not in _LOADED:
        if xxh3 is not None and xxh3_file(path) != xxh3:
            raise InputError(f"tokenizer {path} changed during the conversion (xxh3 is no longer "
                             f"{xxh3}); rerun the conversion", path=path)
        try:
            _LOADED[key] = tokenizers.Tokenizer.from_file(path)
        except Exception as exc:  # the Rust side raises plain Exception on bad JSON
            raise InputError(f"cannot load tokenizer {path}: {exc}", path=path) from exc
    return _LOADED[key]


def _config_token(folder: str, key: str) -> str | None:
    # HF convention (TorchTitan's HuggingFaceTokenizer reads the same file): the value is
    # either the token string or {"content": "<token>", ...}.
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as fh:
            value = json.load(fh).get(key)
    except (OSError, ValueError):
        return None
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _named_token(tok, names: tuple[str, ...]) -> str | None:
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    for pool in (special, None):
        for name in names:
            if (pool is None or name in pool) and tok.token_to_id(name) is not None:
                return name
    return None


def resolve_special_tokens(options: PackingOptions, tok=None) -> SpecialTokens:
    """Find the BOS/EOS ids to add, in the order the :class:`PackingOptions` docstring gives.

    Raises ValueError naming what was looked for when a required token is absent.
    """
    path = tokenizer_file(options.tokenizer)
    tok = tok if tok is not None else load_tokenizer(path)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    found: dict[str, tuple[int | None, str | None]] = {}
    sources = []
    for which, names in (("bos", BOS_NAMES), ("eos", EOS_NAMES)):
        if not getattr(options, which):
            found[which] = (None, None)
            continue
        tid, token = getattr(options, f"{which}_id"), getattr(options, f"{which}_token")
        if tid is not None:
            if tid >= vocab:
                raise ValueError(f"{which}_id={tid} is outside the vocabulary of {path} "
                                 f"({vocab} tokens)")
            found[which] = (tid, tok.id_to_token(tid))
            sources.append(f"{which}: option {which}_id")
            continue
        source = f"option {which}_token"
        if token is None:
            token, source = _config_token(os.path.dirname(path), f"{which}_token"), \
                "tokenizer_config.json"
        if token is None:
            token, source = _named_token(tok, names), "special token name"
        if token is None:
            raise ValueError(
                f"tokenizer {path} has no {which.upper()} token: looked for {which}_token in "
                f"tokenizer_config.json and for tokens named {', '.join(names)}; pass "
                f"{which}_token=/{which}_id= (PackingOptions) or --no-{which}")
        tid = tok.token_to_id(token)
        if tid is None:
            raise ValueError(f"{which.upper()} token {token!r} ({source}) is not in the "
                             f"vocabulary of {path}")
        found[which] = (tid, token)
        sources.append(f"{which}: {source}")
    return SpecialTokens(bos_id=found["bos"][0], bos_token=found["bos"][1],
                         eos_id=found["eos"][0], eos_token=found["eos"][1],
                         source="; ".join(sources) or "none")


# -- phase 1: tokenize (worker processes) --------------------------------------------------
@dataclass(frozen=True)
class TokenizeDocuments:
    """``parse_fn`` for :func:`~zephon_store.write.convert.convert`: one input -> token lists.

    A frozen dataclass so it pickles to spawned workers and its ``repr`` (part of the
    converter's staging key) is stable across runs.
    """

    tokenizer_path: str
    tokenizer_xxh3: str
    text_column: str
    bos_id: int | None
    eos_id: int | None

    def __call__(self, f, options, storage_options, stats) -> Iterator[pa.RecordBatch]:
        from ..ingest import read_input

        tok = load_tokenizer(self.tokenizer_path, self.tokenizer_xxh3)
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        row = 0
        for batch in read_input(f, options=options, storage_options=storage_options, stats=stats):
            texts, records = self._texts(f, batch, options, stats, row)
            row += batch.num_rows
            for i in range(0, len(texts), _ENCODE_DOCS):
                docs = texts[i:i + _ENCODE_DOCS]
                with stage("tokenize"):
                    tokens = self._to_batch(
                        [e.ids for e in encode(docs, add_special_tokens=False)],
                        records[i:i + _ENCODE_DOCS], docs)
                yield tokens

    def _texts(self, f, batch: pa.RecordBatch, options, stats,
               row0: int) -> tuple[list[str], list[int]]:
        """The batch's texts and their record numbers in the input (0-based)."""
        names = batch.schema.names
        if self.text_column in names:
            col = batch.column(self.text_column)
        elif f.kind == "text" and len(names) == 1:
            # Plain-text inputs name their one column after InputOptions.text_column.
            col = batch.column(0)
        else:
            raise InputError(f"{f.url}: no column {self.text_column!r} to tokenize (columns: "
                             f"{', '.join(names)}); pass --text-column NAME", path=f.url)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            raise InputError(f"{f.url}: column {self.text_column!r} holds {col.type}, not text; "
                             "pass --text-column naming a string column", path=f.url)
        texts = col.to_pylist()
        records = list(range(row0, row0 + len(texts)))
        if col.null_count:
            kept, records = [], []
            for j, t in enumerate(texts):
                if t is not None:
                    kept.append(t)
                    records.append(row0 + j)
                    continue
                msg = (f"{f.url} record {row0 + j + 1}: {self.text_column!r} is null; fix the "
                       "record or pass --on-error skip")
                if options.on_error != "skip":
                    raise InputError(msg, path=f.url, row=row0 + j)
                stats.record_skip("schema_mismatch", msg)
            texts = kept
        return texts, records

    def _to_batch(self, ids: list[list[int]], records: list[int],
                  texts: list[str]) -> pa.RecordBatch:
        nb, ne = int(self.bos_id is not None), int(self.eos_id is not None)
        core_len = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        lengths = core_len + (nb + ne)
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.empty(int(offsets[-1]), dtype=np.int32)
        core = np.ones(len(values), dtype=bool)
        if nb:
            values[offsets[:-1]] = self.bos_id
            core[offsets[:-1]] = False
        if ne:
            values[offsets[1:] - 1] = self.eos_id
            core[offsets[1:] - 1] = False
        values[core] = np.fromiter(chain.from_iterable(ids), dtype=np.int32,
                                   count=int(core_len.sum()))
        arr = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
        digests = b"".join(xxhash.xxh3_128_digest(t.encode())
                           for t in texts)
        hashes = pa.Array.from_buffers(pa.binary(16), len(texts), [None, pa.py_buffer(digests)])
        return pa.RecordBatch.from_arrays([arr, pa.array(records, pa.int64()), hashes],
                                          schema=PARSED_SCHEMA)


# -- phase 2: the global pass (restream) ---------------------------------------------------
def window_schema(seq_len: int, doc_starts: bool = True, num_tokens: bool = False) -> pa.Schema:
    """The schema of a packed dataset with windows of ``seq_len + 1`` tokens (``num_tokens``:
    best-fit's count of real, unpadded tokens per window)."""
    fields = [pa.field(TOKENS_COLUMN, pa.list_(pa.int32(), seq_len + 1), nullable=False)]
    if doc_starts:
        fields.append(pa.field(DOC_STARTS_COLUMN, pa.list_(pa.int32()), nullable=False))
    if num_tokens:
        fields.append(pa.field(NUM_TOKENS_COLUMN, pa.int32(), nullable=False))
    return pa.schema(fields)


class _TokenSource:
    """Random access to the concatenated token stream of the parsed inputs (staged Arrow
    files; a record batch is read when first used, so the head of a following file costs only
    its first batches)."""

    def __init__(self, area: StagingArea, rels: list[str | None], batch_tokens: list,
                 file_starts: np.ndarray) -> None:
        self.area, self.rels, self.batch_tokens = area, rels, batch_tokens
        self.file_starts = file_starts  # global token index where each input begins (+ total)
        self._open: dict[int, tuple[_LazyBatches, np.ndarray]] = {}

    def _file(self, i: int) -> tuple[_LazyBatches, np.ndarray]:
        if i not in self._open:
            reader = self.area.open_arrow(self.rels[i])
            starts = np.concatenate([[0], np.cumsum(self.batch_tokens[i])]).astype(np.int64)
            self._open = {i: (_LazyBatches(reader), starts)}  # one file at a time: sequential
        return self._open[i]

    def read(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens ``[a, b)`` and the global positions in ``[a, b)`` where documents begin."""
        out = np.empty(b - a, dtype=np.int32)
        starts_out = []
        fi = int(np.searchsorted(self.file_starts, a, side="right") - 1)
        pos = a
        while pos < b:
            while self.file_starts[fi + 1] <= pos:
                fi += 1
            batches, bstarts = self._file(fi)
            local = pos - int(self.file_starts[fi])
            j = int(np.searchsorted(bstarts, local, side="right") - 1)
            while pos < b and j < len(batches):
                arr = batches[j]
                offs = arr.offsets.to_numpy()
                base = int(self.file_starts[fi] + bstarts[j]) - int(offs[0])
                lo = pos - base
                hi = min(b - base, int(offs[-1]))
                vals = arr.values.to_numpy()
                out[pos - a:pos - a + hi - lo] = vals[lo:hi]
                # Documents that begin inside [lo, hi); empty documents begin nowhere.
                doc_first = offs[:-1][offs[1:] > offs[:-1]]
                sel = doc_first[(doc_first >= lo) & (doc_first < hi)]
                starts_out.append(sel.astype(np.int64) + base)
                pos = base + hi
                j += 1
        starts = np.concatenate(starts_out) if starts_out else np.zeros(0, np.int64)
        return out, starts


class _LazyBatches:
    """The token column of each record batch of a staged file, read on first use."""

    def __init__(self, reader: pa.ipc.RecordBatchFileReader) -> None:
        self._reader = reader
        self._got: dict[int, pa.Array] = {}

    def __len__(self) -> int:
        return self._reader.num_record_batches

    def __getitem__(self, j: int) -> pa.Array:
        if j not in self._got:
            self._got = {j: self._reader.get_batch(j).column(0)}  # sequential: keep one
        return self._got[j]


def _windows_batch(tokens: np.ndarray, starts: np.ndarray, a: int, window: int,
                   schema: pa.Schema) -> pa.RecordBatch:
    n = len(tokens) // window
    cols = [pa.FixedSizeListArray.from_arrays(pa.array(tokens), window)]
    if DOC_STARTS_COLUMN in schema.names:
        rel = starts - a
        offsets = np.searchsorted(rel, np.arange(n + 1, dtype=np.int64) * window).astype(np.int32)
        values = (rel % window).astype(np.int32)
        cols.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _pack_file(task) -> StagedInput:
    """Stage the windows ``[lo, hi)`` (those starting in input ``i``) as ``packed/<i>``."""
    from .rowsize import table_row_nbytes

    i, lo, hi, window, doc_starts, rels, batch_tokens, file_starts, area, parsed = task
    schema = window_schema(window - 1, doc_starts)
    base = f"packed/{i:06d}"
    src = _TokenSource(area, rels, batch_tokens, np.asarray(file_starts, dtype=np.int64))
    per_batch = max(1, _BATCH_TOKENS // window)
    tmp = area.scratch(f"{base}.arrow")
    sizes = []
    with pa.ipc.new_file(tmp, schema, options=area.ipc_options) as writer:
        for k in range(lo, hi, per_batch):
            k1 = min(hi, k + per_batch)
            a, b = k * window, k1 * window
            tokens, starts = src.read(a, b)
            batch = _windows_batch(tokens, starts, a, window, schema)
            writer.write_batch(batch)
            sizes.append(table_row_nbytes(batch))
    batch_rows = arrow_batch_rows(tmp)
    area.put(f"{base}.arrow", tmp)
    area.save_npy(f"{base}.sizes.npy", np.concatenate(sizes))
    out = parsed.restaged(rows=hi - lo, base=base, schema_b64=schema_to_base64(schema),
                          first_window=lo, batch_rows=batch_rows)
    area.write_json(f"{base}.json", out.to_dict())  # written last: the file's done marker
    return out


class PackWindows:
    """``restream`` for :func:`~zephon_store.write.convert.convert`: cut or pack the windows,
    stage them and the document table's parts.

    Returns the staged windows, their schema and ``{"packing": totals, DOCUMENT_PARTS:
    parts}``: the converter adds the totals (documents, tokens, windows, dropped tail,
    padding, split documents) to the manifest's ``packing`` entry and writes the document
    table from the parts (:class:`~zephon_store.write.documents.DocumentParts`). Reuses its
    staged output on a resumed run: per input (``packed/<i>.json``) and as a whole
    (``packed/done.json``).
    """

    def __init__(self, *, seq_len: int, doc_starts: bool, strategy: str = "concat",
                 buffer_windows: int = DEFAULT_BUFFER_WINDOWS, pad_id: int = 0) -> None:
        self.window = seq_len + 1
        self.doc_starts = doc_starts
        self.strategy = strategy
        self.buffer_windows = buffer_windows
        self.pad_id = pad_id

    def __call__(self, files, metas: list[StagedInput], area: StagingArea, executor):
        done_path = "packed/done.json"
        schema = window_schema(self.window - 1, self.doc_starts,
                               num_tokens=self.strategy == "best-fit")
        done = area.read_json(done_path)
        # Reused only when every staged file it names is still there (see staged_complete).
        staged = _read_done(done)
        if (staged is not None and isinstance(done.get("totals"), dict)
                and isinstance(done.get("documents"), dict)
                and all(s.complete(area) for s in staged)):
            return staged, schema, {"packing": done["totals"],
                                    DOCUMENT_PARTS: DocumentParts.from_dict(done["documents"])}

        rels = [m.rel + ".arrow" if m.rows else None for m in metas]
        batch_tokens = list(executor.map(_token_counts, [(area, r) for r in rels],
                                         name="count tokens"))
        counts = np.array([sum(b) for b in batch_tokens], dtype=np.int64)
        file_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        total, w = int(file_starts[-1]), self.window
        if total < w:
            raise InputError(
                f"the corpus holds {total} tokens, fewer than one window of seq_len + 1 = {w} "
                f"tokens; lower --seq-len or add data", path=files[0].url)
        pack = self._best_fit if self.strategy == "best-fit" else self._concat
        out, totals, parts = pack(metas, area, executor, rels, batch_tokens, file_starts)
        totals = {"num_documents": int(sum(m.rows for m in metas)), "num_tokens": total,
                  **totals}
        area.write_json(done_path, {"metas": [s.to_dict() for s in out], "totals": totals,
                                    "documents": parts.to_dict()})
        return out, schema, {"packing": totals, DOCUMENT_PARTS: parts}

    def _concat(self, metas, area, executor, rels, batch_tokens, file_starts):
        """Windows of ``w`` consecutive tokens; each input's documents' spans by arithmetic."""
        total, w = int(file_starts[-1]), self.window
        n_windows = total // w
        # Window k starts at token k*w; it belongs to the input holding that token.
        first = np.minimum(-(-file_starts // w), n_windows)
        tasks, out = [], [None] * len(metas)
        for i, m in enumerate(metas):
            lo, hi = int(first[i]), int(first[i + 1])
            if hi <= lo:
                out[i] = m.restaged(rows=0, schema_b64=None, batch_rows=None)
            elif ((meta := read_staged(area, f"packed/{i:06d}.json")) is not None
                  and meta.complete(area)):
                out[i] = meta
            else:
                tasks.append((i, lo, hi, w, self.doc_starts, rels, batch_tokens,
                              file_starts.tolist(), area, m))
        for meta in executor.map(_pack_file, tasks, name="pack"):
            out[meta.index] = meta
        doc_tasks = [(i, area, rels[i], int(file_starts[i]), w, n_windows * w)
                     for i in range(len(metas))]
        found = dict(executor.map(_concat_documents, doc_tasks, name="documents"))
        parts = DocumentParts(tuple(f"packed/{i:06d}.docs.arrow" for i in range(len(metas))),
                              (0,) * len(metas), tuple(m.rows for m in metas))
        totals = {"num_windows": n_windows, "packed_tokens": n_windows * w,
                  "dropped_tail_tokens": total - n_windows * w, "padded_tokens": 0,
                  **_sum_counts(found.values(), ("documents_split", "split_pieces"))}
        return out, totals, parts

    def _best_fit(self, metas, area, executor, rels, batch_tokens, file_starts):
        """Best-fit decreasing over buffers of ``buffer_windows * w`` tokens
        (:mod:`~zephon_store.write.bestfit`); buffer ``b`` belongs to the input holding its
        first token, and packs the documents that begin in it."""
        total, w = int(file_starts[-1]), self.window
        t = self.buffer_windows * w
        n_buffers = -(-total // t)
        schema = window_schema(w - 1, self.doc_starts, num_tokens=True)
        first = np.minimum(-(-file_starts // t), n_buffers)
        tasks, got = [], {}
        for i, m in enumerate(metas):
            lo, hi = int(first[i]), int(first[i + 1])
            meta = read_staged(area, f"packed/{i:06d}.json")
            done = area.read_json(f"packed/{i:06d}.docs.json")
            if (meta is not None and done is not None and meta.complete(area)
                    and area.exists(f"packed/{i:06d}.docs.arrow")):
                got[i] = (meta, done)
            else:
                tasks.append((i, lo, hi, t, hi == n_buffers, w, self.pad_id, schema, rels,
                              batch_tokens, file_starts.tolist(), area, m))
        for meta, done in executor.map(stage_buffers, tasks, name="pack"):
            got[meta.index] = (meta, done)
        out = [got[i][0] for i in range(len(metas))]
        windows = np.array([got[i][1]["windows"] for i in range(len(metas))], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(windows)[:-1]]).astype(np.int64)
        parts = DocumentParts(tuple(f"packed/{i:06d}.docs.arrow" for i in range(len(metas))),
                              tuple(int(x) for x in offsets), tuple(m.rows for m in metas))
        n_windows = int(windows.sum())
        totals = {"num_windows": n_windows, "packed_tokens": n_windows * w,
                  "dropped_tail_tokens": 0,
                  **_sum_counts([d for _, d in got.values()],
                                ("padded_tokens", "documents_split", "split_pieces"))}
        return out, totals, parts


def _sum_counts(counts, keys) -> dict:
    """``{key: sum over counts}`` for each of ``keys``."""
    counts = list(counts)
    return {k: int(sum(c[k] for c in counts)) for k in keys}


def _concat_documents(task) -> tuple[int, dict]:
    """One input's document part under concat, reused when staged complete."""
    i, area = task[0], task[1]
    done = area.read_json(f"packed/{i:06d}.docs.json")
    if done is not None and area.exists(f"packed/{i:06d}.docs.arrow"):
        return i, done
    return stage_concat_documents(task)


def _read_done(done: dict | None) -> list[StagedInput] | None:
    """The staged inputs ``packed/done.json`` lists, or None when it is absent or unreadable."""
    try:
        return [StagedInput.from_dict(d) for d in done["metas"]] if done is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def _token_counts(task) -> list[int]:
    """The tokens in each record batch of one staged parsed file (none for an empty input)."""
    area, rel = task
    if rel is None:
        return []
    reader = area.open_arrow(rel)
    counts = []
    for j in range(reader.num_record_batches):
        offs = reader.get_batch(j).column(0).offsets
        counts.append(int(offs[-1].as_py() - offs[0].as_py()))
    return counts


# -- wiring --------------------------------------------------------------------------------
def packing_convert_kwargs(options: PackingOptions) -> dict:
    """Keyword arguments for :func:`~zephon_store.write.convert.convert` that pack tokens.

    Returns ``parse_fn``, ``restream`` and ``extra_manifest``; the converter completes the
    manifest's ``packing`` entry with the totals ``restream`` returns (nothing is filled in
    place, so one set serves any number of ``convert`` calls).

    >>> from zephon_store import convert
    >>> kw = packing_convert_kwargs(PackingOptions(tokenizer=tiny_tokenizer, seq_len=7))
    >>> convert([tiny_jsonl], os.path.join(tmp, "ds"), **kw).num_samples   # 400 tokens, windows of 8
    50
    """
    path = tokenizer_file(options.tokenizer)
    digest = xxh3_file(path)
    tok = load_tokenizer(path, digest)
    special = resolve_special_tokens(options, tok)
    best_fit = options.strategy == "best-fit"
    pad_id = _pad_id(options, special, tok.get_vocab_size(with_added_tokens=True))
    extra = {"packing": {
        "version": PACKING_VERSION,
        "seq_len": options.seq_len,
        "window": options.window,
        "tokens_column": TOKENS_COLUMN,
        "doc_starts_column": DOC_STARTS_COLUMN if options.doc_starts else None,
        "text_column": options.text_column,
        # The file name only: an absolute path would make dataset_id depend on the host.
        "tokenizer": {"file": os.path.basename(path), "xxh3": digest,
                      "vocab_size": tok.get_vocab_size(with_added_tokens=True)},
        "bos_id": special.bos_id, "bos_token": special.bos_token,
        "eos_id": special.eos_id, "eos_token": special.eos_token,
        "strategy": options.strategy, "pad_id": pad_id,
        "buffer_windows": options.buffer_windows if best_fit else None,
        "num_tokens_column": NUM_TOKENS_COLUMN if best_fit else None,
    }, "documents_per_chunk": DOCUMENTS_PER_CHUNK}
    parse = TokenizeDocuments(tokenizer_path=path, tokenizer_xxh3=digest,
                              text_column=options.text_column, bos_id=special.bos_id,
                              eos_id=special.eos_id)
    restream = PackWindows(seq_len=options.seq_len, doc_starts=options.doc_starts,
                           strategy=options.strategy, buffer_windows=options.buffer_windows,
                           pad_id=pad_id)
    return {"parse_fn": parse, "restream": restream, "extra_manifest": extra}


def _pad_id(options: PackingOptions, special: SpecialTokens, vocab: int) -> int:
    """The padding token: ``options.pad_id``, else EOS, else BOS, else 0. Padding is never a
    label and no real token attends to it (it follows them), so any id in the vocabulary
    serves; EOS is what most trainers pad with."""
    if options.pad_id is not None:
        if options.pad_id >= vocab:
            raise ValueError(f"pad_id={options.pad_id} is outside the vocabulary of "
                             f"{options.tokenizer} ({vocab} tokens)")
        return options.pad_id
    for tid in (special.eos_id, special.bos_id):
        if tid is not None:
            return tid
    return 0


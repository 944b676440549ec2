"""The dataset manifest: ``manifest.json`` plus its columnar side tables.

``manifest.json`` is small whatever the dataset's size. Per-shard and per-row-group facts
live in Arrow IPC side tables under ``index/<xxh3>.arrow``, named by (and checked against)
their own hash, so the JSON stays a few KiB at a million shards and the tables can be
memory-mapped. ``dataset_id`` is ``"xxh3:" + xxh3-128`` of the canonical JSON of the
manifest without ``dataset_id`` and ``created_by``; since the JSON carries every side
table's hash, the id covers every byte the manifest describes. See ``formats/SPEC.md``.

Format v2 adds ``storage``: the columns whose shard layout differs from the logical
``schema`` (fixed-size lists of numbers stored as fixed-size binary, :mod:`encoding`).
Version 1 manifests have no such key and are read as they always were.

Format v4 splits the row-group table: every row count in one compact table, byte ranges
and hashes in chunks fetched on first use (:mod:`.chunks`), so a rank's start reads ~1 byte
per row group instead of ~64.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import functools
import json
import os
import re
import stat
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._util.arrow import column_np
from .._util.hashing import DATASET_ID_PREFIX, HEX_RE, xxh3_hex
from ..errors import ManifestError, StorageError, UnsafePathError, ZephonError
from .chunks import CHUNK_TABLE_SCHEMA, INDEX_TABLE_SCHEMAS, ROW_GROUPS_PER_CHUNK, ChunkedDetails
from .documents import DOCUMENT_HASHES_SCHEMA, DOCUMENT_INDEX_SCHEMA, DOCUMENT_INPUTS_SCHEMA
from .encoding import FIXED_SIZE_BINARY_SPLIT, storage_encodings, storage_schema, to_logical

FORMAT_NAME = "zephon"
FORMAT_VERSION = 6
# Versions this library reads; it writes FORMAT_VERSION. v1 has no storage encodings; v3
# adds compression="auto" (a codec per column) and the top-level "codecs" record; v4 the
# chunked row-group index (formats/SPEC.md 4.1) and zstd-compressed side tables; v5 the
# byte-plane storage encoding (fixed_size_binary_split, the default) and zstd level 6 for
# text under "auto" (formats/SPEC.md 3.1, 3.2); v6 the document table of packed datasets
# (formats/SPEC.md 4.2; every other byte as in v5).
READ_VERSIONS = (1, 2, 3, 4, 5, 6)
# The first version that may hold a document table.
DOCUMENTS_VERSION = 6
# The side tables of a document table (formats/SPEC.md 4.2): present together or not at all.
DOCUMENT_TABLES = ("documents", "document_inputs", "document_hashes")
# The first version whose storage may be fixed_size_binary_split.
SPLIT_VERSION = 5
# The first version whose row-group details are chunked.
CHUNKED_VERSION = 4
# How a v4 writer compresses every side table's buffers (readers take any IPC codec).
SIDE_TABLE_COMPRESSION = "zstd"
MANIFEST_NAME = "manifest.json"
SHARD_DIR = "shards"
INDEX_DIR = "index"
# Always used with fullmatch: `$` alone also matches before a trailing newline.
_TABLE_PATH_RE = re.compile(r"index/[0-9a-f]{32}\.arrow")
# The only names a writer creates, hence the only ones a write path or gc may ever delete.
_DATASET_FILE_RE = re.compile(r"shards/[0-9a-f]{32}\.parquet|index/[0-9a-f]{32}\.arrow")
# Counts and sizes in the manifest fit int64 with room to add them up (2**62: no sum of a
# validated table can wrap around).
MAX_COUNT = 2**62 - 1
# What a malformed manifest or side table makes Python, numpy or Arrow raise while it is
# parsed; each is turned into a ManifestError naming the file.
# (OSError too: pyarrow raises it for an invalid flatbuffer even when reading memory.)
PARSE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError,
                MemoryError, RecursionError, OSError, binascii.Error, pa.ArrowException)
# Fields left out of dataset_id: who wrote the bytes, and from where, is not what they are.
_NOT_HASHED = ("dataset_id", "created_by")

SHARD_TABLE_SCHEMA = pa.schema([
    ("name", pa.string()),
    ("bytes", pa.int64()),
    ("rows", pa.int64()),
    ("row_start", pa.int64()),
    ("first_row_group", pa.int64()),
    ("num_row_groups", pa.int64()),
    ("footer_offset", pa.int64()),
    ("footer_xxh3", pa.binary(16)),
])
ROW_GROUP_TABLE_SCHEMA = pa.schema([
    ("shard", pa.int64()),
    ("rows", pa.int64()),
    ("row_start", pa.int64()),
    ("offset", pa.int64()),
    ("length", pa.int64()),
    ("xxh3", pa.binary(16)),
])
PROVENANCE_TABLE_SCHEMA = pa.schema([
    ("input", pa.string()),
    ("input_bytes", pa.int64()),
    ("input_row_start", pa.int64()),
    ("num_rows", pa.int64()),
    ("shard", pa.int64()),
    ("row_start", pa.int64()),
])
TABLE_SCHEMAS = {
    "shards": SHARD_TABLE_SCHEMA,
    "row_groups": ROW_GROUP_TABLE_SCHEMA,
    "provenance": PROVENANCE_TABLE_SCHEMA,
}
# What table_from_ipc accepts per kind: v4's row-group index ("row_group_index", one of four
# row-count types) and its chunks besides the kinds above.
_PARSE_SCHEMAS = {**{k: (v,) for k, v in TABLE_SCHEMAS.items()},
                  "row_group_index": INDEX_TABLE_SCHEMAS,
                  "row_group_chunk": (CHUNK_TABLE_SCHEMA,),
                  "documents": (DOCUMENT_INDEX_SCHEMA,),
                  "document_inputs": (DOCUMENT_INPUTS_SCHEMA,),
                  "document_hashes": (DOCUMENT_HASHES_SCHEMA,)}


def table_kind(doc: dict, kind: str) -> str:
    """The schema kind of the side table ``doc`` names as ``kind``: a v4 manifest's
    ``row_groups`` is the chunked row-group index.

    >>> table_kind({"format_version": 4}, "row_groups"), table_kind({"format_version": 3}, "row_groups")
    ('row_group_index', 'row_groups')
    """
    version = doc.get("format_version")
    if kind == "row_groups" and type(version) is int and version >= CHUNKED_VERSION:
        return "row_group_index"
    return kind


def shard_path(name: str) -> str:
    """Relative path of a shard, after checking its name is a bare hash.

    >>> shard_path("0" * 32)
    'shards/00000000000000000000000000000000.parquet'
    """
    if not isinstance(name, str) or not HEX_RE.fullmatch(name):
        raise UnsafePathError(
            f"manifest names shard {name!r}, which is not a 32-hex-digit xxh3 name; "
            "a manifest may only name files inside the dataset root as shards/<hash>.parquet")
    return f"{SHARD_DIR}/{name}.parquet"


def is_dataset_file_name(relpath: object) -> bool:
    """True for exactly ``shards/<32 hex>.parquet`` and ``index/<32 hex>.arrow``: the names a
    conversion writes, and the only paths any write path or ``gc`` may delete.

    >>> is_dataset_file_name("shards/" + "0" * 32 + ".parquet"), is_dataset_file_name("README.md")
    (True, False)
    """
    return isinstance(relpath, str) and _DATASET_FILE_RE.fullmatch(relpath) is not None


def check_table_path(path: str) -> str:
    """Reject side-table paths outside ``index/<hash>.arrow``."""
    if not isinstance(path, str) or not _TABLE_PATH_RE.fullmatch(path):
        raise UnsafePathError(
            f"manifest names side table {path!r}; only index/<32 hex>.arrow inside the dataset "
            "root is allowed")
    return path


def schema_to_base64(schema: pa.Schema) -> str:
    """``schema`` as base64 of its Arrow IPC bytes (the manifest's and the staging's encoding).

    >>> schema_from_base64(schema_to_base64(pa.schema([("x", pa.int8())])))
    x: int8
    """
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_base64(text: str) -> pa.Schema:
    """The schema :func:`schema_to_base64` encoded (binascii.Error or ArrowInvalid if not one)."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))


def schema_to_json(schema: pa.Schema) -> dict:
    """The manifest's ``schema`` object: the IPC bytes plus a readable field list."""
    return {
        "arrow_ipc_base64": schema_to_base64(schema),
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable}
                   for f in schema],
    }


def schema_from_json(obj: dict) -> pa.Schema:
    """The Arrow schema of a manifest's ``schema`` object; ManifestError if it is malformed."""
    try:
        return schema_from_base64(obj["arrow_ipc_base64"])
    except PARSE_ERRORS as exc:
        raise ManifestError(f"manifest 'schema' is not a base64 Arrow IPC schema "
                            f"({type(exc).__name__}: {exc}); restore the manifest or "
                            "re-convert") from exc


def table_to_ipc(table: pa.Table, *, compression: str | None = None) -> bytes:
    """Serialise a side table as an Arrow IPC file: uncompressed (memory-mappable, formats
    v1-v3) or with ``compression="zstd"`` buffer compression (v4)."""
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(sink, table.schema, options=opts) as w:
        w.write_table(table, max_chunksize=max(1, table.num_rows))
    return sink.getvalue().to_pybytes()


def table_from_ipc(data: bytes | pa.Buffer, kind: str) -> pa.Table:
    """Parse a side table (Arrow IPC file); ManifestError unless it has ``kind``'s exact
    schema and no nulls."""
    try:
        table = pa.ipc.open_file(pa.py_buffer(data) if isinstance(data, bytes) else data
                                 ).read_all()
    except PARSE_ERRORS as exc:
        raise ManifestError(f"side table {kind!r} is not a readable Arrow IPC file "
                            f"({type(exc).__name__}: {exc}); re-convert the dataset") from exc
    wants = _PARSE_SCHEMAS[kind]
    if not any(table.schema.equals(w) for w in wants):
        raise ManifestError(f"side table {kind!r} has schema {table.schema}, expected "
                            f"{' or '.join(map(str, wants))}")
    nulls = [name for name, col in zip(table.column_names, table.columns) if col.null_count]
    if nulls:
        raise ManifestError(f"side table {kind!r} has nulls in {nulls}; re-convert the dataset")
    return table


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def compute_dataset_id(doc: dict) -> str:
    """``xxh3:<hex>`` of the canonical manifest content (without id and created_by)."""
    body = {k: v for k, v in doc.items() if k not in _NOT_HASHED}
    return DATASET_ID_PREFIX + xxh3_hex(canonical_json(body))


class Manifest:
    """A loaded, validated manifest.

    >>> from zephon_store.io.storage import Storage
    >>> m = load_manifest(Storage(tiny_dataset))
    >>> m.num_samples, m.num_shards, m.dataset_id
    (100, 1, 'xxh3:...')
    """

    def __init__(self, doc: dict, tables: dict[str, pa.Table], *, url: str = "<memory>",
                 loader=None, read_chunk: Callable[[str], bytes] | None = None,
                 parallel: bool = False,
                 read_index: Callable[..., bytes] | None = None) -> None:
        """``read_chunk(xxh3) -> bytes``: a v4 row-group chunk's verified file bytes (see
        :class:`~zephon_store.format.chunks.ChunkedDetails`); ``parallel``: fetch several at
        once (remote data); ``read_index(xxh3, what=...) -> bytes``: any other index file's
        verified bytes (v6 document chunks)."""
        self.doc = doc
        self.url = url
        self._tables = dict(tables)
        self._loader = loader
        self._read_chunk = read_chunk
        self._read_index = read_index
        self._parallel = parallel
        self.details: ChunkedDetails | None = None
        try:
            self._columns(doc, tables)
        except ManifestError as exc:
            raise ManifestError(f"{url}: {exc}") from exc
        except PARSE_ERRORS as exc:
            raise ManifestError(f"{url}: malformed manifest or side table "
                                f"({type(exc).__name__}: {exc}); restore it or re-convert"
                                ) from exc

    def _columns(self, doc: dict, tables: dict[str, pa.Table]) -> None:
        version = doc.get("format_version")
        if type(version) is not int or version not in READ_VERSIONS:
            raise ManifestError(
                f"format_version {version!r} is not supported by this zephon_store "
                f"(reads {', '.join(map(str, READ_VERSIONS))}); upgrade zephon_store")
        self.schema = schema_from_json(doc["schema"])
        # Column -> storage encoding; empty for v1 and for datasets without encoded columns.
        storage = doc.get("storage") or {}
        if not isinstance(storage, dict):
            raise ManifestError(f"'storage' must be an object, got {type(storage).__name__}")
        self.storage = dict(storage)
        sh = tables["shards"]
        rg = tables["row_groups"]
        self._shard_names = sh.column("name")
        self.shard_bytes = column_np(sh.column("bytes"))
        self.shard_rows = column_np(sh.column("rows"))
        self.shard_row_start = column_np(sh.column("row_start"))
        self.shard_first_rg = column_np(sh.column("first_row_group"))
        self.shard_num_rgs = column_np(sh.column("num_row_groups"))
        self.footer_offset = column_np(sh.column("footer_offset"))
        self._footer_xxh3 = sh.column("footer_xxh3")
        if version >= CHUNKED_VERSION:
            self._chunked_columns(doc, rg)
            return
        self.rg_shard = column_np(rg.column("shard"))
        self.rg_rows = column_np(rg.column("rows"))
        self.rg_row_start = column_np(rg.column("row_start"))
        self.rg_offset = column_np(rg.column("offset"))
        self.rg_length = column_np(rg.column("length"))
        self._rg_xxh3 = rg.column("xxh3")

    def _chunked_columns(self, doc: dict, index: pa.Table) -> None:
        """v4: row counts from the index, shard and row_start derived, byte ranges and
        hashes lazily per chunk (formats/SPEC.md 4.1)."""
        per_chunk = doc.get("row_groups_per_chunk")
        if type(per_chunk) is not int or not 1 <= per_chunk <= MAX_COUNT:
            raise ManifestError(f"row_groups_per_chunk is {per_chunk!r}, not an integer in "
                                f"[1, {MAX_COUNT}]")
        lists = index.column("rows").combine_chunks()
        values = lists.flatten()
        if values.null_count:
            raise ManifestError("the row-group index has null row counts; re-convert")
        counts = column_np(values)   # not to_numpy(): that imports pandas (~0.2 s a process)
        if counts.size and int(counts.max()) > MAX_COUNT:
            raise ManifestError(f"the row-group index holds a row count past {MAX_COUNT}")
        self.rg_rows = counts.astype(np.int64)
        sizes = np.diff(column_np(lists.offsets))
        n_rg, n_ch = int(self.rg_rows.size), len(sizes)
        if n_ch != -(-n_rg // per_chunk) or (n_ch and (
                np.any(sizes[:-1] != per_chunk) or not 1 <= int(sizes[-1]) <= per_chunk)):
            raise ManifestError(f"the row-group index's {n_ch} chunks do not hold "
                                f"{per_chunk} row groups each (the last 1..{per_chunk}) of the "
                                f"{n_rg} row groups")
        self.rg_row_start = np.zeros(n_rg, dtype=np.int64)
        np.cumsum(self.rg_rows[:-1], out=self.rg_row_start[1:])
        n_rgs = self.shard_num_rgs
        if n_rgs.size and (int(n_rgs.min()) < 0 or _exact_sum(n_rgs) != n_rg):
            raise ManifestError(f"the shard table's num_row_groups do not add up to the "
                                f"{n_rg} row groups of the row-group index")
        self.rg_shard = np.repeat(np.arange(len(n_rgs), dtype=np.int64), n_rgs)
        self.details = ChunkedDetails(index, per_chunk=per_chunk, num_row_groups=n_rg,
                                      url=self.url, read=self._read_chunk,
                                      check=self._check_chunk, parallel=self._parallel)
        self.rg_offset = self.details.offset
        self.rg_length = self.details.length

    @property
    def tables(self) -> dict[str, pa.Table]:
        """All side tables; provenance is fetched on first use (readers do not need it).
        The document table's (v6) are not among them: :meth:`side_table` fetches those."""
        for kind in TABLE_SCHEMAS:
            if kind not in self._tables and self._loader is not None:
                table = self._loader(kind)
                if kind == "provenance":
                    self.check_provenance(table)
                self._tables[kind] = table
        return self._tables

    @property
    def has_documents(self) -> bool:
        """Whether the manifest names a document table (format v6 packed data)."""
        tables = self.doc.get("tables")
        return isinstance(tables, dict) and "documents" in tables

    @property
    def documents_per_chunk(self) -> int | None:
        """Documents per chunk of the document table (format v6), None without one."""
        return int(self.doc["documents_per_chunk"]) if self.has_documents else None

    def side_table(self, kind: str) -> pa.Table:
        """Side table ``kind`` (``documents``, ``document_inputs``, or any of :attr:`tables`),
        fetched, verified and parsed on first use."""
        if kind not in self._tables:
            if self._loader is None:
                raise ManifestError(f"{self.url}: side table {kind!r} is not available to this "
                                    "manifest (built in memory without it)")
            self._tables[kind] = self._loader(kind)
        return self._tables[kind]

    def side_tables(self, kinds) -> dict[str, pa.Table]:
        """Side tables ``kinds``, as :meth:`side_table`; those not fetched yet are fetched side
        by side for remote data (one round trip)."""
        missing = [k for k in kinds if k not in self._tables]
        if len(missing) > 1 and self._parallel and self._loader is not None:
            with concurrent.futures.ThreadPoolExecutor(
                    len(missing), thread_name_prefix="zephon-index") as pool:
                for kind, table in zip(missing, pool.map(self._loader, missing)):
                    self._tables.setdefault(kind, table)
        return {k: self.side_table(k) for k in kinds}

    def read_index_file(self, xxh3: str, what: str) -> bytes:
        """The verified bytes of ``index/<xxh3>.arrow`` (a document chunk, say), through the
        node cache for remote data."""
        if self._read_index is None:
            raise ManifestError(f"{self.url}: {what} index/{xxh3}.arrow is not available to "
                                "this manifest (built in memory without it)")
        return self._read_index(xxh3, what=what)

    def document_chunk_paths(self) -> dict[str, int]:
        """``{index/<xxh3>.arrow: bytes}`` of every document-table chunk and text-hash
        bucket (none without a document table)."""
        if not self.has_documents:
            return {}
        out = {}
        for kind in ("documents", "document_hashes"):
            t = self.side_table(kind)
            digests = t.column("xxh3").to_pylist()
            out.update({f"{INDEX_DIR}/{d.hex()}.arrow": int(b)
                        for d, b in zip(digests, column_np(t.column("bytes")))})
        return out

    # -- facts -------------------------------------------------------------------------
    @property
    def dataset_id(self) -> str:
        return self.doc["dataset_id"]

    @property
    def num_samples(self) -> int:
        return int(self.doc["totals"]["num_samples"])

    @property
    def num_shards(self) -> int:
        return int(self.doc["totals"]["num_shards"])

    @property
    def num_row_groups(self) -> int:
        return int(self.doc["totals"]["num_row_groups"])

    def row_group_of(self, ids) -> np.ndarray:
        """The row group holding each sample id (no range check: :func:`~zephon_store.format.index.locate`
        checks)."""
        return self.rg_row_start.searchsorted(np.asarray(ids, dtype=np.int64), "right") - 1

    @property
    def total_bytes(self) -> int:
        return int(self.doc["totals"]["total_bytes"])

    # The document's sections, so nobody outside format/ reads ``doc`` by key.
    @property
    def format_version(self) -> int:
        return int(self.doc["format_version"])

    @property
    def writer(self) -> dict:
        """The writer options the shards were written with (``WriteOptions.to_dict()``)."""
        return self.doc["writer"]

    @property
    def schema_fields(self) -> list[dict]:
        """The logical schema as ``[{"name", "type", "nullable"}, ...]`` (for display)."""
        return self.doc["schema"]["fields"]

    @property
    def inputs(self) -> dict:
        """Provenance: the inputs the dataset was converted from (empty if not recorded)."""
        return self.doc.get("inputs", {})

    @property
    def skipped(self) -> dict:
        """Counts of what the conversion skipped, by reason (empty if not recorded)."""
        return self.doc.get("skipped", {})

    @property
    def created_by(self) -> dict:
        return self.doc.get("created_by", {})

    @property
    def packing(self) -> dict | None:
        """The token-packing entry (seq_len, tokenizer, totals), or None for unpacked data."""
        info = self.doc.get("packing")
        return info if isinstance(info, dict) else None

    @property
    def codecs(self) -> dict | None:
        """What ``compression="auto"`` chose per top-level column, ``{column: {codec:
        shards}}`` (SPEC.md 3.2), or None when a named codec applied to every column."""
        info = self.doc.get("codecs")
        return info if isinstance(info, dict) else None

    @functools.cached_property
    def stored_row_group_bytes(self) -> int:
        """The stored bytes of all row groups (the sum of ``rg_length``), without reading the
        row-group details themselves: what means and per-sample sizes are computed from."""
        if self.details is not None:
            return _exact_sum(self.details.row_group_bytes)
        return _exact_sum(np.asarray(self.rg_length))

    def rg_length_hint(self, rg: int) -> int:
        """Row group ``rg``'s stored bytes where known without a fetch (v1-v3, or a v4 chunk
        fetched already), else the mean of its v4 chunk: for budgets, never for reads."""
        d = self.details
        if d is None:
            return int(self.rg_length[rg])
        c, i = divmod(int(rg), d.per_chunk)
        got = d.peek(c)
        if got is not None:
            return int(got[1][i])
        count = min(d.per_chunk, d.num_row_groups - c * d.per_chunk)
        return int(d.row_group_bytes[c]) // max(1, count)

    def known_rg_xxh3(self, rg: int) -> str | None:
        """:meth:`rg_xxh3` if known without a fetch (always for v1-v3), else None."""
        d = self.details
        if d is None:
            return self.rg_xxh3(rg)
        c, i = divmod(int(rg), d.per_chunk)
        got = d.peek(c)
        return None if got is None else got[2][i].tobytes().hex()

    def warm_row_groups(self, rgs) -> None:
        """Start fetching what reading row groups ``rgs`` needs from the index (v4 chunks not
        fetched yet) without waiting: called before a shard's footer is fetched, so both
        travel in one round trip. A no-op for v1-v3 and local data."""
        if self.details is not None:
            self.details.warm(rgs)

    def shard_name(self, shard: int) -> str:
        return self._shard_names[int(shard)].as_py()

    def shard_footer_xxh3(self, shard: int) -> str:
        return self._footer_xxh3[int(shard)].as_py().hex()

    def rg_xxh3(self, rg: int) -> str:
        if self.details is not None:
            return self.details.xxh3(rg)
        return self._rg_xxh3[int(rg)].as_py().hex()

    def rg_local_index(self, rg: int) -> int:
        """Index of global row group ``rg`` inside its shard."""
        return int(rg - self.shard_first_rg[self.rg_shard[rg]])

    def shard_path(self, shard: int) -> str:
        return shard_path(self.shard_name(shard))

    def referenced_paths(self) -> set[str]:
        """Every root-relative path this manifest names: its shards and side tables.

        Raises :class:`UnsafePathError` when a shard or any ``tables`` entry names something
        other than ``shards/<hash>.parquet`` / ``index/<hash>.arrow``: callers delete what an
        old manifest referenced, so a forged path (``manifest.json``, ``../x``) must never
        come out of here.
        """
        paths = {self.shard_path(s) for s in range(len(self.shard_bytes))}
        tables = self.doc.get("tables")
        if not isinstance(tables, dict):
            raise self._fail("'tables' is not an object")
        for kind, ref in tables.items():
            path = ref.get("path") if isinstance(ref, dict) else None
            try:
                paths.add(check_table_path(path))
            except UnsafePathError as exc:
                raise UnsafePathError(f"{self.url}: tables.{kind}: {exc}") from None
        if self.details is not None:   # named by their 16 digest bytes: always safe
            paths.update(self.details.paths())
        paths.update(self.document_chunk_paths())
        return paths

    def table_sizes(self) -> dict[str, int]:
        """``{root-relative path: bytes}`` of the side tables (checked as by
        :meth:`referenced_paths`)."""
        self.referenced_paths()
        sizes = {ref["path"]: int(ref["bytes"]) for ref in self.doc["tables"].values()}
        if self.details is not None:
            sizes.update(self.details.paths())
        sizes.update(self.document_chunk_paths())
        return sizes

    def unreferenced(self, listdir: Callable[[str], list[str]]) -> list[str]:
        """Root-relative paths under ``shards/`` and ``index/`` this manifest does not name
        (orphans): ``listdir(folder)`` gives a folder's root-relative paths, e.g.
        ``Storage.listdir``."""
        kept = self.referenced_paths()
        return [rel for sub in (SHARD_DIR, INDEX_DIR) for rel in listdir(sub) if rel not in kept]

    @functools.cached_property
    def storage_schema(self) -> pa.Schema:
        """The Arrow schema the shards hold (``schema`` with the storage encodings applied).

        Raises :class:`ManifestError` if ``storage`` does not fit ``schema``.
        """
        try:
            return storage_schema(self.schema, self.storage)
        except ValueError as exc:
            raise ManifestError(f"{self.url}: storage: {exc}") from exc

    def to_logical(self, table: pa.Table) -> pa.Table:
        """A decoded shard table in the logical types of ``schema`` (no-op without encodings).

        >>> import os, pyarrow.parquet as pq
        >>> from zephon_store.io.storage import Storage
        >>> m = load_manifest(Storage(tiny_dataset))
        >>> pf = pq.ParquetFile(os.path.join(tiny_dataset, m.shard_path(0)))
        >>> m.to_logical(pf.read_row_group(0)).schema == m.schema
        True
        """
        if not self.storage:
            return table
        return to_logical(table, self.schema, self.storage)

    # -- validation ----------------------------------------------------------------------
    def check(self) -> None:
        """Every check that needs no shard bytes; raise ManifestError on the first failure.

        The JSON's fields and types, ``dataset_id``, then the side tables: every index,
        offset, length and count consistent with the shard table and the totals
        (:meth:`check_layout`, :meth:`check_counts`). After it, a reader can index the
        tables without bounds checks and locate every sample exactly.
        """
        self.check_doc()
        self.check_dataset_id()
        self.check_layout()
        self.check_counts()

    def _fail(self, what: str) -> ManifestError:
        return ManifestError(f"{self.url}: {what}; the manifest is corrupted or forged: "
                             "restore it or re-convert")

    def check_doc(self) -> None:
        """The JSON's identity, version, storage encodings and totals."""
        doc = self.doc
        check_version(doc, self.url)
        _ = self.storage_schema  # raises ManifestError if storage does not fit schema
        writer = doc.get("writer")
        if not isinstance(writer, dict):
            raise self._fail("'writer' is not an object")
        for key in ("row_group_bytes", "row_group_rows"):   # readers size buffers by them
            v = writer.get(key)
            if v is not None and (type(v) is not int or not 1 <= v <= MAX_COUNT):
                raise self._fail(f"writer.{key} is {v!r}, not null or an integer in "
                                 f"[1, {MAX_COUNT}]")
        totals = doc.get("totals")
        if not isinstance(totals, dict):
            raise self._fail("'totals' is not an object")
        for key in ("num_samples", "num_shards", "num_row_groups", "total_bytes"):
            v = totals.get(key)
            if type(v) is not int or not 0 <= v <= MAX_COUNT:
                raise self._fail(f"totals.{key} is {v!r}, not an integer in [0, {MAX_COUNT}]")

    def check_dataset_id(self) -> None:
        """``dataset_id`` is the hash of the manifest's content."""
        doc = self.doc
        want = compute_dataset_id(doc)
        if doc.get("dataset_id") != want:
            raise ManifestError(
                f"{self.url}: dataset_id {doc.get('dataset_id')!r} does not match the manifest's "
                f"content ({want}); the manifest was edited or corrupted, re-convert or restore it")

    def check_layout(self) -> None:
        """Shard names, and every index, offset and length of the side tables in range.

        After it every row group belongs to the shard the shard table says (contiguous, in
        order), lies inside that shard before its footer, and no two overlap: safe to index
        and to read, whatever the counts say (:meth:`check_counts`).
        """
        names = self._shard_names
        ok = pc.match_substring_regex(names, f"^{HEX_RE.pattern}$")   # RE2: `$` is the very end
        if len(ok) and not pc.all(ok, skip_nulls=False).as_py():
            shard_path(names.filter(pc.invert(ok))[0].as_py())  # UnsafePathError naming it
        t = self.doc["totals"]
        n_sh, n_rg = len(names), len(self.rg_rows)
        if t["num_shards"] != n_sh or t["num_row_groups"] != n_rg:
            raise self._fail(f"totals say {t['num_shards']} shards/{t['num_row_groups']} row "
                             f"groups, side tables hold {n_sh}/{n_rg}")
        for label, col, lo in (("shard bytes", self.shard_bytes, 12),
                               ("shard rows", self.shard_rows, 1),
                               ("shard row_start", self.shard_row_start, 0),
                               ("shard num_row_groups", self.shard_num_rgs, 1),
                               ("shard first_row_group", self.shard_first_rg, 0),
                               ("shard footer_offset", self.footer_offset, 4),
                               ("row-group shard", self.rg_shard, 0),
                               ("row-group rows", self.rg_rows, 1),
                               ("row-group row_start", self.rg_row_start, 0)):
            if col.size and (int(col.min()) < lo or int(col.max()) > MAX_COUNT):
                bad = int(np.flatnonzero((col < lo) | (col > MAX_COUNT))[0])
                raise self._fail(f"{label} [{bad}] is {int(col[bad])}, outside "
                                 f"[{lo}, {MAX_COUNT}]")
        if n_sh:
            # Row groups are listed shard by shard: shard s owns the contiguous run
            # [first_row_group[s], first_row_group[s] + num_row_groups[s]).
            ends = np.cumsum(self.shard_num_rgs)   # each <= 2**62, n_sh of them: exact
            if (int(ends[-1]) != n_rg or self.shard_first_rg[0] != 0
                    or np.any(self.shard_first_rg[1:] != ends[:-1])):
                raise self._fail("the shard table's first_row_group/num_row_groups do not "
                                 f"partition the {n_rg} row groups in order")
        elif n_rg:
            raise self._fail(f"{n_rg} row groups but no shards")
        if n_rg:
            if np.any(self.rg_shard != np.repeat(np.arange(n_sh), self.shard_num_rgs)):
                bad = int(np.flatnonzero(
                    self.rg_shard != np.repeat(np.arange(n_sh), self.shard_num_rgs))[0])
                raise self._fail(f"row group {bad} names shard {int(self.rg_shard[bad])}, but "
                                 "the shard table places it elsewhere")
            # The footer is the file's last bytes: its length (4) and "PAR1" (4) at least.
            if np.any(self.footer_offset + 8 > self.shard_bytes):
                bad = int(np.flatnonzero(self.footer_offset + 8 > self.shard_bytes)[0])
                raise self._fail(f"shard {bad}: footer_offset {int(self.footer_offset[bad])} "
                                 f"does not leave a footer in its {int(self.shard_bytes[bad])} "
                                 "bytes")
        if self.details is None:
            self._check_ranges(0, self.rg_offset, self.rg_length)
            return
        # v4: the chunks' own values are checked as each is fetched (_check_chunk).
        for label, col in (("row-group chunk bytes", self.details.chunk_bytes),
                           ("row-group chunk row_group_bytes", self.details.row_group_bytes)):
            if col.size and (int(col.min()) < 0 or int(col.max()) > MAX_COUNT):
                raise self._fail(f"{label} holds a value outside [0, {MAX_COUNT}]")

    def _check_ranges(self, first: int, offset: np.ndarray, length: np.ndarray) -> None:
        """Row groups ``first, first + 1, ...`` with these byte ranges lie inside their shard
        before its footer, and none overlaps the one before it (within these)."""
        for label, col, lo in (("row-group offset", offset, 4), ("row-group length", length, 1)):
            if col.size and (int(col.min()) < lo or int(col.max()) > MAX_COUNT):
                bad = int(np.flatnonzero((col < lo) | (col > MAX_COUNT))[0])
                raise self._fail(f"{label} [{first + bad}] is {int(col[bad])}, outside "
                                 f"[{lo}, {MAX_COUNT}]")
        if not offset.size:
            return
        shard = self.rg_shard[first:first + offset.size]
        end = offset + length   # each term <= 2**62: no overflow
        limit = self.footer_offset[shard]
        if np.any(end > limit):
            bad = int(np.flatnonzero(end > limit)[0])
            raise self._fail(f"row group {first + bad} (bytes {int(offset[bad])}.."
                             f"{int(end[bad])}) runs past its shard's footer offset "
                             f"{int(limit[bad])}")
        same = shard[1:] == shard[:-1]
        if np.any(same & (offset[1:] < end[:-1])):
            bad = int(np.flatnonzero(same & (offset[1:] < end[:-1]))[0]) + 1
            raise self._fail(f"row group {first + bad} overlaps (or precedes) the one before "
                             "it in its shard")

    def _check_chunk(self, c: int, first: int, offset: np.ndarray, length: np.ndarray) -> None:
        """v4 chunk ``c`` (row groups from ``first``), as it is fetched: its ranges
        (:meth:`_check_ranges`) and their sum, which the row-group index records."""
        self._check_ranges(first, offset, length)
        total = _exact_sum(length)
        if total != int(self.details.row_group_bytes[c]):
            raise self._fail(f"row-group chunk {c}'s lengths add up to {total}, not the "
                             f"{int(self.details.row_group_bytes[c])} the row-group index "
                             "records")

    def check_row_group_details(self) -> None:
        """Every row group's byte range, as :meth:`check_layout` checks them in v1-v3; in v4
        it fetches every chunk (each checked as it comes) and checks across chunk borders
        too. For ``verify`` and the writer: a reader checks only the chunks it fetches."""
        if self.details is None:
            return
        self.details.load_all()
        self._check_ranges(0, np.asarray(self.rg_offset), np.asarray(self.rg_length))

    def check_provenance(self, table: pa.Table) -> None:
        """The provenance table points into the shard table and covers every sample once:
        each piece's rows lie inside its shard (shard -1: an input that gave no rows)."""
        shard = column_np(table.column("shard"))
        rows = column_np(table.column("num_rows"))
        start = column_np(table.column("row_start"))
        n_sh = len(self.shard_rows)
        for label, col in (("num_rows", rows), ("row_start", start),
                           ("input_bytes", column_np(table.column("input_bytes"))),
                           ("input_row_start", column_np(table.column("input_row_start")))):
            if col.size and (int(col.min()) < 0 or int(col.max()) > MAX_COUNT):
                raise self._fail(f"provenance {label} holds a value outside [0, {MAX_COUNT}]")
        if shard.size and (int(shard.min()) < -1 or int(shard.max()) >= n_sh):
            raise self._fail(f"provenance names a shard outside [-1, {n_sh})")
        used = shard >= 0
        if np.any(~used & (rows != 0)):
            raise self._fail("provenance gives rows to an input without a shard")
        s = shard[used]
        lo = self.shard_row_start[s]
        if np.any((start[used] < lo) | (start[used] + rows[used] > lo + self.shard_rows[s])):
            raise self._fail("provenance places rows outside their shard")
        total = _exact_sum(rows)
        if total != self.num_samples:
            raise self._fail(f"provenance covers {total} rows, not num_samples="
                             f"{self.num_samples}")

    def check_counts(self) -> None:
        """Row counts and sizes add up: running sums, per-shard sums, the totals."""
        t = self.doc["totals"]
        n_sh, n_rg = len(self.shard_rows), len(self.rg_rows)
        for label, starts, rows in (("row-group", self.rg_row_start, self.rg_rows),
                                    ("shard", self.shard_row_start, self.shard_rows)):
            # starts and rows are each <= 2**62, so a difference never wraps, and the
            # running sum they describe is exact; its end must be num_samples.
            if rows.size and (starts[0] != 0 or np.any(np.diff(starts) != rows[:-1])):
                raise self._fail(f"{label} row_start column is not the running sum of rows")
            total = int(starts[-1]) + int(rows[-1]) if rows.size else 0
            if total != t["num_samples"]:
                raise self._fail(f"{label} row counts add up to {total}, not "
                                 f"num_samples={t['num_samples']}")
        if n_rg and (np.any(self.shard_row_start != self.rg_row_start[self.shard_first_rg])
                     or np.any(self.rg_rows[self.shard_first_rg + self.shard_num_rgs - 1]
                               + self.rg_row_start[self.shard_first_rg + self.shard_num_rgs - 1]
                               != self.shard_row_start + self.shard_rows)):
            raise self._fail("row-group row counts do not add up to their shards' rows")
        # v4 derives row_start by a running sum: an exact sum shows one that wrapped around.
        if n_rg and _exact_sum(self.rg_rows) != t["num_samples"]:
            raise self._fail(f"row-group row counts do not add up to num_samples="
                             f"{t['num_samples']}")
        size = _exact_sum(self.shard_bytes)
        if n_sh and size != t["total_bytes"]:
            raise self._fail(f"shard sizes add up to {size}, not total_bytes={t['total_bytes']}")

    # -- (de)serialisation --------------------------------------------------------------
    @staticmethod
    def build_doc(*, schema: pa.Schema, writer: dict, totals: dict, table_refs: dict,
                  inputs: dict, skipped: dict, created_by: dict, extra: dict | None = None,
                  row_groups_per_chunk: int = ROW_GROUPS_PER_CHUNK) -> dict:
        doc = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "schema": schema_to_json(schema),
            # The shard writer derives the same encodings from the same schema and options.
            # (A writer record without the key predates "split": it meant "binary".)
            "storage": storage_encodings(schema, writer.get("fixed_size_lists", "binary"),
                                         writer.get("compression")),
            "writer": writer,
            "totals": totals,
            "tables": table_refs,
            "row_groups_per_chunk": row_groups_per_chunk,
            "inputs": inputs,
            "skipped": skipped,
            "created_by": created_by,
        }
        if extra:
            doc.update(extra)
        doc["dataset_id"] = compute_dataset_id(doc)
        return doc

    def to_json(self) -> bytes:
        return json.dumps(self.doc, sort_keys=True, indent=1).encode() + b"\n"


def check_version(doc: dict, url: str) -> None:
    """The manifest's format, a version this library reads, and the keys that version must
    have and must not have; ManifestError otherwise. Checked before any side table is
    fetched: an unknown version is refused as such, not as a table of an unexpected shape."""
    if doc.get("format") != FORMAT_NAME:
        raise ManifestError(f"{url}: not a zephon manifest (format={doc.get('format')!r})")
    version = doc.get("format_version")
    if type(version) is not int or version not in READ_VERSIONS:
        raise ManifestError(
            f"{url}: format_version {version!r} is not supported by this zephon_store "
            f"(reads {', '.join(map(str, READ_VERSIONS))}); upgrade zephon_store")
    if version == 1 and "storage" in doc:
        raise ManifestError(f"{url}: a format_version 1 manifest cannot have 'storage' "
                            "(added in version 2); the manifest is corrupted, re-convert")
    if version >= 2 and not isinstance(doc.get("storage"), dict):
        raise ManifestError(f"{url}: format_version {version} manifest lacks its "
                            "'storage' object; the manifest is corrupted, re-convert")
    if (version < SPLIT_VERSION and isinstance(doc.get("storage"), dict)
            and FIXED_SIZE_BINARY_SPLIT in doc["storage"].values()):
        raise ManifestError(f"{url}: a format_version {version} manifest cannot name the "
                            f"storage encoding {FIXED_SIZE_BINARY_SPLIT!r} (added in version "
                            f"{SPLIT_VERSION}); the manifest is corrupted, re-convert")
    if version < CHUNKED_VERSION and "row_groups_per_chunk" in doc:
        raise ManifestError(f"{url}: a format_version {version} manifest cannot have "
                            "'row_groups_per_chunk' (added in version 4); the manifest is "
                            "corrupted, re-convert")
    if version >= CHUNKED_VERSION and "row_groups_per_chunk" not in doc:
        raise ManifestError(f"{url}: format_version {version} manifest lacks "
                            "'row_groups_per_chunk'; the manifest is corrupted, re-convert")
    tables = doc.get("tables") if isinstance(doc.get("tables"), dict) else {}
    named = [k for k in DOCUMENT_TABLES if k in tables]
    if named and version < DOCUMENTS_VERSION:
        raise ManifestError(f"{url}: a format_version {version} manifest cannot name a "
                            f"document table (added in version {DOCUMENTS_VERSION}); the "
                            "manifest is corrupted, re-convert")
    if named and len(named) != len(DOCUMENT_TABLES):
        raise ManifestError(f"{url}: the manifest names tables.{named[0]} without "
                            f"tables.{[k for k in DOCUMENT_TABLES if k not in named][0]}; the "
                            "manifest is "
                            "corrupted, re-convert")
    per_chunk = doc.get("documents_per_chunk")
    if named and (type(per_chunk) is not int or not 1 <= per_chunk <= MAX_COUNT):
        raise ManifestError(f"{url}: documents_per_chunk is {per_chunk!r}, not an integer in "
                            f"[1, {MAX_COUNT}]; the manifest is corrupted, re-convert")
    if not named and "documents_per_chunk" in doc:
        raise ManifestError(f"{url}: the manifest has documents_per_chunk but no document "
                            "table; the manifest is corrupted, re-convert")


def require_regular_file(storage, relpath: str, *, error=StorageError) -> None:
    """Raise ``error`` if local ``relpath`` exists but is not a regular file.

    A FIFO blocks its reader forever, ``/dev/zero`` never ends, a directory is no data: a
    dataset holds regular files only. Checked with ``stat`` before any open (symlinks to
    regular files are fine). Object stores have no such files; a missing file is left to
    the read that follows (it raises the precise not-found error).
    """
    if not getattr(storage, "local", False):
        return
    path = storage.url(relpath)
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        raise error(f"{path}: cannot stat ({exc})") from exc
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
                if stat.S_ISSOCK(mode) else "not a regular file")
        raise error(f"{path} is {kind}, not a regular file; a zephon dataset holds regular "
                    "files only: restore it from the original or re-convert")


def _exact_sum(values: np.ndarray) -> int:
    """Sum of non-negative int64 ``values``; a sum past int64 raises instead of wrapping."""
    total = int(values.sum()) if values.size else 0
    if abs(float(values.sum(dtype=np.float64)) - total) > 2.0**40:
        raise ManifestError(f"side table sizes add up to more than {MAX_COUNT}; the manifest "
                            "is corrupted or forged: restore it or re-convert")
    return total


def parse_manifest_json(data: bytes, url: str) -> dict:
    """Parse manifest bytes into a dict with a clear error on malformed JSON."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError, MemoryError) as exc:
        # ValueError covers bad UTF-8, bad JSON and integers of over 4300 digits.
        raise ManifestError(f"{url}: manifest is not valid JSON ({type(exc).__name__}: "
                            f"{str(exc)[:200]}); restore it or re-convert") from exc
    if not isinstance(doc, dict):
        raise ManifestError(f"{url}: manifest must be a JSON object")
    missing = [k for k in ("format", "format_version", "dataset_id", "schema", "writer", "totals",
                           "tables") if k not in doc]
    if missing:
        raise ManifestError(f"{url}: manifest lacks the keys {missing}; re-convert the dataset")
    return doc


def load_side_table(storage, doc: dict, kind: str, url: str, node_cache=None) -> pa.Table:
    """Fetch one side table named by the manifest, verified against its hash.

    With ``node_cache`` (a :class:`~zephon_store.io.cache.ChunkCache`: anything with
    ``get_or_fetch(xxh3, fetch)``) the table is fetched once per node: it is named by its
    content hash, so the node's copy is valid forever and the others read it from disk."""
    tables = doc.get("tables")
    ref = tables.get(kind) if isinstance(tables, dict) else None
    if not isinstance(ref, dict):
        raise ManifestError(f"{url}: manifest names no {kind!r} side table (tables.{kind} is "
                            f"{ref!r}); restore the manifest or re-convert")
    path = check_table_path(ref.get("path"))
    if path != f"{INDEX_DIR}/{ref.get('xxh3')}.arrow":
        raise UnsafePathError(f"{url}: side table {path} is not named by its hash {ref.get('xxh3')}")
    data = read_index_file(storage, ref["xxh3"], f"{kind} side table", url, node_cache)
    try:
        return table_from_ipc(data, table_kind(doc, kind))
    except ManifestError as exc:
        raise ManifestError(f"{storage.url(path)}: {exc}") from exc


def read_index_file(storage, xxh3: str, what: str, url: str, node_cache=None) -> bytes:
    """The verified bytes of ``index/<xxh3>.arrow`` (a side table or a v4 row-group chunk),
    through ``node_cache`` for remote data: named by its content hash, the node's copy is
    valid forever, so one process per node fetches it and the others read its copy."""
    path = check_table_path(f"{INDEX_DIR}/{xxh3}.arrow")
    require_regular_file(storage, path, error=ManifestError)

    def fetch() -> bytes:
        return storage.read_file(path, expected_xxh3=xxh3, what=what)

    try:
        if node_cache is not None and not getattr(storage, "local", False):
            return node_cache.get_or_fetch(xxh3, fetch)
        return fetch()
    except FileNotFoundError as exc:
        raise ManifestError(f"{url}: its {what} {path} is missing ({exc}); restore it or "
                            "re-convert") from exc


#: The side tables every reader loads with the manifest (provenance is fetched on first use).
READER_TABLES = ("shards", "row_groups")


# What a conversion leaves in its output before it writes the manifest (last): its shards and
# index, its lock, its staging folder (write/lock.py, write/staging.py; named here, not
# imported: the format does not depend on the writer).
_CONVERSION_SIGNS = ("shards", INDEX_DIR, ".zephon-staging", ".zephon-lock")


def missing_manifest_message(storage, url: str, exc: BaseException) -> str:
    """Why ``url`` (a dataset's ``manifest.json``) is not there, with the advice that fits:
    a bucket or folder that does not exist, or one that holds no dataset, is a wrong URL;
    only a root holding a conversion's shards, lock or staging folder is an unfinished
    conversion that ``zephon convert`` finishes. Called on the error path only: the extra
    listing costs nothing when the manifest is found."""
    root = storage.url("")
    if _no_such_bucket(exc):
        bucket = root.split("://", 1)[-1].split("/", 1)[0]
        return (f"{url} not found: the bucket {bucket!r} does not exist; check the dataset "
                "URL (and the endpoint in --storage-options)")
    try:
        if getattr(storage, "local", False) and not os.path.isdir(root):
            if os.path.exists(root):
                return (f"{url} not found: {root} is a file, not a dataset folder; check the "
                        "dataset path")
            return f"{url} not found: {root} does not exist; check the dataset path"
        names = {name.rsplit("/", 1)[-1] for name in storage.listdir("")}
    except (ZephonError, OSError):
        names = None
    if names is None:   # the root could not be listed: say both causes, as before
        return (f"{url} not found: not a zephon dataset, or its conversion has not finished "
                "(the manifest is written last); check the dataset URL, or run "
                "'zephon convert' again to finish it")
    signs = [name for name in _CONVERSION_SIGNS if name in names]
    if signs:
        return (f"{url} not found: the conversion has not finished (the manifest is written "
                f"last; {', '.join(signs)} {'is' if len(signs) == 1 else 'are'} there); run "
                "'zephon convert' again to finish it")
    if not names and not getattr(storage, "local", False):
        return f"{url} not found: nothing is stored under {root}; check the dataset URL"
    return (f"{url} not found: {root} is not a zephon dataset (no manifest.json, no shards); "
            "check the dataset path")


def _no_such_bucket(exc: BaseException | None) -> bool:
    """Whether ``exc`` or what it wraps is S3's NoSuchBucket (io/s3_get.py's S3NotFound and
    botocore carry the code; s3fs keeps only the message)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        response = getattr(exc, "response", None)
        error = response.get("Error") if isinstance(response, dict) else None
        if (isinstance(error, dict) and error.get("Code") == "NoSuchBucket") or (
                "specified bucket does not exist" in str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _read_manifest_doc(storage, url: str, node_cache) -> dict:
    """``manifest.json`` parsed: the node's recent copy when ``node_cache`` has one whose
    ``dataset_id`` is its content's hash, else one GET (published for the node's others).

    The process that fetches it also fetches the side tables into ``node_cache`` before
    the others stop waiting for the manifest: its S3 client is the one already warm, and no
    other process (one that read the manifest from the node's copy and has no client yet)
    takes a side table's lock and makes the node wait while it builds one."""
    def fetch() -> bytes:
        try:
            raw = storage.read_file(MANIFEST_NAME)
        except FileNotFoundError as exc:
            raise ManifestError(missing_manifest_message(storage, url, exc)) from exc
        if node_cache is not None:
            _warm_side_tables(storage, raw, url, node_cache)
        return raw

    if node_cache is None or getattr(storage, "local", False):
        return parse_manifest_json(fetch(), url)
    # Keyed by its URL alone, not the endpoint: the ranks of a node may reach one store
    # through different endpoints (proxies, one port per rank); a manifest names every other
    # object by its content hash, so a copy from another endpoint reads the same verified
    # bytes or fails with "not found", never other data.
    name = url
    raw, shared = node_cache.get_or_fetch_recent(name, fetch)
    if shared:
        # Another process's copy is used only if it is a manifest whose id is its hash;
        # anything else (a damaged file) is dropped and fetched again.
        try:
            doc = parse_manifest_json(raw, url)
            if doc.get("dataset_id") == compute_dataset_id(doc):
                return doc
        except ManifestError:
            pass
        node_cache.drop_recent(name)
        raw, _ = node_cache.get_or_fetch_recent(name, fetch)
    return parse_manifest_json(raw, url)


def _warm_side_tables(storage, raw: bytes, url: str, node_cache) -> None:
    """Fetch the reader's side tables of the manifest ``raw`` into ``node_cache``, side by
    side. Best effort: a manifest or table that fails here fails again, with its own error,
    when :func:`load_manifest` reads it (every byte is checked there as always)."""
    try:
        doc = parse_manifest_json(raw, url)
        check_version(doc, url)
        refs = [doc["tables"][kind] for kind in READER_TABLES]
        hashes = [check_table_path(ref["path"]).removeprefix(f"{INDEX_DIR}/")
                  .removesuffix(".arrow") for ref in refs]
        if any(h != ref.get("xxh3") for h, ref in zip(hashes, refs)):
            return
        with concurrent.futures.ThreadPoolExecutor(
                len(hashes), thread_name_prefix="zephon-index") as pool:
            for f in [pool.submit(read_index_file, storage, h, f"{kind} side table", url,
                                  node_cache) for h, kind in zip(hashes, READER_TABLES)]:
                f.result()
    except (ZephonError, OSError, KeyError, TypeError, ValueError, AttributeError):
        return


def load_manifest(storage, *, check: bool = True, node_cache=None) -> Manifest:
    """Load and validate ``manifest.json`` and its side tables through ``storage``.

    ``storage`` is a :class:`zephon_store.io.storage.Storage` (or anything with
    ``read_file(relpath, expected_xxh3=...)`` and ``url(relpath)``). Side tables are
    verified against the hash the manifest records before they are used.

    The fewest round trips: the manifest (one GET), then both side tables at once (one GET
    each, in parallel). ``node_cache`` (a :class:`~zephon_store.io.cache.ChunkCache` of a
    remote dataset) shares them among the node's processes: one fetches each object, the
    others wait for it and read its copy; the side tables by their hash (forever), the
    manifest for a minute (``ChunkCache.get_or_fetch_recent``; docs/storage.md, "The start").
    A v4 manifest's row-group chunks are fetched the same way, each when one of its row
    groups is first indexed (:class:`~zephon_store.format.chunks.ChunkedDetails`).
    """
    url = storage.url(MANIFEST_NAME)
    require_regular_file(storage, MANIFEST_NAME, error=ManifestError)
    doc = _read_manifest_doc(storage, url, node_cache)
    if check:
        check_version(doc, url)
    kinds = READER_TABLES
    if getattr(storage, "local", False):
        tables = {kind: load_side_table(storage, doc, kind, url) for kind in kinds}
    else:
        # Independent objects: fetched side by side, one round trip for both.
        with concurrent.futures.ThreadPoolExecutor(len(kinds),
                                                   thread_name_prefix="zephon-index") as pool:
            futures = {kind: pool.submit(load_side_table, storage, doc, kind, url, node_cache)
                       for kind in kinds}
            tables = {kind: f.result() for kind, f in futures.items()}
    m = Manifest(doc, tables, url=url,
                 loader=functools.partial(load_side_table, storage, doc, url=url,
                                          node_cache=node_cache),
                 read_chunk=functools.partial(read_index_file, storage, what="row-group chunk",
                                              url=url, node_cache=node_cache),
                 parallel=not getattr(storage, "local", False),
                 read_index=functools.partial(read_index_file, storage, url=url,
                                              node_cache=node_cache))
    if check:
        m.check()
    return m

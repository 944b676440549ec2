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
"""

from __future__ import annotations

import base64
import functools
import json
import posixpath
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrowutil import column_np
from .encoding import storage_encodings, storage_schema, to_logical
from .errors import ManifestError, UnsafePathError
from .hashing import DATASET_ID_PREFIX, HEX_RE, xxh3_hex

FORMAT_NAME = "zephon"
FORMAT_VERSION = 2
# Versions this library reads; it writes FORMAT_VERSION. v1 has no storage encodings.
READ_VERSIONS = (1, 2)
MANIFEST_NAME = "manifest.json"
SHARD_DIR = "shards"
INDEX_DIR = "index"
_TABLE_PATH_RE = re.compile(r"^index/[0-9a-f]{32}\.arrow$")
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


def shard_path(name: str) -> str:
    """Relative path of a shard, after checking its name is a bare hash.

    >>> shard_path("0" * 32)
    'shards/00000000000000000000000000000000.parquet'
    """
    if not isinstance(name, str) or not HEX_RE.match(name):
        raise UnsafePathError(
            f"manifest names shard {name!r}, which is not a 32-hex-digit xxh3 name; "
            "a manifest may only name files inside the dataset root as shards/<hash>.parquet")
    return f"{SHARD_DIR}/{name}.parquet"


def check_table_path(path: str) -> str:
    """Reject side-table paths outside ``index/<hash>.arrow``."""
    if not isinstance(path, str) or not _TABLE_PATH_RE.match(path) or posixpath.isabs(path):
        raise UnsafePathError(
            f"manifest names side table {path!r}; only index/<32 hex>.arrow inside the dataset "
            "root is allowed")
    return path


def schema_to_json(schema: pa.Schema) -> dict:
    """The manifest's ``schema`` object: the IPC bytes plus a readable field list."""
    return {
        "arrow_ipc_base64": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable}
                   for f in schema],
    }


def schema_from_json(obj: dict) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(obj["arrow_ipc_base64"])))


def table_to_ipc(table: pa.Table) -> bytes:
    """Serialise a side table as an uncompressed Arrow IPC file (memory-mappable)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=max(1, table.num_rows))
    return sink.getvalue().to_pybytes()


def table_from_ipc(data: bytes | pa.Buffer, kind: str) -> pa.Table:
    table = pa.ipc.open_file(pa.py_buffer(data) if isinstance(data, bytes) else data).read_all()
    want = TABLE_SCHEMAS[kind]
    if not table.schema.equals(want):
        raise ManifestError(f"side table {kind!r} has schema {table.schema}, expected {want}")
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

    >>> m = Manifest.from_parts(doc, tables)        # doctest: +SKIP
    >>> m.num_samples, m.num_shards, m.dataset_id   # doctest: +SKIP
    """

    def __init__(self, doc: dict, tables: dict[str, pa.Table], *, url: str = "<memory>",
                 loader=None) -> None:
        self.doc = doc
        self.url = url
        self._tables = dict(tables)
        self._loader = loader
        self.schema = schema_from_json(doc["schema"])
        # Column -> storage encoding; empty for v1 and for datasets without encoded columns.
        self.storage = dict(doc.get("storage") or {})
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
        self.rg_shard = column_np(rg.column("shard"))
        self.rg_rows = column_np(rg.column("rows"))
        self.rg_row_start = column_np(rg.column("row_start"))
        self.rg_offset = column_np(rg.column("offset"))
        self.rg_length = column_np(rg.column("length"))
        self._rg_xxh3 = rg.column("xxh3")

    @property
    def tables(self) -> dict[str, pa.Table]:
        """All side tables; provenance is fetched on first use (readers do not need it)."""
        for kind in TABLE_SCHEMAS:
            if kind not in self._tables and self._loader is not None:
                self._tables[kind] = self._loader(kind)
        return self._tables

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

    @property
    def total_bytes(self) -> int:
        return int(self.doc["totals"]["total_bytes"])

    def shard_name(self, shard: int) -> str:
        return self._shard_names[int(shard)].as_py()

    def shard_footer_xxh3(self, shard: int) -> str:
        return self._footer_xxh3[int(shard)].as_py().hex()

    def rg_xxh3(self, rg: int) -> str:
        return self._rg_xxh3[int(rg)].as_py().hex()

    def rg_local_index(self, rg: int) -> int:
        """Index of global row group ``rg`` inside its shard."""
        return int(rg - self.shard_first_rg[self.rg_shard[rg]])

    def shard_path(self, shard: int) -> str:
        return shard_path(self.shard_name(shard))

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

        >>> ds.manifest.to_logical(pf.read_row_group(0))   # doctest: +SKIP
        """
        if not self.storage:
            return table
        return to_logical(table, self.schema, self.storage)

    # -- validation ----------------------------------------------------------------------
    def check(self) -> None:
        """Structural checks that need no shard bytes; raise ManifestError on the first."""
        doc = self.doc
        if doc.get("format") != FORMAT_NAME:
            raise ManifestError(f"{self.url}: not a zephon manifest (format={doc.get('format')!r})")
        version = doc.get("format_version")
        if version not in READ_VERSIONS:
            raise ManifestError(
                f"{self.url}: format_version {version!r} is not supported by this zephon_store "
                f"(reads {', '.join(map(str, READ_VERSIONS))}); upgrade zephon_store")
        if version == 1 and "storage" in doc:
            raise ManifestError(f"{self.url}: a format_version 1 manifest cannot have 'storage' "
                                "(added in version 2); the manifest is corrupted, re-convert")
        if version >= 2 and not isinstance(doc.get("storage"), dict):
            raise ManifestError(f"{self.url}: format_version {version} manifest lacks its "
                                "'storage' object; the manifest is corrupted, re-convert")
        _ = self.storage_schema  # raises ManifestError if storage does not fit schema
        want = compute_dataset_id(doc)
        if doc.get("dataset_id") != want:
            raise ManifestError(
                f"{self.url}: dataset_id {doc.get('dataset_id')!r} does not match the manifest's "
                f"content ({want}); the manifest was edited or corrupted, re-convert or restore it")
        ok = pc.match_substring_regex(self._shard_names, HEX_RE.pattern)
        if len(ok) and not pc.all(ok, skip_nulls=False).as_py():
            bad = self._shard_names.filter(pc.invert(ok))[0].as_py()
            shard_path(bad)  # raises UnsafePathError with the offending name
        t = doc["totals"]
        n_sh, n_rg = len(self._shard_names), len(self.rg_rows)
        if t["num_shards"] != n_sh or t["num_row_groups"] != n_rg:
            raise ManifestError(f"{self.url}: totals say {t['num_shards']} shards/"
                                f"{t['num_row_groups']} row groups, side tables hold {n_sh}/{n_rg}")
        if int(self.rg_rows.sum()) != t["num_samples"] or int(self.shard_rows.sum()) != t["num_samples"]:
            raise ManifestError(f"{self.url}: row counts do not add up to num_samples={t['num_samples']}")
        if n_rg and (np.any(np.diff(self.rg_row_start) != self.rg_rows[:-1]) or self.rg_row_start[0] != 0):
            raise ManifestError(f"{self.url}: row-group row_start column is not the running sum of rows")
        if n_sh and (np.any(np.diff(self.shard_row_start) != self.shard_rows[:-1])
                     or self.shard_row_start[0] != 0):
            raise ManifestError(f"{self.url}: shard row_start column is not the running sum of rows")
        if n_sh and int(self.shard_bytes.sum()) != t["total_bytes"]:
            raise ManifestError(f"{self.url}: shard sizes do not add up to total_bytes")
        if np.any(self.rg_rows <= 0) or np.any(self.shard_rows <= 0):
            raise ManifestError(f"{self.url}: a shard or row group has no rows")

    # -- (de)serialisation --------------------------------------------------------------
    @staticmethod
    def build_doc(*, schema: pa.Schema, writer: dict, totals: dict, table_refs: dict,
                  inputs: dict, skipped: dict, created_by: dict, extra: dict | None = None) -> dict:
        doc = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "schema": schema_to_json(schema),
            # The shard writer derives the same encodings from the same schema and options.
            "storage": storage_encodings(schema, writer.get("fixed_size_lists", "binary")),
            "writer": writer,
            "totals": totals,
            "tables": table_refs,
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


def parse_manifest_json(data: bytes, url: str) -> dict:
    """Parse manifest bytes into a dict with a clear error on malformed JSON."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{url}: manifest is not valid JSON ({exc}); restore it or re-convert") from exc
    if not isinstance(doc, dict):
        raise ManifestError(f"{url}: manifest must be a JSON object")
    missing = [k for k in ("format", "format_version", "dataset_id", "schema", "writer", "totals",
                           "tables") if k not in doc]
    if missing:
        raise ManifestError(f"{url}: manifest lacks the keys {missing}; re-convert the dataset")
    return doc


def load_side_table(storage, doc: dict, kind: str, url: str) -> pa.Table:
    """Fetch one side table named by the manifest, verified against its hash."""
    ref = doc["tables"].get(kind)
    if ref is None:
        raise ManifestError(f"{url}: manifest names no {kind!r} side table")
    path = check_table_path(ref.get("path"))
    if path != f"{INDEX_DIR}/{ref.get('xxh3')}.arrow":
        raise UnsafePathError(f"{url}: side table {path} is not named by its hash {ref.get('xxh3')}")
    return table_from_ipc(storage.read_file(path, expected_xxh3=ref["xxh3"]), kind)


def load_manifest(storage, *, check: bool = True) -> Manifest:
    """Load and validate ``manifest.json`` and its side tables through ``storage``.

    ``storage`` is a :class:`zephon_store.storage.Storage` (or anything with
    ``read_file(relpath, expected_xxh3=...)`` and ``url(relpath)``). Side tables are
    verified against the hash the manifest records before they are used.
    """
    url = storage.url(MANIFEST_NAME)
    try:
        raw = storage.read_file(MANIFEST_NAME)
    except FileNotFoundError as exc:
        raise ManifestError(
            f"{url} not found: not a zephon dataset, or its conversion has not finished "
            "(the manifest is written last); run 'zephon convert' again to finish it") from exc
    doc = parse_manifest_json(raw, url)
    tables = {}
    for kind in ("shards", "row_groups"):
        tables[kind] = load_side_table(storage, doc, kind, url)
    m = Manifest(doc, tables, url=url,
                 loader=functools.partial(load_side_table, storage, doc, url=url))
    if check:
        m.check()
    return m

"""A synthetic format-v4 manifest of any number of row groups, built with numpy in a second.

For tests and benchmarks of the start at scale (issue 31): the manifest and its side
tables exactly as the writer lays them out (``write/publish.py``), over shards that do not
exist (opening a dataset and planning its first steps reads no shard byte). Converting 10^6
row groups would take an hour; this takes about a second.

>>> files = synthetic_files(3000, rows=100)
>>> sorted({rel.split("/")[0] for rel in files})
['index', 'manifest.json']
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from .._util.hashing import xxh3_hex
from ..format.chunks import ROW_GROUPS_PER_CHUNK, chunk_tables, index_table
from ..format.manifest import (
    INDEX_DIR,
    MANIFEST_NAME,
    SHARD_TABLE_SCHEMA,
    SIDE_TABLE_COMPRESSION,
    Manifest,
    table_to_ipc,
)

# A row group's stored bytes in the synthetic shards (1 MiB: the writer's default cut).
RG_BYTES = 1 << 20


def _blob(table: pa.Table, files: dict[str, bytes]) -> tuple[str, int]:
    data = table_to_ipc(table, compression=SIDE_TABLE_COMPRESSION)
    h = xxh3_hex(data)
    files[f"{INDEX_DIR}/{h}.arrow"] = data
    return h, len(data)


def synthetic_files(num_row_groups: int, *, rows: int | np.ndarray = 100,
                    per_shard: int = 256, per_chunk: int = ROW_GROUPS_PER_CHUNK,
                    seed: int = 0) -> dict[str, bytes]:
    """``{root-relative path: bytes}`` of a v4 dataset's manifest and side tables.

    ``rows``: every row group's row count (one for all, or one per row group); shards of
    ``per_shard`` row groups of :data:`RG_BYTES` each; row-group hashes random (``seed``).
    """
    n = int(num_row_groups)
    counts = np.broadcast_to(np.asarray(rows, dtype=np.int64), (n,)).copy()
    shards = -(-n // per_shard)
    nrg = np.full(shards, per_shard, dtype=np.int64)
    nrg[-1] = n - per_shard * (shards - 1)
    first = np.concatenate([[0], np.cumsum(nrg)[:-1]]).astype(np.int64)
    rg_shard = np.repeat(np.arange(shards), nrg)
    offset = 4 + (np.arange(n) - first[rg_shard]) * RG_BYTES
    length = np.full(n, RG_BYTES, dtype=np.int64)
    digests = np.random.default_rng(seed).integers(0, 256, (n, 16), dtype=np.uint8)
    files: dict[str, bytes] = {}
    refs = [(bytes.fromhex(h), size) for h, size in
            (_blob(t, files) for t in chunk_tables(offset, length, digests, per_chunk))]
    index = index_table(counts, length, refs, per_chunk)
    row_start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    footer = 4 + nrg * RG_BYTES
    shard_rows = np.add.reduceat(counts, first)
    sh = pa.table([[f"{i:032x}" for i in range(shards)], footer + 100, shard_rows,
                   row_start[first], first, nrg, footer,
                   pa.array([b"\0" * 16] * shards, pa.binary(16))], schema=SHARD_TABLE_SCHEMA)
    prov = pa.table({"input": ["synthetic"], "input_bytes": [1], "input_row_start": [0],
                     "num_rows": [int(counts.sum())], "shard": [0], "row_start": [0]})
    table_refs = {}
    for kind, table in (("shards", sh), ("row_groups", index), ("provenance", prov)):
        h, size = _blob(table, files)
        table_refs[kind] = {"path": f"{INDEX_DIR}/{h}.arrow", "xxh3": h, "bytes": size,
                            "rows": table.num_rows}
    doc = Manifest.build_doc(
        schema=pa.schema([("x", pa.int64())]), writer={"row_group_rows": None},
        table_refs=table_refs, inputs={}, skipped={}, created_by={},
        totals={"num_samples": int(counts.sum()), "num_shards": shards,
                "num_row_groups": n, "total_bytes": int((footer + 100).sum())},
        row_groups_per_chunk=per_chunk)
    files[MANIFEST_NAME] = Manifest(doc, {"shards": sh, "row_groups": index}).to_json()
    return files


def write_synthetic(root: str, num_row_groups: int, **kw) -> dict[str, bytes]:
    """:func:`synthetic_files` written under the local folder ``root``; returns them."""
    files = synthetic_files(num_row_groups, **kw)
    os.makedirs(os.path.join(root, INDEX_DIR), exist_ok=True)
    for rel, data in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return files

"""Raw pyarrow: the limit every other system is measured against.

One Parquet file written by ``pq.write_table`` (zstd level 3, Zephon's default codec, row
groups of ~1 MiB of Arrow data like Zephon's default), read back with plain pyarrow. No
manifest, no hashing, no order, no checkpoint: what is left when all of that is free.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from .common import BATCH, SEED

WINDOW = 2049


def _read_input(kind: str, inp: str):
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    if kind == "tokens":
        return pq.read_table(os.path.join(inp, "tokens.parquet"))
    ro = pj.ReadOptions(block_size=64 << 20)
    return pa.concat_tables(pj.read_json(os.path.join(inp, p), read_options=ro)
                            for p in sorted(os.listdir(inp)))


def convert(kind: str, inp: str, out: str, workers: int = 1) -> None:
    import pyarrow.parquet as pq

    table = _read_input(kind, inp)
    rows = max(1, int((1 << 20) * table.num_rows / max(1, table.nbytes)))
    os.makedirs(out, exist_ok=True)
    pq.write_table(table, os.path.join(out, "data.parquet"), compression="zstd",
                   compression_level=3, row_group_size=rows)


def _file(path: str) -> str:
    return os.path.join(path, "data.parquet")


def decode(kind: str, rb) -> dict:
    """A record batch (or table) as the benchmark's batch: lists of str, or a 2-D array."""
    if kind == "text":
        return {"path": rb.column("path").to_pylist(), "text": rb.column("text").to_pylist()}
    col = rb.column("tokens")
    if hasattr(col, "combine_chunks"):
        col = col.combine_chunks()
    return {"tokens": col.flatten().to_numpy().reshape(-1, WINDOW)}


def batches(kind: str, pf, row_groups=None):
    """Decoded batches of B rows, one row group at a time (a batch never spans two).

    ``read_row_group`` + slices, not ``iter_batches(batch_size=B)``: the same speed on text,
    and iter_batches re-assembles a nested column (token windows) per small batch.
    """
    b = BATCH[kind]
    for rg in range(pf.num_row_groups) if row_groups is None else row_groups:
        t = pf.read_row_group(rg)
        for off in range(0, t.num_rows, b):
            yield decode(kind, t.slice(off, b))


def read(kind: str, path: str, *, shuffle: bool) -> int:
    import pyarrow.parquet as pq

    b, n = BATCH[kind], 0
    if not shuffle:
        for d in batches(kind, pq.ParquetFile(_file(path))):
            n += len(d[kind])
        return n
    # The in-memory limit of a full shuffle: the whole table in RAM, one take per batch.
    table = pq.read_table(_file(path)).combine_chunks()
    perm = np.random.default_rng(SEED).permutation(table.num_rows)
    for i in range(0, len(perm), b):
        n += len(decode(kind, table.take(perm[i:i + b]))[kind])
    return n


def random_access(kind: str, path: str):
    """``get(i)`` on the table held in memory (the limit: no I/O, no decompression)."""
    import pyarrow.parquet as pq

    table = pq.read_table(_file(path)).combine_chunks()
    if kind == "text":
        return lambda i: table.slice(i, 1).to_pylist()[0]
    return lambda i: {"tokens": table.column(0).chunk(0)[i].values.to_numpy()}


def resume_state(kind: str, path: str, cursor: int, *, shuffle: bool = True) -> dict:
    return {"cursor": cursor}


def resume(kind: str, path: str, state: dict, *, shuffle: bool = True):
    """Sequential resume: find the row group holding the cursor, read B rows from it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def open_():
        return pq.ParquetFile(_file(path))

    def first(pf):
        md, cur, b = pf.metadata, state["cursor"], BATCH[kind]
        starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
        rg = int(np.searchsorted(starts, cur, side="right")) - 1
        tables, have = [], 0
        while have < b and rg < md.num_row_groups:
            t = pf.read_row_group(rg)
            lo = cur - int(starts[rg]) if not tables else 0
            t = t.slice(lo, b - have)
            tables.append(t)
            have += t.num_rows
            rg += 1
        return decode(kind, pa.concat_tables(tables))
    return open_, first


class _Batches:
    """A torch IterableDataset over row groups, split between DataLoader workers."""

    def __init__(self, kind: str, file: str) -> None:
        self.kind, self.file = kind, file

    def __iter__(self):
        import pyarrow.parquet as pq
        import torch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        pf = pq.ParquetFile(self.file)
        for d in batches(self.kind, pf, range(wid, pf.num_row_groups, nw)):
            if self.kind == "tokens":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")   # Arrow memory is read-only
                    d["tokens"] = torch.from_numpy(d["tokens"])
            yield d


def dataloader(kind: str, path: str, workers: int):
    from torch.utils.data import DataLoader, IterableDataset

    ds = type("PqBatches", (_Batches, IterableDataset), {})(kind, _file(path))
    return DataLoader(ds, batch_size=None, num_workers=workers)


def s3_read(kind: str, url: str, so: dict, cache_dir: str) -> int:
    """pyarrow's own S3 client (no cache): one sequential pass."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    host = so["endpoint_url"].split("://", 1)[1]
    fs = pafs.S3FileSystem(access_key=so["key"], secret_key=so["secret"],
                           endpoint_override=host, scheme="http", region="us-east-1")
    n = 0
    with fs.open_input_file(url.removeprefix("s3://") + "/data.parquet") as f:
        for d in batches(kind, pq.ParquetFile(f, pre_buffer=True)):
            n += len(d[kind])
    return n

"""Raw pyarrow: the limit every other system is measured against.

Conversion is the fastest raw writer of the same data (issue 43): the corpus is read into
one Arrow table in the layout Zephon's default writes for it *before* the clock starts
(:func:`prepare_convert`; format v5, ``formats/SPEC.md`` 3.1: token windows as
``fixed_size_binary`` in byte planes, made with numpy), then the clock times one
``pq.write_table`` with Zephon's codecs (3.2: text at zstd level 6, the planes at LZ4,
Parquet's LZ4_RAW), no dictionary, row groups of ~1 MiB of Arrow data. No parsing, byte
planes, manifest, hashing or staging: what is left when all of that is free. The file is read back with plain pyarrow (token planes undone
with numpy, as any reader of that layout must). ``benchmarks/bench_convert.py`` checks
that this file and Zephon's shards hold the same codecs and physical types.
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


#: Zephon's default codecs for these corpora (``compression="auto"``, format v5).
TEXT_LEVEL = 6


def prepare_convert(kind: str, inp: str):
    """The input as one Arrow table in memory, token windows already in byte planes: what
    the raw writer starts from (untimed)."""
    import pyarrow as pa

    table = _read_input(kind, inp).combine_chunks()
    if kind == "tokens":
        table = pa.table({"tokens": _byte_planes(table.column("tokens").chunk(0))})
    return table


def _byte_planes(col) -> object:
    """Fixed-size lists of int32 as ``fixed_size_binary`` whose bytes are in planes: plane
    ``k`` of a row holds byte ``k`` of each of its elements (``formats/SPEC.md`` 3.1)."""
    import pyarrow as pa

    n, rows = col.type.list_size, len(col)
    values = col.values.slice(col.offset * n, rows * n).to_numpy()
    planes = values.view(np.uint8).reshape(rows, n, 4).transpose(0, 2, 1).copy()
    return pa.Array.from_buffers(pa.binary(n * 4), rows, [None, pa.py_buffer(planes)])


def _from_planes(col):
    """The inverse of :func:`_byte_planes`: a 2-D int32 array of the windows."""
    rows = len(col)
    data = np.frombuffer(col.buffers()[1], np.uint8, rows * WINDOW * 4, col.offset * WINDOW * 4)
    return data.reshape(rows, 4, WINDOW).transpose(0, 2, 1).copy().view(np.int32).reshape(
        rows, WINDOW)


def convert(kind: str, inp: str, out: str, workers: int = 1, prepared=None) -> None:
    """Write ``prepared`` (else the input, read now) with Zephon's default codecs."""
    import pyarrow.parquet as pq

    table = prepared if prepared is not None else prepare_convert(kind, inp)
    rows = max(1, int((1 << 20) * table.num_rows / max(1, table.nbytes)))
    if kind == "tokens":
        codec = {"compression": "lz4"}
    else:
        codec = {"compression": "zstd", "compression_level": TEXT_LEVEL}
    os.makedirs(out, exist_ok=True)
    pq.write_table(table, os.path.join(out, "data.parquet"), row_group_size=rows,
                   use_dictionary=False, **codec)


def _file(path: str) -> str:
    return os.path.join(path, "data.parquet")


def decode(kind: str, rb) -> dict:
    """A record batch (or table) as the benchmark's batch: lists of str, or a 2-D array."""
    if kind == "text":
        return {"path": rb.column("path").to_pylist(), "text": rb.column("text").to_pylist()}
    import pyarrow as pa

    col = rb.column("tokens")
    if hasattr(col, "combine_chunks"):
        col = col.combine_chunks()
    if col.type.equals(pa.binary(WINDOW * 4)):   # byte planes
        return {"tokens": _from_planes(col)}
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
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(_file(path)).combine_chunks()
    if kind == "text":
        return lambda i: table.slice(i, 1).to_pylist()[0]
    col = table.column(0).chunk(0)
    if col.type.equals(pa.binary(WINDOW * 4)):   # byte planes
        return lambda i: {"tokens": _from_planes(col.slice(i, 1))[0]}
    return lambda i: {"tokens": col[i].values.to_numpy()}


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

"""MosaicML Streaming: ``MDSWriter`` (zstd shards), ``StreamingDataset``, ``StreamingDataLoader``.

Local reads use ``StreamingDataset(local=dir)`` with no remote. A zstd shard is decompressed
to a raw ``.mds`` beside it on first use and kept (no remote, so ``keep_zip`` is implied);
``prepare`` does that once, untimed, so every timed run reads raw shards as a warm cache
would. Each process clears stale shared memory first (a killed run leaves /dev/shm names).
"""

from __future__ import annotations

import os

from .common import BATCH, import_streaming

WINDOW = 2049
COLUMNS = {"text": {"path": "str", "text": "str"},
           "tokens": {"tokens": f"ndarray:int32:{WINDOW}"}}


def _records(kind: str, inp: str):
    """The input's records as dicts, read with pyarrow (the fastest reader for every peer)."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    if kind == "text":
        ro = pj.ReadOptions(block_size=64 << 20)
        for p in sorted(os.listdir(inp)):
            yield from pj.read_json(os.path.join(inp, p), read_options=ro).to_pylist()
        return
    for rb in pq.ParquetFile(os.path.join(inp, "tokens.parquet")).iter_batches(1024):
        arr = rb.column(0).flatten().to_numpy().reshape(-1, WINDOW)
        for row in arr:
            yield {"tokens": row}


def convert(kind: str, inp: str, out: str, workers: int = 1) -> None:
    from streaming.base import MDSWriter

    import_streaming()
    with MDSWriter(out=out, columns=COLUMNS[kind], compression="zstd") as w:
        for rec in _records(kind, inp):
            w.write(rec)


def _dataset(path: str, kind: str, *, shuffle: bool = False, **kw):
    streaming = import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return streaming.StreamingDataset(local=path, batch_size=BATCH[kind], shuffle=shuffle, **kw)


def prepare(kind: str, path: str) -> None:
    for _ in _dataset(path, kind):
        pass


def read(kind: str, path: str, *, shuffle: bool) -> int:
    n = 0
    for _ in _dataset(path, kind, shuffle=shuffle):
        n += 1
    return n


def random_access(kind: str, path: str):
    ds = _dataset(path, kind)
    return lambda i: ds[i]


def resume_state(kind: str, path: str, cursor: int, *, shuffle: bool = True) -> dict:
    # What StreamingDataLoader.state_dict() returns after `cursor` samples in epoch 0.
    return _dataset(path, kind, shuffle=shuffle).state_dict(cursor, True)


def resume(kind: str, path: str, state: dict, *, shuffle: bool = True):
    streaming = import_streaming()

    def open_():
        return streaming.StreamingDataLoader(_dataset(path, kind, shuffle=shuffle),
                                             batch_size=BATCH[kind], num_workers=0)

    def first(dl):
        dl.load_state_dict(state)
        return next(iter(dl))
    return open_, first


def dataloader(kind: str, path: str, workers: int):
    streaming = import_streaming()
    return streaming.StreamingDataLoader(_dataset(path, kind), batch_size=BATCH[kind],
                                         num_workers=workers)


def s3_read(kind: str, url: str, so: dict, cache_dir: str) -> int:
    """``remote=s3://…`` through boto3, endpoint from ``S3_ENDPOINT_URL``."""
    os.environ["S3_ENDPOINT_URL"] = so["endpoint_url"]
    os.environ["AWS_ACCESS_KEY_ID"] = so["key"]
    os.environ["AWS_SECRET_ACCESS_KEY"] = so["secret"]
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    streaming = import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = streaming.StreamingDataset(remote=url, local=cache_dir, batch_size=BATCH[kind])
    n = 0
    for _ in ds:
        n += 1
    return n

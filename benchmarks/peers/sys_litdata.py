"""LitData: ``optimize`` (64 MB chunks, its default: no compression), ``StreamingDataset``,
``StreamingDataLoader``. ``optimize`` runs its worker(s) as forked processes."""

from __future__ import annotations

import os

from .common import BATCH, SEED

WINDOW = 2049


# Module level, so litdata's worker process can call them.
def _text_file(path: str):
    import pyarrow.json as pj

    yield from pj.read_json(path, read_options=pj.ReadOptions(block_size=64 << 20)).to_pylist()


def _token_group(task: tuple[str, int]):
    import pyarrow.parquet as pq

    path, rg = task
    col = pq.ParquetFile(path).read_row_group(rg).column(0).combine_chunks()
    for row in col.flatten().to_numpy().reshape(-1, WINDOW):
        yield {"tokens": row}


def convert(kind: str, inp: str, out: str, workers: int = 1) -> None:
    import pyarrow.parquet as pq
    from litdata import optimize

    if kind == "text":
        fn, inputs = _text_file, sorted(os.path.join(inp, p) for p in os.listdir(inp))
    else:
        path = os.path.join(inp, "tokens.parquet")
        fn, inputs = _token_group, [(path, g) for g in range(pq.ParquetFile(path).num_row_groups)]
    optimize(fn, inputs, out, chunk_bytes="64MB", num_workers=workers, reorder_files=False,
             keep_data_ordered=True, verbose=False, start_method="fork")


def _dataset(path: str, *, shuffle: bool = False, **kw):
    from litdata import StreamingDataset

    return StreamingDataset(path, shuffle=shuffle, seed=SEED, **kw)


def read(kind: str, path: str, *, shuffle: bool) -> int:
    n = 0
    for _ in _dataset(path, shuffle=shuffle):
        n += 1
    return n


def random_access(kind: str, path: str):
    ds = _dataset(path)
    return lambda i: ds[i]


def _loader(path: str, kind: str, *, shuffle: bool, workers: int = 0):
    from litdata import StreamingDataLoader

    return StreamingDataLoader(_dataset(path, shuffle=shuffle), batch_size=BATCH[kind],
                               num_workers=workers)


def resume_state(kind: str, path: str, cursor: int, *, shuffle: bool = True) -> dict:
    """LitData's state of a loader that consumed ``cursor`` samples (at 0: one that has not
    started, whose ``state_dict()`` says 0 samples yielded)."""
    dl = _loader(path, kind, shuffle=shuffle)
    n = 0
    if cursor > 0:
        for b in dl:
            n += len(b[kind])
            if n >= cursor:
                break
    return dl.state_dict()


def resume(kind: str, path: str, state: dict, *, shuffle: bool = True):
    def open_():
        return _loader(path, kind, shuffle=shuffle)

    def first(dl):
        dl.load_state_dict(state)
        return next(iter(dl))
    return open_, first


def dataloader(kind: str, path: str, workers: int):
    return _loader(path, kind, shuffle=False, workers=workers)


def s3_read(kind: str, url: str, so: dict, cache_dir: str) -> int:
    """``StreamingDataset("s3://…", storage_options={"endpoint_url": …})`` (boto3 client)."""
    # LitData downloads chunks with obstore, built from its boto3 client's endpoint but
    # without obstore's allow_http, so every GET from an http:// endpoint fails ("builder
    # error: BadScheme"; AWS_ALLOW_HTTP is not read there). Adding the one client option
    # is the smallest change that lets it talk to the local server.
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS,
                                          "allow_http": True}
    opts = {"endpoint_url": so["endpoint_url"], "aws_access_key_id": so["key"],
            "aws_secret_access_key": so["secret"], "region_name": "us-east-1"}
    n = 0
    for _ in _dataset(url, cache_dir=cache_dir, storage_options=opts):
        n += 1
    return n

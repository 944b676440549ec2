"""HF datasets: ``Dataset.from_json`` / ``from_parquet`` + ``save_to_disk``, read back with
``load_from_disk`` (memory-mapped Arrow IPC). Token windows use the numpy format, so a
sample is an ``int32`` array as with the other systems (the default format would build a
Python list of 2049 ints per window)."""

from __future__ import annotations

import itertools
import os
import shutil

from .common import BATCH, SEED


def _quiet():
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def convert(kind: str, inp: str, out: str, workers: int = 1) -> None:
    datasets = _quiet()
    cache = out + ".hfcache"   # from_* writes an Arrow cache first; save_to_disk copies it
    try:
        if kind == "text":
            files = sorted(os.path.join(inp, p) for p in os.listdir(inp))
            ds = datasets.Dataset.from_json(files, cache_dir=cache)
        else:
            ds = datasets.Dataset.from_parquet(os.path.join(inp, "tokens.parquet"),
                                               cache_dir=cache)
        ds.save_to_disk(out)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _open(kind: str, path: str):
    datasets = _quiet()
    ds = datasets.load_from_disk(path)
    return ds.with_format("numpy") if kind == "tokens" else ds


def read(kind: str, path: str, *, shuffle: bool) -> int:
    """``Dataset.iter(batch_size=B)``; shuffled: ``.shuffle(seed)`` (an indices mapping)."""
    ds = _open(kind, path)
    if shuffle:
        ds = ds.shuffle(seed=SEED)
    n = 0
    for b in ds.iter(batch_size=BATCH[kind]):
        n += len(b[kind])
    return n


def random_access(kind: str, path: str):
    ds = _open(kind, path)
    return lambda i: ds[i]


def resume_state(kind: str, path: str, cursor: int, *, shuffle: bool = True) -> dict:
    """``IterableDataset.state_dict()`` after ``cursor`` examples (its resumable path)."""
    ids = _open(kind, path).to_iterable_dataset()
    for _ in itertools.islice(ids, cursor):
        pass
    return ids.state_dict()


def resume(kind: str, path: str, state: dict, *, shuffle: bool = True):
    def open_():
        return _open(kind, path).to_iterable_dataset()

    def first(ids):
        ids.load_state_dict(state)
        return list(itertools.islice(iter(ids), BATCH[kind]))
    return open_, first


def dataloader(kind: str, path: str, workers: int):
    """Map-style dataset in a torch DataLoader (``__getitems__`` fetches a batch at once)."""
    from torch.utils.data import DataLoader

    return DataLoader(_open(kind, path), batch_size=BATCH[kind], num_workers=workers)


def s3_read(kind: str, url: str, so: dict, cache_dir: str) -> int:
    """``load_dataset("parquet", data_files=s3://…, streaming=True, storage_options=…)`` over
    the raw pyarrow Parquet file (HF streams Parquet/JSONL; ``save_to_disk`` output is not
    streamable, ``load_from_disk("s3://…")`` downloads it whole first)."""
    datasets = _quiet()
    ids = datasets.load_dataset("parquet", data_files=url + "/data.parquet", split="train",
                                streaming=True, storage_options=so, cache_dir=cache_dir)
    if kind == "tokens":
        ids = ids.with_format("numpy")
    n = 0
    for b in ids.iter(batch_size=BATCH[kind]):
        n += len(b[kind])
    return n

"""Zephon: ``zephon_store.convert``, ``open_dataset`` and ``ZephonLoader``, default options."""

from __future__ import annotations

from .common import BATCH, SEED


def convert(kind: str, inp: str, out: str, workers: int = 1,
            compression: str | None = None) -> dict:
    """``compression``: a named codec (``WriteOptions(compression=...)``) instead of the
    default; ab.py's ``--compression``. Returns the phases' wall seconds and the seconds of
    each kind of work (``ConvertResult.stages``, ``work_seconds``; absent before issue 43)."""
    from zephon_store import WriteOptions
    from zephon_store import convert as zconvert

    options = None if compression is None else WriteOptions(compression=compression)
    r = zconvert([inp], out, workers=workers, progress=False, options=options)
    return {"stages": r.stages, "work": getattr(r, "work_seconds", {})}


def _loader(path: str, kind: str, *, shuffle: bool, workers: int = 0, collate=True,
            source=None):
    """One rank, one epoch; ``collate`` False: numpy batches (``as_numpy``); ``source``: a
    ``SourceOptions`` (storage options, cache) or None."""
    from zephon_store import BatchOptions, StopOptions, Topology, WorkerOptions, as_numpy
    from zephon_store.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    return ZephonLoader(path, topology=Topology(BATCH[kind], world_size=1, rank=0),
                        order=OrderOptions(seed=SEED, shuffle=shuffle),
                        workers=WorkerOptions(num_workers=workers),
                        stop=StopOptions(epochs=1.0), source=source,
                        batch=None if collate else BatchOptions(collate=as_numpy))


def read(kind: str, path: str, *, shuffle: bool) -> int:
    """The loader's own batches as numpy/lists (``BatchOptions(collate=as_numpy)``), thread
    path."""
    n = 0
    for b in _loader(path, kind, shuffle=shuffle, collate=False):
        n += len(b[kind])
    return n


def random_access(kind: str, path: str):
    from zephon_store import open_dataset

    ds = open_dataset(path)
    return lambda i: ds[i]


def random_access_take(kind: str, path: str):
    """``take([i])`` decoded the way the loader does (tokens: a numpy view, not a list)."""
    from zephon_store import open_dataset
    try:
        from zephon_store._util.to_numpy import table_to_numpy
    except ImportError:   # a checkout from before the rename (ab's "before")
        from zephon_store._util.decode import decode_table as table_to_numpy

    ds = open_dataset(path)
    return lambda i: table_to_numpy(ds.take([i]))


def resume_state(kind: str, path: str, cursor: int, *, shuffle: bool = True) -> dict:
    return {"cursor": cursor}   # a Zephon checkpoint is the cursor (plus fixed identity keys)


def resume(kind: str, path: str, state: dict, *, shuffle: bool = True):
    from zephon_store import Topology, open_dataset
    from zephon_store.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    def open_():
        ds = open_dataset(path)
        return ZephonLoader(ds, topology=Topology(BATCH[kind], world_size=1, rank=0),
                            order=OrderOptions(seed=SEED, shuffle=shuffle))

    def first(loader):
        loader.load_state_dict(dict(loader.state_dict(), cursor=state["cursor"]))
        it = iter(loader)
        b = next(it)
        it.close()
        return b
    return open_, first


def dataloader(kind: str, path: str, workers: int):
    return _loader(path, kind, shuffle=False, workers=workers)


def s3_read(kind: str, url: str, so: dict, cache_dir: str) -> int:
    from zephon_store import SourceOptions

    n = 0
    for b in _loader(url, kind, shuffle=False, collate=False,
                     source=SourceOptions(storage_options=so, cache=cache_dir)):
        n += len(b[kind])
    return n

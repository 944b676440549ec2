"""One grid measurement in a fresh process; prints one JSON line. Run by ``__main__``.

``convert``: ``zephon_store.convert`` of the corpus with the cell's ``WriteOptions`` (JSON),
one worker; seconds and the process's peak RSS (VmHWM, imports included).
``pyarrow``: the raw-pyarrow baseline of the same input (``pq.write_table``, zstd at Arrow's
default level, ~1 MiB row groups; no hashing, no manifest).
``reads``: on a converted dataset, in this order: full passes (sequential and shuffled,
per-rank batch 8 and 256; the loader's thread path, ``BatchOptions(collate=as_numpy)``), resume
at 0/50/99 % (a fresh loader each time: ``load_state_dict`` then the first batch, wall and CPU
milliseconds; the first resume of the process is reported apart as cold), ``ds[i]`` for random
``i`` (after a warm-up pass over the same indices), and the bytes a cold remote reader's first
batch fetches (computed from the manifest: ``manifest.json``, its side tables and the row
groups the first batch's ids fall in, default shuffled order at cursor 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from ..peers.common import SEED, vm_kb
from . import codecs

READ_BATCHES = (8, 256)
RESUME_AT = (0, 50, 99)
RESUME_REPS = 4
RANDOM_GETS = 300


def cpu() -> float:
    """CPU seconds of this process (every thread; ``process_time``, ns resolution) and its
    finished children (user + system): on a shared machine far steadier than wall time,
    which waits for other jobs' turns on the cores."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def _convert(a) -> dict:
    from zephon_store import WriteOptions, convert

    opts = WriteOptions(**json.loads(a.options))
    t0, c0 = time.perf_counter(), cpu()
    convert([a.inp], a.out, options=opts, workers=1, progress=False)
    return {"seconds": time.perf_counter() - t0, "cpu_s": cpu() - c0}


def _pyarrow(a) -> dict:
    import pyarrow.parquet as pq

    from ..peers.sys_pyarrow import _read_input

    t0, c0 = time.perf_counter(), cpu()
    table = _read_input("tokens" if a.kind == "tokens" else "text", a.inp)
    rows = max(1, int((1 << 20) * table.num_rows / max(1, table.nbytes)))
    os.makedirs(a.out, exist_ok=True)
    pq.write_table(table, os.path.join(a.out, "data.parquet"), compression="zstd",
                   row_group_size=rows)
    return {"seconds": time.perf_counter() - t0, "cpu_s": cpu() - c0}


def _loader(path, global_batch, *, shuffle, **groups):
    """One rank's ZephonLoader; ``groups``: its option groups (``stop=``, ``batch=``...)."""
    from zephon_store import Topology
    from zephon_store.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    return ZephonLoader(path, topology=Topology(global_batch, world_size=1, rank=0),
                        order=OrderOptions(seed=SEED, shuffle=shuffle), **groups)


def _column(kind: str) -> str:
    return "tokens" if kind == "tokens" else "text"


def _passes(a, out: dict) -> None:
    from zephon_store import BatchOptions, StopOptions, WorkerOptions, as_numpy

    col = _column(a.kind)
    for batch in READ_BATCHES:
        for shuffle in (False, True):
            t0, c0 = time.perf_counter(), cpu()
            loader = _loader(a.out, batch, shuffle=shuffle,
                             workers=WorkerOptions(num_workers=0), stop=StopOptions(epochs=1.0),
                             batch=BatchOptions(collate=as_numpy))
            n = sum(len(b[col]) for b in loader)
            key = f"{'shuf' if shuffle else 'seq'}_b{batch}"
            out[key + "_s"] = time.perf_counter() - t0
            out[key + "_cpu_s"] = cpu() - c0
            out["samples"] = n


def _resumes(a, ds, out: dict) -> None:
    n, batch = ds.num_samples, a.resume_batch
    for pct in RESUME_AT:
        cursor = min(n * pct // 100 // batch * batch, (n // batch - 1) * batch)
        firsts, cpus = [], []
        for _ in range(RESUME_REPS):
            loader = _loader(ds, batch, shuffle=True)
            t0, c0 = time.perf_counter(), cpu()
            loader.load_state_dict(dict(loader.state_dict(), cursor=cursor))
            it = iter(loader)
            b = next(it)
            firsts.append((time.perf_counter() - t0) * 1e3)
            cpus.append((cpu() - c0) * 1e3)
            it.close()
            if len(b[_column(a.kind)]) != batch:
                raise RuntimeError(f"resume at {cursor}: a batch of {len(b)}, not {batch}")
        out[f"resume{pct}_cold_ms"] = firsts[0]
        out[f"resume{pct}_ms"] = statistics.median(firsts[1:])
        # CPU of every thread: on a shared host the wall waits for cores, this does not.
        out[f"resume{pct}_cpu_ms"] = statistics.median(cpus[1:])


def _random(ds, out: dict) -> None:
    import numpy as np

    idx = np.random.default_rng(1).integers(0, ds.num_samples, RANDOM_GETS).tolist()
    for i in idx:
        ds[i]
    lat = []
    for i in idx:
        t0 = time.perf_counter_ns()
        ds[i]
        lat.append(time.perf_counter_ns() - t0)
    out["get_p50_us"] = sorted(lat)[len(lat) // 2] / 1e3


def first_batch_bytes(ds, batch: int) -> dict:
    """Bytes a cold remote reader fetches for its first batch (default order, cursor 0):
    ``manifest.json`` and its side tables (what a start reads; docs/storage.md, "The
    start"), plus every row group the batch's ids fall in. Computed, not fetched."""
    import numpy as np

    from zephon_store.load.stream import make_order
    from zephon_store.order import OrderOptions

    order = make_order(ds, OrderOptions(seed=SEED))
    ids = order.sample_at(np.arange(batch, dtype=np.int64))
    rgs = np.unique(ds.locate(ids).row_group)
    m = ds.manifest
    root = ds.url if "://" not in ds.url else None
    meta = sum(os.path.getsize(os.path.join(dirpath, f))
               for dirpath, _, files in os.walk(root) for f in files
               if not dirpath.endswith("shards")) if root else 0
    return {"first_batch_row_groups": int(rgs.size),
            "first_batch_rg_bytes": int(m.rg_length[rgs].sum()),
            "first_batch_meta_bytes": int(meta)}


def _reads(a) -> dict:
    from zephon_store import open_dataset

    out: dict = {}
    _passes(a, out)
    ds = open_dataset(a.out)
    _resumes(a, ds, out)
    _random(ds, out)
    out.update(first_batch_bytes(ds, a.resume_batch))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", required=True, choices=("convert", "pyarrow", "reads", "codecs"))
    ap.add_argument("--kind", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--inp")
    ap.add_argument("--options", default="{}")
    ap.add_argument("--resume-batch", type=int, default=256)
    a = ap.parse_args()
    import pyarrow as pa
    import pyarrow.parquet  # noqa: F401

    pa.array([1]).to_numpy()   # imports pandas: an import, not work
    if a.what == "reads":
        import zephon_store.torch  # noqa: F401
    else:
        import zephon_store.write.convert  # noqa: F401
    out = {"convert": _convert, "pyarrow": _pyarrow, "reads": _reads,
           "codecs": lambda a: codecs.measure(a.kind, a.inp)}[a.what](a)
    out["peak_rss_mb"] = round(vm_kb("VmHWM") / 1024, 1)
    print(json.dumps(out), flush=True)
    os._exit(0)   # skip teardown with loader threads alive: no part of the measurement


if __name__ == "__main__":
    main()

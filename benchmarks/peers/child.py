"""One measurement in a fresh process; prints one JSON line. Run by ``run.py``, not by hand.

Every timing starts after the imports (torch alone takes 1-2 s) and ends when the last
sample has been handed over. ``peak_rss_mb`` is this process's VmHWM (DataLoader worker
processes are not included); ``rss_start_mb`` is VmRSS after the imports, before the work.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pickle
import statistics
import time

from .common import BATCH, ZEPHONS, count, import_streaming, vm_kb

RANDOM_ACCESSES = 1000
RESUME_REPS = 4   # the first is the process's first resume ("cold"), the rest are warm


def _preimport(system: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet  # noqa: F401
    import torch  # noqa: F401

    # pyarrow's first to_numpy() imports pandas (~0.25 s here): an import, not work.
    pa.array([1]).to_numpy()

    if system in ZEPHONS or system in ("zephoncache", "zephonarrow"):
        import zephon_store.load.stream  # noqa: F401
        import zephon_store.torch  # noqa: F401
    elif system == "mosaic":
        import_streaming()
    elif system == "litdata":
        import litdata  # noqa: F401
    elif system == "hf":
        import datasets  # noqa: F401


def _loop(it, kind: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    first = None
    for b in it:
        n += count(b, kind)
        if first is None:
            first = time.perf_counter() - t0
    return n, first or 0.0


def measure(a) -> dict:
    mod = importlib.import_module(f"benchmarks.peers.sys_{a.system}")
    kind, path = a.kind, a.path
    if a.metric == "convert":
        extra = {"compression": a.compression} if a.compression else {}
        if hasattr(mod, "prepare_convert"):   # raw pyarrow starts from the table in memory
            extra["prepared"] = mod.prepare_convert(kind, a.inp)
        t0 = time.perf_counter()
        details = mod.convert(kind, a.inp, path, workers=a.workers, **extra)
        # Zephon returns where its time went (stage walls and work seconds).
        return {"seconds": time.perf_counter() - t0, **(details or {})}
    if a.metric == "prepare":
        if hasattr(mod, "prepare"):
            mod.prepare(kind, path)
        return {}
    if a.metric in ("read_seq", "read_shuffled"):
        t0 = time.perf_counter()
        n = mod.read(kind, path, shuffle=a.metric == "read_shuffled")
        return {"seconds": time.perf_counter() - t0, "samples": n}
    if a.metric in ("random", "random_take"):
        import numpy as np

        t0 = time.perf_counter()
        get = (mod.random_access_take if a.metric == "random_take" else mod.random_access)(
            kind, path)
        t_open = time.perf_counter() - t0
        idx = np.random.default_rng(1).integers(0, a.num_samples, RANDOM_ACCESSES).tolist()
        t0 = time.perf_counter()
        for i in idx:            # the warm-up pass: every index once, untimed per access
            get(i)
        t_warm = time.perf_counter() - t0
        lat = []
        for i in idx:
            t0 = time.perf_counter_ns()
            get(i)
            lat.append(time.perf_counter_ns() - t0)
        lat.sort()
        return {"p50_us": lat[len(lat) // 2] / 1e3, "p99_us": lat[int(len(lat) * 0.99)] / 1e3,
                "mean_us": sum(lat) / len(lat) / 1e3, "open_s": t_open,
                "warmup_pass_s": t_warm, "accesses": len(lat)}
    if a.metric == "resume_state":
        state = mod.resume_state(kind, path, a.cursor, shuffle=not a.seq)
        with open(a.state, "wb") as f:
            pickle.dump(state, f)
        return {}
    if a.metric == "resume":
        with open(a.state, "rb") as f:
            state = pickle.load(f)
        opens, firsts = [], []
        for _ in range(RESUME_REPS):
            open_, first = mod.resume(kind, path, state, shuffle=not a.seq)
            t0 = time.perf_counter()
            obj = open_()
            t1 = time.perf_counter()
            b = first(obj)
            t2 = time.perf_counter()
            n = len(b) if isinstance(b, list) else count(b, kind)
            if n != a.batch:
                raise RuntimeError(f"first batch after resume has {n} samples, not {a.batch}")
            opens.append((t1 - t0) * 1e3)
            firsts.append((t2 - t1) * 1e3)
            del obj, b
        return {"cold_open_ms": opens[0], "cold_first_ms": firsts[0],
                "warm_open_ms": statistics.median(opens[1:]),
                "warm_first_ms": statistics.median(firsts[1:])}
    if a.metric in ("loader_w0", "loader_w2"):
        t0 = time.perf_counter()
        loader = mod.dataloader(kind, path, workers=int(a.metric[-1]))
        n, first = _loop(loader, kind)
        return {"seconds": time.perf_counter() - t0, "samples": n, "first_batch_s": first}
    if a.metric == "s3_seq":
        so = json.loads(a.s3)
        t0 = time.perf_counter()
        n = mod.s3_read(kind, path, so, a.cache_dir)
        return {"seconds": time.perf_counter() - t0, "samples": n}
    raise ValueError(f"unknown metric {a.metric!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("system", "metric", "kind", "path"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--inp")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--compression", help="Zephon convert: a named codec instead of the default")
    ap.add_argument("--num-samples", type=int, default=0)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--cursor", type=int, default=0)
    ap.add_argument("--state")
    ap.add_argument("--seq", type=int, default=0, help="resume: a sequential run's checkpoint")
    ap.add_argument("--s3")
    ap.add_argument("--cache-dir")
    a = ap.parse_args()
    if a.batch:
        BATCH[a.kind] = a.batch   # every system reads its batch size from this dict
    _preimport(a.system)
    rss0 = vm_kb("VmRSS")
    c0 = time.process_time() + sum(os.times()[2:4])
    out = measure(a)
    # CPU seconds of the measurement (this process's threads and its finished children):
    # steadier than wall time on a shared machine (benchmarks/format reads it).
    out["cpu_s"] = time.process_time() + sum(os.times()[2:4]) - c0
    out.update(peak_rss_mb=round(vm_kb("VmHWM") / 1024, 1), rss_start_mb=round(rss0 / 1024, 1))
    print(json.dumps(out), flush=True)
    # Skip interpreter teardown: with pyarrow, torch and the peers' threads alive it
    # sometimes aborts after the result is printed, which is no part of what is measured.
    os._exit(0)


if __name__ == "__main__":
    main()

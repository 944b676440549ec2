#!/usr/bin/env python3
"""Benchmark: loader throughput (samples/s, MB/s) and resume latency, against baselines.

For each corpus of ``benchmarks/corpora.py`` (text: stdlib sources; tokens: int32 windows
of 2049), every case runs one full epoch in a fresh subprocess, ``--runs`` times, the cases
interleaved round-robin so background load hits them alike; median/min/max are reported.
All data is local and in the page cache (read once before the first run).

- ``raw_rows``: the naive per-sample loop: open each Zephon shard with pyarrow, read it row
  group by row group, ``manifest.to_logical`` (format v2 stores token windows as fixed-size
  binary), ``to_pylist()`` and hand out one row at a time (tokens as
  ``np.array(row["tokens"], int32)``);
- ``arrow_scan``: pyarrow's columnar scan of the same shards (``iter_batches`` +
  ``manifest.to_logical``), decode only: the upper bound for any Parquet reader;
  ``arrow_scan_decoded`` also turns each batch into what Zephon hands out (strings -> Python
  lists, token windows -> a 2-D numpy view);
- ``litdata_seq`` / ``litdata_shuffle``: ``StreamingDataLoader(StreamingDataset(...),
  batch_size=B, num_workers=0)`` over the LitData copy (raw chunks), shuffle off / on;
  ``litdata_workers2``: the same with 2 worker processes (shuffle off);
- ``zephon_seq``: ``ZephonLoader`` sequential (``OrderOptions(shuffle=False)``), thread path
  (``WorkerOptions(num_workers=0, prefetch=4)``); ``zephon_shuffled``: default order options;
  ``zephon_workers2``: sequential with ``WorkerOptions(num_workers=2)`` process workers;
  ``zephon_seq_raw``: ``zephon_seq`` over a copy written with
  ``WriteOptions(compression="none", use_dictionary=False)`` (what decoding costs).

Batch: 256 samples (text), 32 windows (tokens). MB/s counts payload bytes (UTF-8 of path +
text; 4 bytes per token). Timings start after imports, at dataset/loader construction.

Resume: in one subprocess per corpus, for cursors at 0, 50% and 99% of the epoch (rounded
down to a step), ``--resume-reps`` times each: open the dataset (a fresh decode cache; the
page cache is warm), build a ``ZephonLoader`` (default shuffled order), then time
``load_state_dict(state)`` + ``next(iter(loader))``. Median over the reps.

    python -m benchmarks.bench_loader --quick --json      # 60 MB corpora
    python -m benchmarks.bench_loader --mb 300 --runs 3   # the full run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from . import corpora
from .harness import run_child

BATCH = {"text": 256, "tokens": 32}
CASES = ["raw_rows", "arrow_scan", "arrow_scan_decoded", "litdata_seq", "litdata_shuffle",
         "litdata_workers2", "zephon_seq", "zephon_shuffled", "zephon_workers2", "zephon_seq_raw"]
RESUME_FRACTIONS = (0.0, 0.5, 0.99)


# ----------------------------------------------------------------------------- children
# Each returns (samples consumed, seconds, seconds to the first batch).


def _count(batch, kind: str) -> int:
    if kind == "text":
        return len(batch["text"])
    return int(batch["tokens"].shape[0])


def case_raw_rows(corpus: dict, kind: str, batch: int):
    import numpy as np
    import pyarrow.parquet as pq

    paths = corpora.shard_paths(corpus)
    to_logical = corpora.logical(corpus)
    t0 = time.perf_counter()
    first = None
    n = 0
    for path in paths:
        pf = pq.ParquetFile(path)
        for rg in range(pf.num_row_groups):
            for row in to_logical(pf.read_row_group(rg)).to_pylist():
                if kind == "tokens":
                    row = {"tokens": np.array(row["tokens"], dtype=np.int32)}
                n += 1
                if first is None:
                    first = time.perf_counter() - t0
    return n, time.perf_counter() - t0, first


def case_arrow_scan(corpus: dict, kind: str, batch: int, *, decode: bool = False):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        from zephon_store._util.to_numpy import table_to_numpy
    except ImportError:   # a checkout from before the rename (ab's "before")
        from zephon_store._util.decode import decode_table as table_to_numpy

    paths = corpora.shard_paths(corpus)
    to_logical = corpora.logical(corpus)
    t0 = time.perf_counter()
    first = None
    n = 0
    for path in paths:
        pf = pq.ParquetFile(path)
        for rb in pf.iter_batches(batch_size=batch):
            # Format v2 stores token windows as fixed-size binary: back to the logical
            # fixed-size list (a zero-copy view) before anything reads the values.
            t = to_logical(pa.Table.from_batches([rb]))
            if decode:
                table_to_numpy(t)
            n += rb.num_rows
            if first is None:
                first = time.perf_counter() - t0
    return n, time.perf_counter() - t0, first


def case_litdata(corpus: dict, kind: str, batch: int, *, shuffle: bool, workers: int):
    from litdata import StreamingDataLoader, StreamingDataset

    t0 = time.perf_counter()
    ds = StreamingDataset(os.path.join(corpus["dir"], "litdata"), shuffle=shuffle, seed=0)
    dl = StreamingDataLoader(ds, batch_size=batch, num_workers=workers)
    return _drain(dl, kind, t0)


def case_zephon(corpus: dict, kind: str, batch: int, *, shuffle: bool, workers: int,
                sub: str = "zephon"):
    from zephon_store import StopOptions, Topology, WorkerOptions
    from zephon_store.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    order = OrderOptions(seed=0) if shuffle else OrderOptions(seed=0, shuffle=False)
    t0 = time.perf_counter()
    loader = ZephonLoader(os.path.join(corpus["dir"], sub),
                          topology=Topology(batch, world_size=1, rank=0), order=order,
                          workers=WorkerOptions(num_workers=workers, prefetch=4),
                          stop=StopOptions(epochs=1.0))
    return _drain(loader, kind, t0)


def _drain(batches, kind: str, t0: float):
    """(samples, seconds, seconds to the first batch) of iterating ``batches`` from ``t0``."""
    first = None
    n = 0
    for b in batches:
        n += _count(b, kind)
        if first is None:
            first = time.perf_counter() - t0
    return n, time.perf_counter() - t0, first


def run_case(case: str, corpus: dict, kind: str, batch: int):
    if case == "raw_rows":
        return case_raw_rows(corpus, kind, batch)
    if case == "arrow_scan":
        return case_arrow_scan(corpus, kind, batch)
    if case == "arrow_scan_decoded":
        return case_arrow_scan(corpus, kind, batch, decode=True)
    if case == "litdata_seq":
        return case_litdata(corpus, kind, batch, shuffle=False, workers=0)
    if case == "litdata_shuffle":
        return case_litdata(corpus, kind, batch, shuffle=True, workers=0)
    if case == "litdata_workers2":
        return case_litdata(corpus, kind, batch, shuffle=False, workers=2)
    if case == "zephon_seq":
        return case_zephon(corpus, kind, batch, shuffle=False, workers=0)
    if case == "zephon_shuffled":
        return case_zephon(corpus, kind, batch, shuffle=True, workers=0)
    if case == "zephon_workers2":
        return case_zephon(corpus, kind, batch, shuffle=False, workers=2)
    if case == "zephon_seq_raw":
        return case_zephon(corpus, kind, batch, shuffle=False, workers=0, sub="zephon-raw")
    raise ValueError(f"unknown case {case!r}")


def resume_child(corpus: dict, kind: str, batch: int, reps: int) -> dict:
    from zephon_store.order import OrderOptions

    path = os.path.join(corpus["dir"], "zephon")
    n = corpus["num_samples"]
    out = {}
    for name, order in (("shuffled", OrderOptions(seed=0)),
                        ("sequential", OrderOptions(seed=0, shuffle=False))):
        out[name] = _resume_order(path, n, kind, batch, reps, order)
    return out


def _resume_order(path: str, n: int, kind: str, batch: int, reps: int, order) -> dict:
    from zephon_store import Topology
    from zephon_store.read.dataset import open_dataset
    from zephon_store.torch import ZephonLoader

    out = {}
    for frac in RESUME_FRACTIONS:
        cursor = int(frac * n) // batch * batch
        times, opens, loads = [], [], []
        for _ in range(reps + 1):  # the first rep warms imports and code paths; dropped
            t0 = time.perf_counter()
            ds = open_dataset(path)
            loader = ZephonLoader(ds, topology=Topology(batch, world_size=1, rank=0),
                                  order=order)
            t_open = time.perf_counter() - t0
            state = dict(loader.state_dict(), cursor=cursor)
            t0 = time.perf_counter()
            loader.load_state_dict(state)
            t_load = time.perf_counter() - t0
            it = iter(loader)
            b = next(it)
            t_first = time.perf_counter() - t0
            it.close()
            ds.close()
            assert _count(b, kind) == batch
            times.append(t_first)
            opens.append(t_open)
            loads.append(t_load)
        times, opens, loads = times[1:], opens[1:], loads[1:]
        out[f"{frac:g}"] = {"cursor": cursor,
                            "first_batch_ms_median": round(statistics.median(times) * 1e3, 2),
                            "first_batch_ms_min": round(min(times) * 1e3, 2),
                            "first_batch_ms_max": round(max(times) * 1e3, 2),
                            "load_state_dict_ms_median": round(statistics.median(loads) * 1e3, 3),
                            "open_dataset_and_loader_ms_median": round(
                                statistics.median(opens) * 1e3, 2)}
    return out


def child_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True)
    ap.add_argument("--kind", required=True)
    ap.add_argument("--mb", type=int, required=True)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    corpus = corpora.ensure(a.kind, a.mb)
    batch = BATCH[a.kind]
    # Import what the case uses before the clock starts (torch alone is ~1-2 s).
    import pyarrow.parquet  # noqa: F401
    import torch  # noqa: F401

    if a.child.startswith("litdata"):
        import litdata  # noqa: F401
    if a.child.startswith("zephon") or a.child == "resume":
        import zephon_store.torch  # noqa: F401
    if a.child == "resume":
        print(json.dumps(resume_child(corpus, a.kind, batch, a.reps)), flush=True)
        return
    n, secs, first = run_case(a.child, corpus, a.kind, batch)
    print(json.dumps({"samples": n, "seconds": secs, "first_batch_s": first}), flush=True)


# ----------------------------------------------------------------------------- parent


def _spawn(args: list[str], timeout: float = 1800) -> dict:
    # The child reads with $ZEPHON_BENCH_PKG's zephon_store when set (corpora.PKG_ROOT).
    return run_child("bench_loader", *args, pkg=corpora.PKG_ROOT, timeout=timeout,
                     env=dict(os.environ, LITDATA_DISABLE_VERSION_CHECK="1"))


def bench_corpus(kind: str, mb: int, runs: int, cases: list[str], resume_reps: int,
                 log) -> dict:
    corpus = corpora.ensure(kind, mb, log=log)
    if "zephon_seq_raw" in cases:
        corpora.ensure_raw(corpus)
    corpora.warm_page_cache(corpus)
    n, payload = corpus["num_samples"], corpus["payload_bytes"]
    raw: dict[str, list[dict]] = {c: [] for c in cases}
    for r in range(runs):
        for case in cases:
            res = _spawn(["--child", case, "--kind", kind, "--mb", str(mb)])
            raw[case].append(res)
            log(f"  {kind} run {r} {case}: {res['samples']} samples in {res['seconds']:.3f} s")
    rows = {}
    for case, results in raw.items():
        secs = [x["seconds"] for x in results]
        samples = results[0]["samples"]
        med = statistics.median(secs)
        rows[case] = {"median_s": round(med, 3), "min_s": round(min(secs), 3),
                      "max_s": round(max(secs), 3), "samples": samples,
                      "samples_per_s": round(samples / med, 1),
                      "MB_per_s": round(payload * samples / n / med / 1e6, 1),
                      "first_batch_ms_median": round(statistics.median(
                          x["first_batch_s"] for x in results) * 1e3, 1)}

    def ratio(a: str, b: str) -> float | None:
        if a in rows and b in rows:
            return round(rows[a]["samples_per_s"] / rows[b]["samples_per_s"], 3)
        return None

    ratios = {"zephon_seq/litdata_seq": ratio("zephon_seq", "litdata_seq"),
              "zephon_shuffled/litdata_shuffle": ratio("zephon_shuffled", "litdata_shuffle"),
              "zephon_shuffled/zephon_seq": ratio("zephon_shuffled", "zephon_seq"),
              "zephon_threads/zephon_workers2": ratio("zephon_seq", "zephon_workers2"),
              "zephon_seq/raw_rows": ratio("zephon_seq", "raw_rows"),
              "zephon_seq/arrow_scan": ratio("zephon_seq", "arrow_scan"),
              "zephon_seq/arrow_scan_decoded": ratio("zephon_seq", "arrow_scan_decoded"),
              "zephon_seq_raw/litdata_seq": ratio("zephon_seq_raw", "litdata_seq"),
              "litdata_workers2/litdata_seq": ratio("litdata_workers2", "litdata_seq")}
    out = {"corpus": {k: v for k, v in corpus.items() if k != "dir"},
           "batch": BATCH[kind], "runs": runs, "cases": rows,
           "ratios": {k: v for k, v in ratios.items() if v is not None}}
    if resume_reps:
        res = _spawn(["--child", "resume", "--kind", kind, "--mb", str(mb),
                      "--reps", str(resume_reps)])
        out["resume"] = {"reps": resume_reps}
        for name, cursors in res.items():
            firsts = [v["first_batch_ms_median"] for v in cursors.values()]
            out["resume"][name] = {"cursors": cursors,
                                   "max_over_min": round(max(firsts) / min(firsts), 2)}
            log(f"  {kind} resume ({name}): {firsts} ms")
    out["targets"] = {
        "zephon_seq/litdata_seq >= 1.0": _verdict(ratios["zephon_seq/litdata_seq"], 1.0),
        "zephon_shuffled/zephon_seq >= 0.9": _verdict(ratios["zephon_shuffled/zephon_seq"], 0.9),
    }
    if resume_reps:
        for name in ("shuffled", "sequential"):
            cursors = out["resume"][name]["cursors"].values()
            worst = max(v["first_batch_ms_median"] for v in cursors)
            out["targets"][f"resume first batch < 15 ms, {name} (worst cursor)"] = (
                "met" if worst < 15 else f"missed ({worst} ms)")
            seek = max(v["load_state_dict_ms_median"] for v in cursors)
            out["targets"][f"resume seek (load_state_dict) < 15 ms, {name}"] = (
                "met" if seek < 15 else f"missed ({seek} ms)")
    return out


def _verdict(value: float | None, target: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value >= target else f"missed ({value})"


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        child_main(argv)
        # Skip interpreter teardown: with pyarrow, torch and litdata threads alive it
        # sometimes aborts ("terminate called without an active exception", seen with both
        # loaders) after the result is printed, which is no part of what is measured.
        os._exit(0)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=corpora.DEFAULT_MB)
    ap.add_argument("--quick", action="store_true",
                    help=f"--mb {corpora.QUICK_MB} (about 3 minutes on 2 cores)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--resume-reps", type=int, default=5)
    ap.add_argument("--corpus", choices=["text", "tokens", "all"], default="all")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated subset of " + ",".join(CASES))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    mb = corpora.QUICK_MB if a.quick else a.mb
    cases = [c for c in a.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}")

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    kinds = ["text", "tokens"] if a.corpus == "all" else [a.corpus]
    t0 = time.perf_counter()
    results = {"mb": mb, **{k: bench_corpus(k, mb, a.runs, cases, a.resume_reps, log)
                            for k in kinds}}
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(results, indent=None if a.json else 1))
    return results


if __name__ == "__main__":
    main()

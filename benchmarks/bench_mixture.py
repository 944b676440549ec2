#!/usr/bin/env python3
"""Benchmark: a 3-source mixture against one dataset of the same data; resume at 10**12.

The corpus of ``benchmarks/corpora.py`` (``--kind``, ``--mb``) is the single dataset. Its
rows, cut into three contiguous thirds, are converted (default ``WriteOptions``, as the
corpus) into three source datasets, cached beside it under ``mixture/``. The mixture reads
them with weights proportional to their sizes, in two stages (the second from sample
5 * 10**11, so a resume at 10**12 lands in a later stage with every source many epochs in).

- Throughput: ``single`` is ``ZephonLoader`` over the corpus, default shuffled order,
  ``--epochs`` epochs (``epochs * N // B`` steps, timed from loader construction, imports
  excluded); ``mixture`` is ``ZephonLoader`` over the mixture for the same number of steps.
  Also reported: the rate after the first batch (the reading rate, without construction and
  the first step's decodes, which a mixture pays once per source). Each run is a fresh subprocess, the two cases interleaved round-robin
  ``--runs`` times (background load hits both alike); median/min/max of samples/s, and the
  ratio of the medians.
- Resume: in one subprocess per case, ``--resume-reps`` times: build the loader, then time
  ``load_state_dict(state)`` + ``next(iter(loader))`` for the state at cursor 0 and at
  cursor 10**12 (the state the loader itself wrote, with the cursor set). Median per cursor.

Batch: 32 windows (tokens) or 256 documents (text), ``num_workers=0``. All data is local and
read once before the first timed run (page cache warm).

    python -m benchmarks.bench_mixture --kind tokens --mb 100 --runs 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from . import corpora
from .harness import run_child

BATCH = {"text": 256, "tokens": 32}
SEED = 7
FAR = 10**12
SECOND_STAGE = 5 * 10**11


def build_sources(corpus: dict) -> list[str]:
    """The corpus rows in three contiguous thirds, each converted to its own dataset."""
    import pyarrow.parquet as pq

    from zephon_store import convert, open_dataset

    root = os.path.join(corpus["dir"], "mixture")
    urls = [os.path.join(root, f"source{k}") for k in range(3)]
    if all(os.path.exists(os.path.join(u, "manifest.json")) for u in urls):
        return urls
    ds = open_dataset(os.path.join(corpus["dir"], "zephon"))
    n = ds.num_samples
    for k, url in enumerate(urls):
        lo, hi = k * n // 3, (k + 1) * n // 3
        inp = os.path.join(root, f"input{k}")
        os.makedirs(inp, exist_ok=True)
        pq.write_table(ds.take(range(lo, hi)), os.path.join(inp, "part.parquet"))
        convert([inp], url, workers=1, progress=False)
    return urls


def mixture(urls: list[str]) -> dict:
    from zephon_store import open_dataset

    sizes = [open_dataset(u).num_samples for u in urls]
    total = sum(sizes)
    w = [f"{s}/{total}" for s in sizes]
    late = ["1/2", "1/4", "1/4"]
    return {"stages": [{"name": "main", "start": {"samples": 0}},
                       {"name": "late", "start": {"samples": SECOND_STAGE}}],
            "sources": [{"name": f"s{k}", "url": u, "weights": [w[k], late[k]]}
                        for k, u in enumerate(urls)]}


def _loader(case: str, corpus: dict, mix: dict, batch: int, steps: int | None):
    from zephon_store import BatchOptions, StopOptions, Topology, as_numpy
    from zephon_store.order.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    data = os.path.join(corpus["dir"], "zephon") if case == "single" else mix
    return ZephonLoader(data, topology=Topology(batch, world_size=1, rank=0),
                        order=OrderOptions(seed=SEED), stop=StopOptions(max_steps=steps),
                        batch=BatchOptions(collate=as_numpy))


def child_throughput(case: str, corpus: dict, mix: dict, batch: int, epochs: int) -> dict:
    import zephon_store.torch  # noqa: F401  (imports are not timed; construction is)

    steps = epochs * corpus["num_samples"] // batch
    t0 = time.perf_counter()
    n, first = 0, None
    for b in _loader(case, corpus, mix, batch, steps):
        n += len(next(iter(b.values())))
        if first is None:
            first = time.perf_counter() - t0
    dt = time.perf_counter() - t0
    return {"samples": n, "seconds": dt, "first_batch_s": first,
            "steady_samples_s": (n - batch) / (dt - first)}


def child_resume(case: str, corpus: dict, mix: dict, batch: int, reps: int) -> dict:
    out = {}
    for cursor in (0, FAR):
        times = []
        for _ in range(reps):
            loader = _loader(case, corpus, mix, batch, None)
            state = loader.state_dict()
            state["cursor"] = cursor
            state.pop("step", None)
            t0 = time.perf_counter()
            loader.load_state_dict(state)
            next(iter(loader))
            times.append(time.perf_counter() - t0)
            loader.dataset.close()
        out[str(cursor)] = statistics.median(times)
    return out


def _child(args) -> None:
    corpus = corpora.ensure(args.kind, args.mb, log=lambda *a: None)
    mix = mixture(build_sources(corpus))
    batch = BATCH[args.kind]
    if args.child == "resume":
        res = {c: child_resume(c, corpus, mix, batch, args.resume_reps)
               for c in ("single", "mixture")}
    else:
        res = child_throughput(args.child, corpus, mix, batch, args.epochs)
    print(json.dumps(res))


def _run_child(args, what: str) -> dict:
    return run_child("bench_mixture", "--kind", args.kind, "--mb", str(args.mb),
                     "--resume-reps", str(args.resume_reps), "--epochs", str(args.epochs),
                     "--child", what)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=["text", "tokens"], default="tokens")
    ap.add_argument("--mb", type=int, default=corpora.QUICK_MB)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--resume-reps", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3, help="epochs of the corpus per run")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    corpus = corpora.ensure(args.kind, args.mb)
    urls = build_sources(corpus)
    for d in [os.path.join(corpus["dir"], "zephon"), *urls]:   # warm the page cache
        for dirpath, _, files in os.walk(d):
            for f in files:
                with open(os.path.join(dirpath, f), "rb") as fh:
                    while fh.read(1 << 24):
                        pass
    rates: dict[str, list[float]] = {"single": [], "mixture": []}
    firsts: dict[str, list[float]] = {"single": [], "mixture": []}
    steady: dict[str, list[float]] = {"single": [], "mixture": []}
    for _ in range(args.runs):
        for case in rates:
            r = _run_child(args, case)
            rates[case].append(r["samples"] / r["seconds"])
            firsts[case].append(r["first_batch_s"])
            steady[case].append(r["steady_samples_s"])
    resume = _run_child(args, "resume")
    per_sample = corpus["payload_bytes"] / corpus["num_samples"]
    out = {"kind": args.kind, "mb": args.mb, "num_samples": corpus["num_samples"],
           "batch": BATCH[args.kind], "runs": args.runs, "epochs": args.epochs,
           "throughput": {c: {"median_samples_s": round(statistics.median(v), 1),
                              "min": round(min(v), 1), "max": round(max(v), 1),
                              "median_MB_s": round(statistics.median(v) * per_sample / 1e6, 1),
                              "median_first_batch_s": round(statistics.median(firsts[c]), 4),
                              "median_after_first_batch_samples_s": round(
                                  statistics.median(steady[c]), 1)}
                          for c, v in rates.items()},
           "mixture_vs_single": round(statistics.median(rates["mixture"])
                                      / statistics.median(rates["single"]), 3),
           "mixture_vs_single_after_first_batch": round(
               statistics.median(steady["mixture"]) / statistics.median(steady["single"]), 3),
           "resume_first_batch_s": {c: {k: round(v, 4) for k, v in r.items()}
                                    for c, r in resume.items()}}
    out["resume_far_vs_zero"] = {c: round(r[str(FAR)] / r["0"], 2) for c, r in resume.items()}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for c, t in out["throughput"].items():
        print(f"{c:8s} {t['median_samples_s']:>10.1f} samples/s ({t['median_MB_s']} MB/s; "
              f"min {t['min']}, max {t['max']})")
    print(f"mixture / single: {out['mixture_vs_single']}")
    for c, r in out["resume_first_batch_s"].items():
        print(f"resume {c}: cursor 0 {r['0']:.4f} s, cursor 1e12 {r[str(FAR)]:.4f} s")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The node-local decoded cache against no cache and LitData, first epoch and later ones.

Reads the peers benchmark's 300 MB corpora as ``python -m benchmarks.peers.run`` converts them
(run that first, or ``run.py --metrics read_seq`` to make the formats), each measurement
in a fresh ``child.py`` process, the cases interleaved in every run:

- ``litdata``: LitData's ``StreamingDataset`` over its raw chunks (its fastest path);
- ``zephon``: the default zstd shards, no decoded cache (what every first pass costs today);
- ``cache cold``: the same shards through an empty ``DecodedDiskCache`` (a first epoch
  with the cache on: every row group decoded and written);
- ``cache warm``: through the cache the cold child filled (every later epoch, and every
  other rank of the node once one has read a row group).

Every input, including the cache folder, is read once right before each child (this VM's
DAMON ``pageout`` evicts page cache idle for seconds; ``run.warm``)::

    .venv-bench/bin/python -m benchmarks.bench_decoded_cache --runs 5

``resume`` is the peers benchmark's: a fresh dataset and loader, ``load_state_dict`` at 50%
of the data in the default (shuffled) order, the first batch, in ms (median of the warm
repetitions in the child). Prints a Markdown table of medians (min-max) and the per-run
ratios against LitData (as "times LitData's speed" for every row, resume included); JSON
to ``.bench/decoded_cache.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

from .harness import ROOT
from .peers import corpus as corpus_mod
from .peers.common import BATCH, BENCH, SMALL_BATCH
from .peers.run import log, spawn, warm

CASES = ("litdata", "zephon", "cache cold", "cache warm")
METRICS = ("read_seq", "read_shuffled", "read_seq_b8", "read_shuffled_b8", "resume")


def _one(case: str, metric: str, kind: str, meta: dict, cache_dir: str, timeout: float) -> dict:
    fmt = os.path.join(meta["dir"], "formats")
    m, batch = metric, BATCH[kind]
    if metric.endswith("_b8"):
        m, batch = metric.removesuffix("_b8"), SMALL_BATCH
    system = {"litdata": "litdata", "zephon": "zephon"}.get(case, "zephoncache")
    path = os.path.join(fmt, "litdata" if case == "litdata" else "zephon")
    os.environ.pop("ZEPHON_DECODED_CACHE_DIR", None)
    if case == "cache cold":
        shutil.rmtree(cache_dir, ignore_errors=True)
    if system == "zephoncache":
        os.environ["ZEPHON_DECODED_CACHE_DIR"] = cache_dir
        os.environ["ZEPHON_DECODED_CACHE_BUDGET"] = "8GiB"
    warm(path, *([cache_dir] if case == "cache warm" else []))
    extra = {}
    if metric == "resume":   # a checkpoint at 50% (a Zephon state is the cursor), untimed
        extra["state"] = os.path.join(meta["dir"], "work", f"decoded-{case}-state.pkl")
        res = spawn("litdata" if case == "litdata" else "zephon", "resume_state", kind, path,
                    timeout, cursor=meta["num_samples"] // 2 // batch * batch, seq=0, **extra)
        if "error" in res:
            return res
    res = spawn(system, m, kind, path, timeout, num_samples=meta["num_samples"], batch=batch,
                **extra)
    os.environ.pop("ZEPHON_DECODED_CACHE_DIR", None)
    return res


_RANK = r"""
import sys, time
from zephon_store import BatchOptions, StopOptions, Topology, as_numpy
from zephon_store.order import OrderOptions
from zephon_store.torch import ZephonLoader
path, kind, batch, world, rank, start = sys.argv[1:7]
loader = ZephonLoader(path, topology=Topology(int(batch) * int(world), int(world), int(rank),
                                              ranks_per_node=int(world)),
                      batch=BatchOptions(collate=as_numpy), stop=StopOptions(epochs=1.0),
                      order=OrderOptions(seed=0, shuffle=True))
time.sleep(max(0.0, float(start) - time.time()))
n = sum(len(b[kind]) for b in loader)
print(n, time.time())
"""


def node_epoch(case: str, kind: str, meta: dict, cache_dir: str, ranks: int) -> float:
    """Seconds from a common start until every rank of one node has read its share of a
    shuffled epoch (``ranks`` processes on this host, batch BATCH[kind] each)."""
    import subprocess
    import time

    path = os.path.join(meta["dir"], "formats", "zephon")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEPHON_DECODED")}
    if case == "cache cold":
        shutil.rmtree(cache_dir, ignore_errors=True)
    if case != "zephon":
        env.update(ZEPHON_DECODED_CACHE_DIR=cache_dir, ZEPHON_DECODED_CACHE_BUDGET="8GiB")
    warm(path, *([cache_dir] if case == "cache warm" else []))
    env["PYTHONPATH"] = ROOT
    start = time.time() + 6.0     # after every rank's imports
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, path, kind, str(BATCH[kind]),
                               str(ranks), str(r), str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for r in range(ranks)]
    ends = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"{kind} {case}: a rank failed (exit {p.returncode})")
        ends.append(float(out.split()[1]))
    return max(ends) - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kinds", default="text,tokens")
    ap.add_argument("--metrics", default=",".join(METRICS))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--node-ranks", type=int, default=0,
                    help="instead: one shuffled epoch read by this many ranks of one node")
    ap.add_argument("--json", action="store_true", help="end with the results as one JSON line")
    a = ap.parse_args()
    results: dict = {}
    if a.node_ranks:
        print(f"| corpus | {a.node_ranks} ranks, shuffled epoch | zephon | cache cold | "
              "cache warm | cold / zephon |")
        print("|---|---|---|---|---|---|")
        for kind in a.kinds.split(","):
            meta = corpus_mod.ensure(kind, a.mb, log=log)
            cache_dir = os.path.join(meta["dir"], "work", "decoded-cache")
            secs: dict = {c: [] for c in CASES[1:]}
            for r in range(a.runs):
                for case in secs:
                    secs[case].append(node_epoch(case, kind, meta, cache_dir, a.node_ranks))
                log(f"{kind} node run {r + 1}: " + ", ".join(
                    f"{c} {v[-1]:.3f} s" for c, v in secs.items()))
            shutil.rmtree(cache_dir, ignore_errors=True)
            cells = [f"{statistics.median(v):.3f} s ({min(v):.3f}-{max(v):.3f})"
                     for v in secs.values()]
            ratio = [round(c / z, 2) for c, z in zip(secs["cache cold"], secs["zephon"])]
            print(f"| {kind} | seconds | " + " | ".join(cells) + f" | {ratio} |")
        return 0
    for kind in a.kinds.split(","):
        meta = corpus_mod.ensure(kind, a.mb, log=log)
        for name in ("zephon", "litdata"):
            if not os.path.exists(os.path.join(meta["dir"], "formats", name)):
                raise SystemExit(f"{kind}: no {name} copy; run python -m benchmarks.peers.run first")
        cache_dir = os.path.join(meta["dir"], "work", "decoded-cache")
        for metric in a.metrics.split(","):
            runs: dict = {c: [] for c in CASES}
            for r in range(a.runs):
                # cold before warm in every run: the cold child fills the folder warm reads.
                for case in CASES:
                    res = _one(case, metric, kind, meta, cache_dir, a.timeout)
                    if "error" in res:
                        raise SystemExit(f"{kind} {metric} {case}: {res['error']}")
                    runs[case].append(res["warm_first_ms"] if metric == "resume"
                                      else res["samples"] / res["seconds"])
                log(f"{kind} {metric} run {r + 1}: " + ", ".join(
                    f"{c} {v[-1]:,.1f}" for c, v in runs.items()))
            results.setdefault(kind, {})[metric] = runs
        shutil.rmtree(cache_dir, ignore_errors=True)
    os.makedirs(BENCH, exist_ok=True)
    with open(os.path.join(os.path.dirname(BENCH), "decoded_cache.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("| corpus | read | " + " | ".join(CASES) + " | cold / LitData | warm / LitData |")
    print("|---|---|" + "---|" * (len(CASES) + 2))
    for kind, block in results.items():
        for metric, runs in block.items():
            cells = [f"{statistics.median(v):,.1f} ({min(v):,.1f}-{max(v):,.1f})"
                     for v in runs.values()]
            # Ratios read "times LitData's rate"; for resume (ms, lower is better) inverted.
            ratios = [[round(y / x if metric == "resume" else x / y, 2)
                       for x, y in zip(runs[c], runs["litdata"])]
                      for c in ("cache cold", "cache warm")]
            print(f"| {kind} | {metric} | " + " | ".join(cells) + " | "
                  + " | ".join(str(r) for r in ratios) + " |")
    if a.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

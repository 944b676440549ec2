#!/usr/bin/env python3
"""The per-step account's cost (issue 43): one loader pass with it (this checkout) and
without it (an older tree, ``--before``), alternating in child processes.

The account is always on: every step's wait is timed and split by cause, every storage
request counted, and a worker's batch carries its note. Its cost is per step, so the cases
are small per-rank batches of short documents over a local dataset (no I/O wait to hide
it): text at a batch of 8 sequential and 64 shuffled samples, and 64 shuffled with two
torch worker processes (the note crosses the hand-over). The figures are the ratios of
median pass times and of the pass's process CPU times, after / before (1.02 = 2% slower).

    git archive 9689264 zephon_store | tar -x -C /tmp/before     # the tree before issue 43
    python -m benchmarks.ab_account --before /tmp/before --mb 20 --runs 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from . import corpora
from .harness import BENCH_DIR, run_child

# case -> (per-rank batch, shuffled, worker processes, documents: "paragraphs" of the
# stdlib's sources, about 190 bytes, or whole "files", about 17 KB as in the peers' corpus).
CASES = {"seq8": (8, False, 0, "paragraphs"), "shuffled64": (64, True, 0, "paragraphs"),
         "workers2": (64, True, 2, "paragraphs"), "files_seq8": (8, False, 0, "files")}


def ensure_dataset(mb: int, docs: str) -> str:
    """A local dataset of ``docs`` (the stdlib's sources as whole files, or split into
    paragraphs), about ``mb`` MB, built once under ``.bench/account``."""
    from zephon_store import convert
    from zephon_store.testing.corpus import stdlib_sources

    out = os.path.join(BENCH_DIR, "account", f"{docs}-{mb}mb-v1")
    if os.path.exists(os.path.join(out, "ds", "manifest.json")):
        return os.path.join(out, "ds")
    os.makedirs(out, exist_ok=True)
    src, left = os.path.join(out, "input.jsonl"), mb * 1_000_000
    with open(src, "w") as f:
        while left > 0:
            for path, text in stdlib_sources():
                for doc in (text.split("\n\n") if docs == "paragraphs" else [text]):
                    if doc.strip() and left > 0:
                        f.write(json.dumps({"path": path, "text": doc}) + "\n")
                        left -= len(doc)
    convert([src], os.path.join(out, "ds"), progress=False)
    return os.path.join(out, "ds")


def child(case: str, path: str) -> dict:
    """One pass over ``path`` with the zephon_store on the path: samples and seconds."""
    from zephon_store import OrderOptions, Topology

    batch, shuffle, workers, _ = CASES[case]
    order = OrderOptions(seed=0, shuffle=shuffle)
    if workers:
        from zephon_store import BatchOptions, StopOptions, WorkerOptions, as_numpy
        from zephon_store.torch import ZephonLoader

        loader = ZephonLoader(path, topology=Topology(batch), order=order,
                              batch=BatchOptions(collate=as_numpy),
                              stop=StopOptions(epochs=1.0),
                              workers=WorkerOptions(num_workers=workers))
    else:
        from zephon_store import Loader, StopOptions

        loader = Loader(path, topology=Topology(batch), order=order,
                        stop=StopOptions(epochs=1.0))
    t0, c0 = time.perf_counter(), time.process_time()
    samples = sum(len(b["text"]) for b in loader)
    return {"samples": samples, "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - c0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a tree holding the zephon_store without the account")
    ap.add_argument("--after", default=corpora.ROOT, help="default: this checkout")
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.path)))
        return
    if not a.before:
        ap.error("--before DIR is required: a tree holding zephon_store/ without the account")
    trees = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after)}
    results: dict = {"mb": a.mb, "runs": a.runs, "trees": trees}
    for case in a.cases.split(","):
        path = ensure_dataset(a.mb, CASES[case][3])
        secs: dict[str, list[float]] = {"before": [], "after": []}
        cpu: dict[str, list[float]] = {"before": [], "after": []}
        samples = set()
        for _ in range(a.runs):
            for name, pkg in trees.items():
                got = run_child("ab_account", "--child", case, "--path", path, pkg=pkg)
                secs[name].append(got["seconds"])
                cpu[name].append(got["cpu_seconds"])
                samples.add(got["samples"])
        if len(samples) != 1:
            raise RuntimeError(f"{case}: the trees read different sample counts {samples}")
        row = {name: {"median_s": round(statistics.median(v), 3), "min_s": round(min(v), 3),
                      "max_s": round(max(v), 3),
                      "median_cpu_s": round(statistics.median(cpu[name]), 3)}
               for name, v in secs.items()}
        row["samples"] = samples.pop()
        row["after_over_before"] = round(statistics.median(secs["after"])
                                         / statistics.median(secs["before"]), 3)
        # CPU time of the pass's process (its threads too): less moved by other load on a
        # shared host than wall time; a worker process's CPU is not in it.
        row["cpu_after_over_before"] = round(statistics.median(cpu["after"])
                                             / statistics.median(cpu["before"]), 3)
        results[case] = row
        print(f"{case}: {row}", file=sys.stderr, flush=True)
    print(json.dumps(results, indent=None if a.json else 1))


if __name__ == "__main__":
    main()

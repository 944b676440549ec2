#!/usr/bin/env python3
"""Before/after a change: the same ``bench_loader`` cases against two zephon_store trees.

Each run spawns the case once per tree, alternating (before, after, before, ...), so
background load hits both alike; the figure of merit is the ratio of medians.

    cp -r zephon_store /tmp/before/            # (or a git worktree of the old commit)
    python -m benchmarks.ab_loader --before /tmp/before --mb 300 --runs 5 \\
        --cases zephon_seq,zephon_shuffled --corpus all --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from . import corpora
from .harness import run_child


def _child(pkg: str, case: str, kind: str, mb: int) -> dict:
    env = dict(os.environ, ZEPHON_BENCH_PKG=pkg, LITDATA_DISABLE_VERSION_CHECK="1")
    return run_child("bench_loader", "--child", case, "--kind", kind, "--mb", str(mb),
                     pkg=pkg, env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="directory holding the old zephon_store/")
    ap.add_argument("--after", default=corpora.ROOT, help="default: this checkout")
    ap.add_argument("--mb", type=int, default=corpora.DEFAULT_MB)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", default="zephon_seq,zephon_shuffled")
    ap.add_argument("--corpus", choices=["text", "tokens", "all"], default="all")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    kinds = ["text", "tokens"] if a.corpus == "all" else [a.corpus]
    trees = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after)}
    results: dict = {"mb": a.mb, "runs": a.runs, "trees": trees}
    for kind in kinds:
        corpus = corpora.ensure(kind, a.mb, log=lambda s: print(s, file=sys.stderr))
        corpora.warm_page_cache(corpus)
        for case in a.cases.split(","):
            secs: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(a.runs):
                for name, pkg in trees.items():
                    secs[name].append(_child(pkg, case, kind, a.mb)["seconds"])
            row = {name: {"median_s": round(statistics.median(v), 3),
                          "min_s": round(min(v), 3), "max_s": round(max(v), 3)}
                   for name, v in secs.items()}
            row["speedup"] = round(statistics.median(secs["before"])
                                   / statistics.median(secs["after"]), 2)
            results[f"{kind}/{case}"] = row
            print(f"{kind}/{case}: {row}", file=sys.stderr, flush=True)
    print(json.dumps(results, indent=None if a.json else 1))


if __name__ == "__main__":
    main()

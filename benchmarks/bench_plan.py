#!/usr/bin/env python3
"""Benchmark: what each node reads, from the ``zephon plan`` simulator (no byte is read).

For world sizes W in {1, 8, 48, 64} (8 ranks per node) and a global batch of 1536 samples
(the smallest multiple of 512 that 48 and 64 both divide), shuffled, ``window_blocks=8``,
one epoch each, with ``lanes`` = the default of ``OrderOptions``, the earlier default 5040,
1 (plain slicing: every rank takes a contiguous slice of one shuffled sequence), W, and the
node count:

- ``read_amplification``: bytes a node fetches / bytes of the rows it uses (1.0 = every
  fetched row group is used entirely by that node);
- ``distinct_row_groups_per_step_per_node`` (and per rank): the decode working set of a step;
- ``cache_footprint_MB``: the node-local cache needed for that amplification.

Two manifests: the text corpus of ``corpora.py`` as converted, and the same row groups tiled
to ``--scale-rgs`` row groups (default 16,000: ~17 GB of text, 3.7 GB stored), because the effective lane
count is capped at ``num_row_groups // window_blocks`` and then rounded down to a divisor of
the requested count: with lanes=5040 a few hundred row groups give 30 lanes, which no W > 1
here divides, while 16,000 give 1680 lanes, which W = 8 and 48 divide (64 does not).

    python -m benchmarks.bench_plan --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from . import corpora

WORLD_SIZES = (1, 8, 48, 64)
# The default OrderOptions().lanes, the earlier default 5040, plain slicing (1), and lanes
# set to the world size or to the node count (what docs/order.md suggests for many nodes).
LANE_VARIANTS = ("default", "5040", "plain", "=W", "=nodes")
GLOBAL_BATCH = 1536
RANKS_PER_NODE = 8


class TiledManifest:
    """The row-group columns the simulator reads, of a manifest repeated ``times`` times."""

    def __init__(self, m, times: int) -> None:
        self.num_row_groups = m.num_row_groups * times
        self.rg_rows = np.tile(m.rg_rows, times)
        self.rg_length = np.tile(m.rg_length, times)
        self.rg_shard = (np.tile(m.rg_shard, times)
                         + np.repeat(np.arange(times), m.num_row_groups) * m.num_shards)
        self.rg_row_start = np.concatenate([[0], np.cumsum(self.rg_rows)[:-1]])
        self.num_samples = int(self.rg_rows.sum())
        self.total_bytes = int(self.rg_length.sum())


def run(manifest, label: str, log) -> list[dict]:
    from zephon_store.order import OrderOptions, Topology
    from zephon_store.runs.simulate import simulate

    rows = []
    for variant in LANE_VARIANTS:
        for w in WORLD_SIZES:
            spec = Topology(GLOBAL_BATCH, w, ranks_per_node=min(RANKS_PER_NODE, w))
            lanes = {"default": OrderOptions().lanes, "5040": 5040, "plain": 1, "=W": w,
                     "=nodes": spec.num_nodes}[variant]
            t0 = time.perf_counter()
            # "auto" (the default) resolved as the loader does at a run's first start
            options = OrderOptions(seed=0, lanes=lanes).resolved(
                manifest.num_row_groups, manifest.num_samples, nodes=spec.num_nodes,
                node_batch=spec.local_batch * spec.ranks_per_node)
            sim = simulate(manifest, options, spec)
            secs = time.perf_counter() - t0
            row = {"manifest": label, "lanes_variant": variant, "world_size": w,
                   "nodes": spec.num_nodes,
                   "lanes_requested": lanes, "effective_lanes": sim["effective_lanes"],
                   "lane_order": sim["lane_order"], "steps": sim["simulated_steps"],
                   "read_amplification": sim["read_amplification"],
                   "read_amplification_worst_node": max(
                       n["read_amplification"] for n in sim["nodes"]),
                   "distinct_rgs_per_step_per_node": sim["distinct_row_groups_per_step_per_node"],
                   "distinct_rgs_per_step_per_rank": sim["distinct_row_groups_per_step_per_rank"],
                   "cache_footprint_MB": round(sim["cache_footprint_bytes_max"] / 1e6, 1),
                   "spearman_position_vs_id": round(
                       sim["shuffle_quality"]["spearman_position_vs_id"], 4),
                   "simulate_s": round(secs, 2)}
            rows.append(row)
            log(f"  {label} lanes={lanes} ({variant}) W={w}: amp {row['read_amplification']} "
                f"rgs/step/node {row['distinct_rgs_per_step_per_node']} "
                f"(P_eff {row['effective_lanes']}, lane order {row['lane_order']}) {secs:.1f} s")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=corpora.DEFAULT_MB, help="text corpus size")
    ap.add_argument("--quick", action="store_true", help=f"--mb {corpora.QUICK_MB}")
    ap.add_argument("--scale-rgs", type=int, default=16_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    mb = corpora.QUICK_MB if a.quick else a.mb

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    from zephon_store.format.manifest import load_manifest
    from zephon_store.io.storage import Storage

    corpus = corpora.ensure("text", mb, log=log)
    m = load_manifest(Storage(os.path.join(corpus["dir"], "zephon")))
    times = max(1, -(-a.scale_rgs // m.num_row_groups))
    tiled = TiledManifest(m, times)
    out = {"global_batch": GLOBAL_BATCH, "ranks_per_node": RANKS_PER_NODE,
           "corpus": {"mb": mb, "num_samples": m.num_samples, "num_row_groups": m.num_row_groups,
                      "stored_bytes": int(m.rg_length.sum())},
           "scaled": {"times": times, "num_samples": tiled.num_samples,
                      "num_row_groups": tiled.num_row_groups, "stored_bytes": tiled.total_bytes},
           "rows": run(m, "corpus", log) + run(tiled, "scaled", log)}
    print(json.dumps(out, indent=None if a.json else 1))


if __name__ == "__main__":
    main()

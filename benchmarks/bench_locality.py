#!/usr/bin/env python3
"""Benchmark: per-node read amplification from ``zephon plan``'s simulator (issue 21).

No bytes are read: the simulator (``zephon_store.runs.simulate.simulate``, what ``zephon
plan`` prints) over a manifest of equal row groups of 20 rows, 8 ranks per node, 8 samples
per rank per step, one epoch.

1. ``start``: default options (``lanes="auto"`` resolved for the node count the run starts
   on), world sizes ``--worlds``, on ``--row-groups`` (default 2,000 and 20,000); next to
   ``lanes=1`` (the old default), ``lanes=5040`` and ``lanes=W``.
2. ``resume``: a run started on ``M0`` nodes (``--start-nodes``) and resumed on ``M'``
   nodes (``--resume-nodes``, ranges like ``1-1024``): the aggregate amplification over the
   nodes, its worst ``M'``, and the bound ``1 + M'/P + 1/K`` it is checked against.

    python -m benchmarks.bench_locality --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace

import numpy as np

ROWS = 20
RANKS_PER_NODE = 8
PER_RANK = 8


def manifest(row_groups: int) -> SimpleNamespace:
    """The manifest accessors the simulator reads, for equal row groups (bytes = rows)."""
    rows = np.full(row_groups, ROWS, dtype=np.int64)
    return SimpleNamespace(rg_rows=rows, rg_row_start=np.arange(row_groups) * ROWS,
                           rg_length=rows.copy(), num_row_groups=row_groups,
                           rg_shard=np.arange(row_groups) // 64)


def _ints(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row-groups", default="2000,20000")
    ap.add_argument("--worlds", default="8,64,512,1000,1024")
    ap.add_argument("--start-nodes", default="2,8,64,125,128")
    ap.add_argument("--resume-nodes", default="1-1024")
    ap.add_argument("--resume-row-groups", type=int, default=2000)
    ap.add_argument("--skip-start", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    from zephon_store.order import OrderOptions, Topology
    from zephon_store.runs.simulate import simulate

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    def run(m, options: OrderOptions, nodes: int, start_nodes: int) -> dict:
        world = nodes * RANKS_PER_NODE
        topo = Topology(PER_RANK * world, world, ranks_per_node=RANKS_PER_NODE)
        options = options.resolved(m.num_row_groups, m.num_row_groups * ROWS,
                                   nodes=start_nodes, node_batch=PER_RANK * RANKS_PER_NODE)
        sim = simulate(m, options, topo)
        return {"lanes": sim["effective_lanes"], "lane_order": sim["lane_order"],
                "amp": sim["read_amplification"], "worst_node": sim["read_amplification_max_node"],
                "row_groups_per_step_per_rank": sim["distinct_row_groups_per_step_per_rank"]}

    start = []
    if not a.skip_start:
        for rgs in _ints(a.row_groups):
            m = manifest(rgs)
            for world in _ints(a.worlds):
                nodes = -(-world // RANKS_PER_NODE)
                if world % RANKS_PER_NODE:
                    raise SystemExit(f"--worlds: {world} is not a multiple of {RANKS_PER_NODE}")
                for variant, lanes in (("default", "auto"), ("lanes=1", 1), ("lanes=5040", 5040),
                                       ("lanes=W", world)):
                    t0 = time.perf_counter()
                    row = {"row_groups": rgs, "world_size": world, "nodes": nodes,
                           "variant": variant,
                           **run(m, OrderOptions(seed=0, lanes=lanes), nodes, nodes)}
                    start.append(row)
                    log(f"{rgs} rg W={world} {variant}: {row} ({time.perf_counter() - t0:.1f} s)")
    resume = []
    m = manifest(a.resume_row_groups)
    for m0 in _ints(a.start_nodes):
        t0 = time.perf_counter()
        points = []
        for nodes in _ints(a.resume_nodes):
            r = run(m, OrderOptions(seed=0), nodes, m0)
            bound = 1 + nodes / r["lanes"] + 1 / OrderOptions().window_blocks
            points.append({"nodes": nodes, "amp": r["amp"], "worst_node": r["worst_node"],
                           "bound": round(bound, 4)})
        worst = max(points, key=lambda p: p["amp"])
        over = [p for p in points if p["amp"] > p["bound"]]
        resume.append({"row_groups": a.resume_row_groups, "start_nodes": m0,
                       "lanes": r["lanes"], "worst": worst, "over_bound": over,
                       "points": points})
        log(f"started on {m0} nodes (P={r['lanes']}): worst {worst}, {len(over)} over the "
            f"bound ({time.perf_counter() - t0:.0f} s)")
    out = {"rows_per_row_group": ROWS, "ranks_per_node": RANKS_PER_NODE,
           "samples_per_rank_per_step": PER_RANK, "start": start, "resume": resume}
    if a.json:
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

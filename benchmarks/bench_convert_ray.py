#!/usr/bin/env python3
"""Benchmark: conversion MB/s with the local engine vs Ray (1 and 2 workers), one run each.

Corpus: the Python standard library's sources as JSONL.zst, ``--copies`` times, split into
``--files`` input files (so there are parallel parse tasks), converted with 16 MiB shards (so
there are parallel write tasks). Ray runs on a real local cluster (one head node with
``--cpus`` CPUs, :class:`zephon_store.testing.ray_cluster.LocalRayCluster`) started before
the timed runs; each conversion runs in a fresh driver subprocess, timed after its imports,
so a Ray figure includes connecting the driver to the cluster (``stages.start``) and task
scheduling. Every output is checked to be byte-identical to the first one. Usage:

    python -m benchmarks.bench_convert_ray --copies 2 --files 8 --json

``--driver`` measures instead what the driver itself does whatever the engine, for the scale
plan (docs/scale.md): the cut (``Cutter`` over ``--rows`` per-row sizes, rows/s) and the
publish of a manifest for ``--shards`` shards of 32 row groups from ``--inputs`` inputs
(seconds and peak RSS growth), with synthetic but well-formed shard records:

    python -m benchmarks.bench_convert_ray --driver --rows 20000000 --shards 30000 --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

from .harness import ROOT

DRIVER = r"""
import time
t_start = time.perf_counter()
import json, sys
from zephon_store.write.convert import convert
from zephon_store.write.shardwriter import WriteOptions
src, out, engine, workers, address = sys.argv[1:6]
t0 = time.perf_counter()
res = convert([src], out, options=WriteOptions(target_shard_bytes="16MiB"), engine=engine,
              workers=int(workers), ray_address=address or None, progress=False)
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0, "with_imports": t1 - t_start, "shards": res.num_shards,
                  "dataset_id": res.dataset_id, "stages": res.stages}))
"""


def make_inputs(src: str, copies: int, files: int) -> int:
    """Write the corpus as ``files`` JSONL.zst files; return its bytes before compression."""
    import zstandard

    from zephon_store.testing.corpus import stdlib_sources

    docs = stdlib_sources()
    lines = [json.dumps({"copy": c, "path": p, "text": t}) + "\n"
             for c in range(copies) for p, t in docs]
    os.makedirs(src)
    raw = 0
    per = -(-len(lines) // files)
    for k in range(files):
        body = "".join(lines[k * per:(k + 1) * per]).encode()
        raw += len(body)
        with open(os.path.join(src, f"part-{k:03d}.jsonl.zst"), "wb") as f:
            f.write(zstandard.ZstdCompressor(level=3).compress(body))
    return raw


def tree_md5(root: str) -> dict[str, str]:
    out = {}
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x != ".zephon-staging"]
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), root)] = hashlib.md5(f.read()).hexdigest()
    return out


def _peak_rss() -> int:
    with open("/proc/self/status") as fh:
        return [int(x.split()[1]) * 1024 for x in fh if x.startswith("VmHWM")][0]


def driver_costs(rows: int, shards: int, inputs: int) -> dict:
    """Seconds of the driver's cut and publish at a given size (no shard bytes involved)."""
    import time

    import numpy as np
    import pyarrow as pa

    from zephon_store.ingest import InputFile, InputOptions
    from zephon_store.io.storage import Storage
    from zephon_store.write.layout import Cutter, ShardCut
    from zephon_store.write.publish import publish_manifest
    from zephon_store.write.shardwriter import RowGroupInfo, ShardInfo, WriteOptions
    from zephon_store.write.staged import StagedInput

    rng = np.random.default_rng(0)
    cutter = Cutter(row_group_rows=None, row_group_bytes=1 << 20, target_shard_bytes=128 << 20)
    chunk = 1_000_000
    sizes = [rng.integers(200, 6000, chunk) for _ in range(4)]  # ~3 KB per row, reused
    t0 = time.perf_counter()
    for k in range(rows // chunk):
        cutter.feed(sizes[k % 4])
    cut_s = time.perf_counter() - t0

    rgs, rows_per_rg = 32, 300
    h = "0" * 32
    cuts, infos = [], []
    for i in range(shards):
        cuts.append(ShardCut(i, i * rgs * rows_per_rg, [rows_per_rg] * rgs))
        infos.append(ShardInfo(name=f"{i:032x}", bytes=rgs * 400_000 + 5000,
                               rows=rgs * rows_per_rg, footer_offset=rgs * 400_000 + 4,
                               footer_xxh3=h,
                               row_groups=[RowGroupInfo(rows_per_rg, 4 + j * 400_000, 400_000, h)
                                           for j in range(rgs)]))
    total = shards * rgs * rows_per_rg
    per = total // inputs
    files = [InputFile(f"/data/in/part-{k:06d}.jsonl.zst", "jsonl", "zstd", 10 << 20)
             for k in range(inputs)]
    metas = [StagedInput(index=k, url=f.url, rows=per + (total - per * inputs if k == inputs - 1
                                                          else 0),
                         input_bytes=f.size, schema_b64=None) for k, f in enumerate(files)]
    rss0 = _peak_rss()
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        publish_manifest(Storage(out), files, metas, cuts, infos, pa.schema([("text", pa.string())]),
                         WriteOptions(), InputOptions(), None)
        publish_s = time.perf_counter() - t0
    return {"cut_rows": rows, "cut_s": round(cut_s, 3),
            "cut_rows_per_s": round(rows / cut_s), "publish_shards": shards,
            "publish_row_groups": shards * rgs, "publish_inputs": inputs,
            "publish_s": round(publish_s, 3),
            "publish_peak_rss_growth_mb": round((_peak_rss() - rss0) / 2**20, 1)}


def main() -> None:
    from zephon_store.testing.ray_cluster import LocalRayCluster, ray_env

    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the Ray node")
    ap.add_argument("--driver", action="store_true", help="measure the driver's cut and publish")
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--shards", type=int, default=30_000)
    ap.add_argument("--inputs", type=int, default=3_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.driver:
        print(json.dumps(driver_costs(a.rows, a.shards, a.inputs), indent=None if a.json else 1))
        return
    env = dict(ray_env(), PYTHONPATH=ROOT)
    with tempfile.TemporaryDirectory() as work:
        src = os.path.join(work, "src")
        mb = make_inputs(src, a.copies, a.files) / 1e6
        results: dict = {"input_mb": round(mb, 1), "files": a.files,
                         "load_average": os.getloadavg()}
        with LocalRayCluster([a.cpus], object_store_bytes=200_000_000) as cluster:
            ref = None
            for name, engine, workers in [("local_w1", "local", 1), ("local_w2", "local", 2),
                                          ("ray_w1", "ray", 1), ("ray_w2", "ray", 2)]:
                out = os.path.join(work, name)
                address = cluster.address if engine == "ray" else ""
                r = subprocess.run([sys.executable, "-c", DRIVER, src, out, engine, str(workers),
                                    address], capture_output=True, text=True, env=env,
                                   check=True)
                res = json.loads(r.stdout.strip().splitlines()[-1])
                tree = tree_md5(out)
                ref = ref or tree
                results[name] = {"seconds": round(res["seconds"], 3),
                                 "mb_per_s": round(mb / res["seconds"], 1),
                                 "shards": res["shards"], "identical": tree == ref,
                                 "stages": res["stages"]}
        for w in (1, 2):
            results[f"overhead_ray_w{w}_vs_local_w{w}"] = round(
                results[f"ray_w{w}"]["seconds"] / results[f"local_w{w}"]["seconds"], 2)
    print(json.dumps(results, indent=None if a.json else 1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Benchmark: load a 1,000,000-shard manifest, and locate() throughput.

Writes a synthetic dataset root holding only manifest.json + side tables (1M shards, one row
group each, 10,000 samples per shard = 10^10 samples), then in a fresh subprocess measures
open time and peak RSS of `load_manifest`, and `locate` lookups/s on 10M random sequence
numbers (and sorted ones).

    python -m benchmarks.bench_manifest --shards 1000000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from zephon_store._util.hashing import xxh3_hex
from zephon_store.format.manifest import (
    MANIFEST_NAME,
    PROVENANCE_TABLE_SCHEMA,
    ROW_GROUP_TABLE_SCHEMA,
    SHARD_TABLE_SCHEMA,
    Manifest,
    table_to_ipc,
)
from zephon_store.write.shardwriter import WriteOptions

from .harness import ROOT


def make(root: str, shards: int, rows_per_shard: int) -> None:
    names = [f"{i:032x}" for i in range(shards)]
    hashes = pa.array([bytes.fromhex(n) for n in names], pa.binary(16))
    rows = np.full(shards, rows_per_shard, dtype=np.int64)
    start = np.arange(shards, dtype=np.int64) * rows_per_shard
    size = np.full(shards, 128 << 20, dtype=np.int64)
    sh = pa.table({"name": names, "bytes": size, "rows": rows, "row_start": start,
                   "first_row_group": np.arange(shards, dtype=np.int64),
                   "num_row_groups": np.ones(shards, dtype=np.int64),
                   "footer_offset": size - 4096, "footer_xxh3": hashes}, schema=SHARD_TABLE_SCHEMA)
    rg = pa.table({"shard": np.arange(shards, dtype=np.int64), "rows": rows, "row_start": start,
                   "offset": np.full(shards, 4, dtype=np.int64), "length": size - 4100,
                   "xxh3": hashes}, schema=ROW_GROUP_TABLE_SCHEMA)
    prov = pa.table({"input": ["in.jsonl"], "input_bytes": [1], "input_row_start": [0],
                     "num_rows": [int(rows.sum())], "shard": [0], "row_start": [0]},
                    schema=PROVENANCE_TABLE_SCHEMA)
    os.makedirs(os.path.join(root, "index"), exist_ok=True)
    refs = {}
    for kind, t in (("shards", sh), ("row_groups", rg), ("provenance", prov)):
        data = table_to_ipc(t)
        h = xxh3_hex(data)
        with open(os.path.join(root, "index", f"{h}.arrow"), "wb") as f:
            f.write(data)
        refs[kind] = {"path": f"index/{h}.arrow", "xxh3": h, "bytes": len(data), "rows": t.num_rows}
    doc = Manifest.build_doc(
        schema=pa.schema([("text", pa.string())]), writer=WriteOptions().to_dict(),
        totals={"num_samples": int(rows.sum()), "num_shards": shards, "num_row_groups": shards,
                "total_bytes": int(size.sum())},
        table_refs=refs, inputs={"count": 1, "bytes": 1}, skipped={},
        created_by={"library": "bench", "pyarrow": pa.__version__})
    with open(os.path.join(root, MANIFEST_NAME), "w") as f:
        json.dump(doc, f)


CHILD = r"""
import json, sys, time
import numpy as np
t0 = time.perf_counter()
from zephon_store.format.manifest import load_manifest
from zephon_store.io.storage import Storage
from zephon_store.format.index import locate
t_import = time.perf_counter() - t0
t0 = time.perf_counter()
m = load_manifest(Storage(sys.argv[1]))
t_load = time.perf_counter() - t0
# VmHWM (peak resident set since exec); ru_maxrss can carry the parent's peak over.
rss_load = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
rng = np.random.default_rng(0)
seqs = rng.integers(0, m.num_samples, 10_000_000)
locate(m, seqs[:1000])
t0 = time.perf_counter(); loc = locate(m, seqs); t_rand = time.perf_counter() - t0
t0 = time.perf_counter(); loc = locate(m, seqs); t_rand2 = time.perf_counter() - t0
s = np.sort(seqs)
t0 = time.perf_counter(); locate(m, s); t_sorted = time.perf_counter() - t0
print(json.dumps({"num_shards": m.num_shards, "num_samples": m.num_samples,
  "import_s": round(t_import, 3), "load_s": round(t_load, 3),
  "peak_rss_after_load_mb": round(rss_load / 2**20, 1),
  "locate_random_per_s": round(len(seqs) / t_rand),
  "locate_random_warm_per_s": round(len(seqs) / t_rand2), "locate_sorted_per_s": round(len(s) / t_sorted)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=1_000_000)
    ap.add_argument("--rows-per-shard", type=int, default=10_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        make(root, a.shards, a.rows_per_shard)
        made = time.perf_counter() - t0
        env = dict(os.environ, PYTHONPATH=ROOT)
        out = subprocess.run([sys.executable, "-c", CHILD, root], capture_output=True, text=True,
                             env=env, check=True)
        res = json.loads(out.stdout)
        res["manifest_json_bytes"] = os.path.getsize(os.path.join(root, MANIFEST_NAME))
        res["side_table_bytes"] = sum(os.path.getsize(os.path.join(root, "index", f))
                                      for f in os.listdir(os.path.join(root, "index")))
        res["make_s"] = round(made, 1)
    print(json.dumps(res, indent=None if a.json else 1))


if __name__ == "__main__":
    main()

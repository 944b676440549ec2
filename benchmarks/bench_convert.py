#!/usr/bin/env python3
"""Benchmark: conversion throughput against raw pyarrow on the same data.

Corpus: the Python standard library's sources as JSONL.zst (``--copies`` times, ~30 MB of
text each), and the same records as one Parquet input. For each input kind, in fresh
subprocesses, median/min/max of ``--runs`` runs:

- baseline ("raw pyarrow"): read the input with pyarrow (zstd stream + ``pyarrow.json``, or
  ``pq.read_table``) and ``pq.write_table(..., compression="zstd")`` to one file, with
  pyarrow's threads (``raw_pyarrow``) and single-threaded (``raw_pyarrow_1thread``, the
  per-worker baseline);
- zephon: ``zephon_store.convert(...)`` with ``workers=1`` (and ``--workers N``):
  row sizing, cutting, content hashing, manifest; default options (128 MiB shards).

The figure of merit is the ratio zephon / baseline MB/s (input bytes before compression),
per worker, timed inside each subprocess after its imports (interpreter start and imports
are reported separately as ``median_s_with_imports``: they are a fixed cost per process). Usage:

    python -m benchmarks.bench_convert --copies 4 --runs 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from .harness import ROOT

BASELINE = r"""
import time
t_start = time.perf_counter()
import io, json, sys, glob
import pyarrow as pa, pyarrow.json as pj, pyarrow.parquet as pq, zstandard
src, out, kind, threads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
pa.set_cpu_count(pa.cpu_count() if threads else 1)
t0 = time.perf_counter()
if kind == "jsonl":
    tables = []
    for p in sorted(glob.glob(src + "/*.jsonl.zst")):
        with open(p, "rb") as f:
            data = zstandard.ZstdDecompressor().stream_reader(f).read()
        tables.append(pj.read_json(io.BytesIO(data),
                                   read_options=pj.ReadOptions(use_threads=threads)))
    table = pa.concat_tables(tables)
else:
    table = pq.read_table(src, use_threads=threads)
pq.write_table(table, out, compression="zstd", compression_level=3, row_group_size=4096)
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0, "with_imports": t1 - t_start}))
"""

ZEPHON = r"""
import time
t_start = time.perf_counter()
import json, sys
from zephon_store.write.convert import convert
t0 = time.perf_counter()
res = convert([sys.argv[1]], sys.argv[2], workers=int(sys.argv[3]), progress=False)
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0, "with_imports": t1 - t_start, "shards": res.num_shards}))
"""


def _run(code: str, *args: str) -> tuple[float, float]:
    """(seconds after imports, seconds including imports) of one fresh subprocess."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=env, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res["seconds"], res["with_imports"]


def make_inputs(work: str, copies: int) -> tuple[str, str, int]:
    import json as _json

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from zephon_store.testing.corpus import stdlib_sources

    docs = stdlib_sources()
    src = os.path.join(work, "jsonl")
    os.makedirs(src)
    raw_bytes = 0
    rows = []
    for c in range(copies):
        body = "".join(_json.dumps({"copy": c, "path": p, "text": t}) + "\n" for p, t in docs)
        raw_bytes += len(body.encode())
        with open(os.path.join(src, f"part-{c:03d}.jsonl.zst"), "wb") as f:
            f.write(zstandard.ZstdCompressor(level=3).compress(body.encode()))
        rows.extend({"copy": c, "path": p, "text": t} for p, t in docs)
    pq_path = os.path.join(work, "input.parquet")
    pq.write_table(pa.Table.from_pylist(rows), pq_path, compression="zstd")
    return src, pq_path, raw_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        src, pq_path, raw = make_inputs(work, a.copies)
        mb = raw / 1e6
        for kind, inp in (("jsonl.zst", src), ("parquet", pq_path)):
            row = {}
            k = "jsonl" if kind == "jsonl.zst" else "parquet"
            cases = [("raw_pyarrow", BASELINE, lambda o, inp=inp, k=k: (inp, o, k, "1")),
                     ("raw_pyarrow_1thread", BASELINE, lambda o, inp=inp, k=k: (inp, o, k, "0")),
                ("zephon_w1", ZEPHON, lambda o, inp=inp: (inp, o, "1")),
                (f"zephon_w{a.workers}", ZEPHON, lambda o, inp=inp: (inp, o, str(a.workers)))]
            for name, code, args in cases:
                times, whole = [], []
                for r in range(a.runs):
                    out = os.path.join(work, f"out-{name}-{kind}-{r}")
                    if code is BASELINE:
                        out += ".parquet"
                    t, w = _run(code, *args(out))
                    times.append(t)
                    whole.append(w)
                row[name] = {"median_s": round(statistics.median(times), 3),
                             "min_s": round(min(times), 3), "max_s": round(max(times), 3),
                             "MB_per_s": round(mb / statistics.median(times), 1),
                             "median_s_with_imports": round(statistics.median(whole), 3)}
            base = row["raw_pyarrow"]["median_s"]
            base1 = row["raw_pyarrow_1thread"]["median_s"]
            row["ratio_w1_vs_raw"] = round(base / row["zephon_w1"]["median_s"], 3)
            # per worker: one zephon worker process against single-threaded pyarrow
            row["ratio_w1_vs_raw_1thread"] = round(base1 / row["zephon_w1"]["median_s"], 3)
            row[f"ratio_w{a.workers}_vs_raw"] = round(
                base / row[f"zephon_w{a.workers}"]["median_s"], 3)
            results[kind] = row
    results["input_MB_uncompressed"] = round(mb, 1)
    print(json.dumps(results, indent=None if a.json else 1))


if __name__ == "__main__":
    main()

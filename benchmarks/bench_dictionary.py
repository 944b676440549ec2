#!/usr/bin/env python3
"""Benchmark: reading documents written with a dictionary (the old default) vs plain pages.

Builds a text table of real documents (the Python standard library's ``.py`` files, cut at
16 KiB, every value distinct), writes it as one shard per (compression, dictionary) with
:func:`zephon_store.write.shardwriter.write_shard` and the default ~1 MiB row groups, where
``use_dictionary`` is ``True`` (every column, what 0.1.0 wrote) or ``"auto"`` (the
default now: mostly-distinct strings get plain pages, see
:func:`zephon_store.write.shardwriter.dictionary_columns`). Then, in a fresh process per
measurement (first-touch page faults are part of a real pass), it times
``read_row_group`` of every row group from the memory-mapped file ("decode") and the
``str`` conversion of the text column ("python"). Cases run interleaved round-robin,
``--runs`` times each; the table reports medians and the ratio of decode times.

    python -m benchmarks.bench_dictionary --mb 100 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

from zephon_store.testing.corpus import stdlib_sources
from zephon_store.write.shardwriter import WriteOptions, write_shard

from .bench_encoding import row_groups

DOC_BYTES = 16 << 10

CHILD = r"""
import sys, time, json
import pyarrow as pa, pyarrow.parquet as pq
pf = pq.ParquetFile(pa.memory_map(sys.argv[1], "r"))
dec = py = 0.0
for i in range(pf.num_row_groups):
    t0 = time.perf_counter()
    t = pf.read_row_group(i, use_threads=False)
    t1 = time.perf_counter()
    t.column("text").to_pylist()
    dec += t1 - t0
    py += time.perf_counter() - t1
print(json.dumps({"decode_s": dec, "python_s": py}))
"""


def documents(mb: int) -> pa.Table:
    """Stdlib sources (``zephon_store.testing.corpus.stdlib_sources``) cut into documents of at most 16 KiB,
    until ``mb`` MB of text; repeated with a suffix (every value stays distinct) where the
    standard library is smaller."""
    sources = stdlib_sources(mb * 1_000_000)
    paths, texts = [], []
    for path, body in sources:
        for k in range(0, len(body), DOC_BYTES):
            paths.append(path)
            texts.append(body[k:k + DOC_BYTES])
    out_paths, out_texts, total, r = [], [], 0, 0
    while total < mb * 1_000_000 and texts:
        for path, t in zip(paths, texts):
            out_paths.append(path)
            out_texts.append(t if r == 0 else f"{t}\n# copy {r}")
            total += len(out_texts[-1])
            if total >= mb * 1_000_000:
                break
        r += 1
    return pa.table({"path": out_paths, "text": out_texts})


def measure(path: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, path], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=100, help="MB of document text")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--compressions", default="zstd,none,lz4")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    table = documents(args.mb)
    out = {"mb": args.mb, "documents": table.num_rows, "cases": {}}
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for comp in args.compressions.split(","):
            for dictionary in (True, "auto"):
                opts = WriteOptions(compression=comp, use_dictionary=dictionary)
                path = os.path.join(tmp, f"{comp}-{dictionary}.parquet")
                info = write_shard(table, row_groups(table, opts), path, opts)
                col = pq.ParquetFile(path).metadata.row_group(0).column(1)
                name = f"{comp}/{dictionary}"
                cases.append((name, path))
                out["cases"][name] = {"file_bytes": info.bytes,
                                      "text_has_dictionary": col.has_dictionary_page,
                                      "decode_s": [], "python_s": []}
        for _ in range(args.runs):
            for name, path in cases:
                with open(path, "rb") as f:      # back into the page cache
                    while f.read(1 << 24):
                        pass
                r = measure(path)
                out["cases"][name]["decode_s"].append(round(r["decode_s"], 4))
                out["cases"][name]["python_s"].append(round(r["python_s"], 4))
    for c in out["cases"].values():
        c["decode_median_s"] = statistics.median(c["decode_s"])
        c["python_median_s"] = statistics.median(c["python_s"])
    with open("/proc/loadavg") as f:
        out["loadavg_at_end"] = f.read().split()[:3]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['documents']} documents ({args.mb} MB), medians of {args.runs} fresh "
          f"processes")
    print(f"{'compression':12} {'dictionary: decode':>19} {'plain: decode':>14} "
          f"{'speedup':>8} {'python':>14} {'MB dict/plain':>14}")
    for comp in args.compressions.split(","):
        a, b = out["cases"][f"{comp}/True"], out["cases"][f"{comp}/auto"]
        print(f"{comp:12} {a['decode_median_s']:17.3f} s {b['decode_median_s']:12.3f} s "
              f"{a['decode_median_s'] / b['decode_median_s']:7.2f}x "
              f"{a['python_median_s']:6.3f}/{b['python_median_s']:.3f} s "
              f"{a['file_bytes'] / 1e6:6.1f}/{b['file_bytes'] / 1e6:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

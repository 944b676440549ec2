#!/usr/bin/env python3
"""Benchmark: decoding token windows stored as fixed_size_list (v1), fixed-size binary (v2), byte planes (v5).

Writes the same windows (``corpora.token_windows``: Zipf-distributed int32 ids,
``tokens: fixed_size_list<int32>[2049]``) as one shard per (layout, compression) with
:func:`zephon_store.write.shardwriter.write_shard` and the default ~1 MiB row groups
(``WriteOptions(fixed_size_lists="list" | "binary" | "split")``), then, in this one process,
times a full decode of every row group to the logical ``fixed_size_list<int32>`` column:
``ParquetFile.read_row_group`` from the memory-mapped file plus, for the binary layouts,
:func:`zephon_store.format.encoding.to_logical` (a relabel for "binary", a strided copy for
"split"). Cases run interleaved round-robin, ``--runs`` times each; the table reports the best
and the median. A compression ``zstd-1`` is zstd at level 1 (``zstd`` alone: level 3); byte
planes are not written uncompressed (the writer stores those back to back).

    python -m benchmarks.bench_encoding --mb 300 --runs 5 --compressions none,zstd,zstd-1,lz4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon_store.format.encoding import storage_encodings, to_logical
from zephon_store.write.layout import Cutter
from zephon_store.write.rowsize import table_row_nbytes
from zephon_store.write.shardwriter import WriteOptions, write_shard

from .corpora import WINDOW, token_windows

LAYOUTS = ("list", "binary", "split")


def windows_table(mb: int) -> pa.Table:
    n = max(1, round(mb * 1_000_000 / (WINDOW * 4)))
    flat = np.concatenate([w.reshape(-1) for w in token_windows(n)])
    col = pa.FixedSizeListArray.from_arrays(pa.array(flat), WINDOW)
    return pa.table({"tokens": col})


def row_groups(table: pa.Table, options: WriteOptions) -> list[int]:
    """The row-group sizes the converter would cut (one shard holding all of them)."""
    cutter = Cutter(row_group_rows=options.row_group_rows,
                    row_group_bytes=options.row_group_bytes, target_shard_bytes=1 << 62)
    cutter.feed(table_row_nbytes(table))
    return [n for plan in cutter.finish() for n in plan.row_group_rows]


def decode_all(path: str, logical: pa.Schema, encodings: dict) -> int:
    pf = pq.ParquetFile(pa.memory_map(path, "r"))
    rows = 0
    for i in range(pf.num_row_groups):
        t = to_logical(pf.read_row_group(i), logical, encodings)
        rows += t.num_rows
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=300, help="payload MB of int32 windows")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--compressions", default="none,zstd,zstd-1,lz4")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    table = windows_table(args.mb)
    logical = table.schema
    cases, out = [], {"mb": args.mb, "windows": table.num_rows, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for comp in args.compressions.split(","):
            for layout in LAYOUTS:
                if layout == "split" and comp == "none":
                    continue
                codec, _, level = comp.partition("-")
                opts = WriteOptions(compression=codec, fixed_size_lists=layout,
                                    compression_level=int(level) if level else None)
                sizes = row_groups(table, opts)
                path = os.path.join(tmp, f"{layout}-{comp}.parquet")
                t0 = time.perf_counter()
                info = write_shard(table, sizes, path, opts)
                write_s = time.perf_counter() - t0
                name = f"{layout}/{comp}"
                cases.append((name, path, storage_encodings(logical, layout, codec)))
                out["cases"][name] = {"file_bytes": info.bytes, "row_groups": len(sizes),
                                      "write_s": round(write_s, 3), "decode_s": []}
        for _name, path, enc in cases:   # warm the page cache
            decode_all(path, logical, enc)
        for _ in range(args.runs):
            for name, path, enc in cases:
                t0 = time.perf_counter()
                assert decode_all(path, logical, enc) == table.num_rows
                out["cases"][name]["decode_s"].append(round(time.perf_counter() - t0, 4))
    with open("/proc/loadavg") as f:
        out["loadavg_at_end"] = f.read().split()[:3]
    for c in out["cases"].values():
        c["best_s"], c["median_s"] = min(c["decode_s"]), statistics.median(c["decode_s"])
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['windows']} windows of {WINDOW} int32 ({args.mb} MB), best/median of "
          f"{args.runs}")
    print(f"{'compression':12} " + " ".join(f"{name + ' s, MB':>24}" for name in LAYOUTS))
    for comp in args.compressions.split(","):
        row = []
        for layout in LAYOUTS:
            c = out["cases"].get(f"{layout}/{comp}")
            row.append(f"{'-':>24}" if c is None else
                       f"{c['best_s']:.3f}/{c['median_s']:.3f}, {c['file_bytes'] / 1e6:6.1f}"
                       .rjust(24))
        print(f"{comp:12} " + " ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())

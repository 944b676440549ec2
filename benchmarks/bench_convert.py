#!/usr/bin/env python3
"""Benchmark: conversion, stage by stage, against the fastest raw pyarrow writer (issue 43).

Corpora: the peers benchmark's (``benchmarks/peers/corpus.py``): real text as JSONL parts
of ~16 MB, and int32 token windows of 2049 as one zstd Parquet file. Cases, each a fresh
``benchmarks.peers.child`` process, interleaved within every run (the order rotating from
run to run):

- ``raw``: the corpus already in memory as one Arrow table in Zephon's storage layout
  (read, and token windows put in byte planes, before the clock), then one
  ``pq.write_table`` with Zephon's codecs (``benchmarks/peers/sys_pyarrow.py``: text zstd
  level 6, the planes as ``fixed_size_binary`` at LZ4, no dictionary, ~1 MiB row groups).
  No parsing, byte planes, staging, hashing or manifest. The run checks that this file and
  Zephon's first shard hold the same codec and physical type per column (``layout_same``);
- ``zephon``: ``zephon_store.convert([input], out, workers=1)`` from the files, default
  options: parse, size rows, stage, cut, encode, compress, hash, publish;
- ``zephon_arrow``: from the same table in memory as raw pyarrow: written as an Arrow IPC
  file, then converted, both inside the clock (``benchmarks/peers/sys_zephonarrow.py``);
- ``zephon_before`` with ``--before TREE``: the same with another checkout's zephon_store.

Reported per corpus: seconds (median, min-max), the ratios raw / Zephon and raw /
Zephon-from-the-table per run and their medians (>= 1 means Zephon is faster), Zephon's
phases (wall) and its work by kind (``ConvertResult.work_seconds``: summed over its two
threads, so it can exceed the wall), medians over the runs. Usage::

    python -m benchmarks.bench_convert --mb 300 --runs 5 --json
    python -m benchmarks.bench_convert --mb 300 --runs 5 --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics

from .harness import ROOT
from .peers import corpus as corpus_mod
from .peers.run import log, spawn, warm

KINDS = ("text", "tokens")


def _layout(path: str) -> list[tuple[str, str, str]]:
    """(column, codec, physical type) of the first row group of a Parquet file."""
    import pyarrow.parquet as pq

    rg = pq.read_metadata(path).row_group(0)
    return [(rg.column(i).path_in_schema, rg.column(i).compression,
             rg.column(i).physical_type) for i in range(rg.num_columns)]


def _first_shard(out: str) -> str:
    shards = os.path.join(out, "shards")
    return os.path.join(shards, sorted(os.listdir(shards))[0])


def _summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def _medians(dicts: list[dict]) -> dict:
    keys = [k for k in dicts[0]] if dicts else []
    return {k: round(statistics.median(d.get(k, 0.0) for d in dicts), 3) for k in keys}


def bench_kind(kind: str, mb: int, runs: int, before: str | None, timeout: float) -> dict:
    meta = corpus_mod.ensure(kind, mb, log=log)
    work = os.path.join(meta["dir"], "work", "bench_convert")
    cases = {"raw": ("pyarrow", ROOT), "zephon": ("zephon", ROOT),
             "zephon_arrow": ("zephonarrow", ROOT)}
    if before:
        cases["zephon_before"] = ("zephon", before)
    got: dict[str, list[dict]] = {c: [] for c in cases}
    layout_same = None
    names = list(cases)
    for r in range(runs):
        # The order rotates from run to run: a case never always follows the same one.
        for case in names[r % len(names):] + names[:r % len(names)]:
            system, root = cases[case]
            out = os.path.join(work, f"{case}-{r}")
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            warm(meta["input"])
            res = spawn(system, "convert", kind, out, timeout, root=root, inp=meta["input"],
                        workers=1)
            if "error" in res:
                raise RuntimeError(f"{kind} {case}: {res['error']}")
            got[case].append(res)
            log(f"  {kind} run {r} {case}: {res['seconds']:.2f} s")
        if layout_same is None:
            raw = _layout(os.path.join(work, f"raw-{r}", "data.parquet"))
            zep = _layout(_first_shard(os.path.join(work, f"zephon-{r}")))
            layout_same = raw == zep
            if not layout_same:
                log(f"  {kind}: layouts differ: raw {raw} zephon {zep}")
        for case in cases:
            shutil.rmtree(os.path.join(work, f"{case}-{r}"), ignore_errors=True)
    mb_payload = meta["payload_bytes"] / 1e6
    secs = {c: [x["seconds"] for x in got[c]] for c in cases}
    ratios = [round(a / b, 3) for a, b in zip(secs["raw"], secs["zephon"])]
    from_table = [round(a / b, 3) for a, b in zip(secs["raw"], secs["zephon_arrow"])]
    row = {
        "payload_MB": round(mb_payload, 1), "layout_same": layout_same,
        "seconds": {c: _summary(v) for c, v in secs.items()},
        "MB_per_s": {c: round(mb_payload / statistics.median(v), 1) for c, v in secs.items()},
        "ratio_raw_over_zephon": {"per_run": ratios, "median": statistics.median(ratios)},
        "ratio_raw_over_zephon_arrow": {"per_run": from_table,
                                        "median": statistics.median(from_table)},
        "zephon_stages": _medians([x["stages"] for x in got["zephon"]]),
        "zephon_work": _medians([x["work"] for x in got["zephon"]]),
        "zephon_arrow_stages": _medians([x["stages"] for x in got["zephon_arrow"]]),
        "zephon_arrow_work": _medians([x["work"] for x in got["zephon_arrow"]]),
    }
    if before:
        row["ratio_before_over_after"] = [round(b / a, 3) for a, b in
                                          zip(secs["zephon"], secs["zephon_before"])]
        row["zephon_before_stages"] = _medians([x["stages"] for x in got["zephon_before"]])
        row["zephon_before_work"] = _medians([x["work"] for x in got["zephon_before"]])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=300, help="corpus size (default 300)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--before", default=None, metavar="TREE",
                    help="also convert with the zephon_store of this checkout")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", action="store_true", help="one line of JSON")
    a = ap.parse_args()
    results = {kind: bench_kind(kind, a.mb, a.runs, a.before, a.timeout)
               for kind in a.kinds.split(",")}
    print(json.dumps(results, indent=None if a.json else 1))


if __name__ == "__main__":
    main()

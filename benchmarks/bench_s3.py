#!/usr/bin/env python3
"""Benchmark: streaming from S3 (a local SeaweedFS) with the node-local disk cache.

Starts ``weed mini`` on 127.0.0.1 (``zephon_store.testing.s3_server.SeaweedServer``), creates a bucket, and
converts the text corpus of ``corpora.py`` straight to ``s3://bench/text`` (timed). Then,
each case in a fresh subprocess, ``--runs`` times, interleaved:

- ``raw_cat_file``: s3fs ``cat_file`` of every shard object, whole, one after the other:
  the same bytes as the dataset's shards, as fast as one s3fs client fetches them;
- ``zephon_seq_cold`` / ``zephon_shuffled_cold``: one epoch of ``ZephonLoader`` (batch 256,
  thread path) from S3 into an empty cache directory (``ZEPHON_CACHE_DIR``, a fresh temp dir);
- ``zephon_seq_warm``: the same with the cache filled by a previous process;
- ``ranged_gets`` (only when named in ``--cases``): the same 8 MiB ranged GETs through
  ``Storage`` with zephon's own GET client and with s3fs (``{"s3_client": "s3fs"}``), each
  warmed first: MB/s and MB per CPU second of each (``io/s3_get.py``);
- ``zephon_fetch_cold``: the fetch path alone, no decoding: the loader's prefetcher over
  every row group in order (one per step), each read with ``ds.row_groups.fetch_bytes``
  as the decoder would, into an empty cache.

Reported: MB/s of stored (compressed) shard bytes, ``zephon_seq_cold / raw_cat_file`` (target
>= 0.8), per case the requests (``Storage.stats``: manifest, footers, ranged GETs, any row
group fetched alone) and ``ranged_gets`` (the prefetcher's coalesced ranges), and with
shuffle on: bytes fetched / bytes consumed on one
node (consumed = each row group's stored bytes times the fraction of its rows the epoch
used; target <= 1.2). Finally one process runs two epochs with a cache budget that holds the
dataset and reports the requests and bytes of each epoch (target: none in the second).

The server, client and loader share this machine's CPUs: loopback S3 has no network
limit, so these figures measure CPU cost per byte, not a network's bandwidth.

    python -m benchmarks.bench_s3 --quick --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from . import corpora
from .harness import run_child

BUCKET = "bench"
BATCH = 256
CASES = ["raw_cat_file", "zephon_fetch_cold", "zephon_seq_cold", "zephon_seq_warm",
         "zephon_shuffled_cold"]
# Not a pass over the dataset: the same ranged GETs through each S3 client of Storage.
CLIENT_CASE = "ranged_gets"
RANGE_BYTES = 8 << 20
RANGE_READS = 10


# ----------------------------------------------------------------------------- children


def _shard_objects(url: str, so: dict) -> list[str]:
    from zephon_store.format.manifest import load_manifest
    from zephon_store.io.storage import Storage

    m = load_manifest(Storage(url, storage_options=so))
    return [m.shard_path(i) for i in range(m.num_shards)]


def child_raw(url: str, so: dict) -> dict:
    from zephon_store.io.storage import resolve

    rels = _shard_objects(url, so)
    fs, root = resolve(url, so)
    # The client ready before the clock (its first request builds botocore's client, ~0.2 s
    # of CPU): the baseline is the transfer. zephon's manifest is read by zephon's own GET
    # client, which does not warm s3fs's.
    fs.cat_file(f"{root}/manifest.json")
    t0 = time.perf_counter()
    total = sum(len(fs.cat_file(f"{root}/{rel}")) for rel in rels)
    return {"seconds": time.perf_counter() - t0, "bytes": total, "objects": len(rels)}


def child_ranged_gets(url: str, so: dict) -> dict:
    """``RANGE_READS`` ranged GETs of the first ``RANGE_BYTES`` of the largest shard through
    ``Storage.read_range``, with zephon's GET client and with s3fs (``s3_client``), each
    client warmed by one read first: MB/s and MB per CPU second of each."""
    from zephon_store.format.manifest import load_manifest
    from zephon_store.io.storage import Storage

    m = load_manifest(Storage(url, storage_options=so))
    shard = max(range(m.num_shards), key=lambda i: int(m.shard_bytes[i]))
    n = min(RANGE_BYTES, int(m.shard_bytes[shard]))
    out = {}
    for client in ("auto", "s3fs"):
        st = Storage(url, storage_options={**so, "s3_client": client})
        st.read_range(m.shard_path(shard), 0, 4)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(RANGE_READS):
            st.read_range(m.shard_path(shard), 0, n)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        mb = RANGE_READS * n / 1e6
        out[client] = {"MB_per_s": round(mb / wall, 1), "MB_per_cpu_s": round(mb / cpu, 1)}
    return {"range_bytes": n, "reads": RANGE_READS, **out}


def child_fetch(url: str, so: dict) -> dict:
    from zephon_store import open_dataset

    ds = open_dataset(url, storage_options=so)
    n = ds.manifest.num_row_groups
    t0 = time.perf_counter()
    pre = ds.row_groups.prefetcher(lambda i: [i], num_batches=n)
    total = 0
    for rg in range(n):
        total += len(ds.row_groups.fetch_bytes(rg))
        pre.consumed(rg)
    secs = time.perf_counter() - t0
    pre.close()
    st = ds.storage.stats
    return {"seconds": secs, "stored_bytes": total, "bytes_fetched": st.bytes_fetched,
            "requests": st.requests, "bytes_consumed": total,
            "ranged_gets": ds.row_groups.range_fetcher().ranges}


def child_zephon(url: str, so: dict, *, shuffle: bool, epochs: int = 1) -> dict:
    import numpy as np

    from zephon_store import BatchOptions, SourceOptions, StopOptions, Topology
    from zephon_store.order import OrderOptions
    from zephon_store.torch import ZephonLoader

    order = OrderOptions(seed=0) if shuffle else OrderOptions(seed=0, shuffle=False)
    t0 = time.perf_counter()
    loader = ZephonLoader(url, topology=Topology(BATCH, world_size=1, rank=0), order=order,
                          source=SourceOptions(storage_options=so),
                          batch=BatchOptions(with_seq=True),
                          stop=StopOptions(epochs=float(epochs)))
    ds = loader.dataset
    m = ds.manifest
    per_epoch = []
    seqs = []
    it = iter(loader)
    steps = len(loader)
    per = steps // epochs
    mark = (0, 0, time.perf_counter())
    for i, batch in enumerate(it):
        seqs.append(batch["_seq"].numpy())
        if (i + 1) % per == 0:
            st = ds.storage.stats
            now = time.perf_counter()
            per_epoch.append({"requests": st.requests - mark[0],
                              "bytes_fetched": st.bytes_fetched - mark[1],
                              "seconds": round(now - mark[2], 3)})
            mark = (st.requests, st.bytes_fetched, now)
    secs = time.perf_counter() - t0
    ids = np.concatenate(seqs)
    rg = np.searchsorted(m.rg_row_start, ids, side="right") - 1
    used = np.bincount(rg, minlength=m.num_row_groups)
    consumed = float((m.rg_length * np.minimum(used, m.rg_rows) / m.rg_rows).sum())
    st = ds.storage.stats
    ranges = ds.row_groups.range_fetcher().ranges
    return {"seconds": secs, "samples": int(ids.size), "stored_bytes": int(m.rg_length.sum()),
            "bytes_fetched": st.bytes_fetched, "requests": st.requests, "retries": st.retries,
            "ranged_gets": ranges,
            "bytes_consumed": consumed, "per_epoch": per_epoch,
            "cache": ds.cache.stats.as_dict() if ds.cache is not None else None}


def child_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--so", required=True)
    ap.add_argument("--epochs", type=int, default=1)
    a = ap.parse_args(argv)
    so = json.loads(a.so)
    import pyarrow.parquet  # noqa: F401
    import s3fs  # noqa: F401
    import torch  # noqa: F401

    import zephon_store.torch  # noqa: F401

    if a.child == "raw_cat_file":
        res = child_raw(a.url, so)
    elif a.child == CLIENT_CASE:
        res = child_ranged_gets(a.url, so)
    elif a.child == "zephon_fetch_cold":
        res = child_fetch(a.url, so)
    else:
        res = child_zephon(a.url, so, shuffle="shuffled" in a.child, epochs=a.epochs)
    print(json.dumps(res), flush=True)


# ----------------------------------------------------------------------------- parent


def _spawn(case: str, url: str, so: dict, cache_dir: str, *, epochs: int = 1) -> dict:
    env = dict(os.environ, ZEPHON_CACHE_DIR=cache_dir)
    env.pop("ZEPHON_CACHE_BUDGET", None)   # default 10 GiB: holds the dataset
    return run_child("bench_s3", "--child", case, "--url", url, "--so", json.dumps(so),
                     "--epochs", str(epochs), pkg=corpora.PKG_ROOT, env=env)


def _summary(results: list[dict], mb_of) -> dict:
    secs = [r["seconds"] for r in results]
    med = statistics.median(secs)
    return {"median_s": round(med, 3), "min_s": round(min(secs), 3), "max_s": round(max(secs), 3),
            "stored_MB_per_s": round(mb_of(results[0]) / med, 1)}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        child_main(argv)
        os._exit(0)   # see bench_loader: teardown aborts are not part of the measurement
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=corpora.DEFAULT_MB)
    ap.add_argument("--quick", action="store_true", help=f"--mb {corpora.QUICK_MB}")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated subset of the cases (raw_cat_file always runs); "
                         f"{CLIENT_CASE!r}: the same ranged GETs through zephon's GET client "
                         "and through s3fs")
    a = ap.parse_args(argv)
    cases_run = ["raw_cat_file"] + [c for c in CASES[1:] if c in a.cases.split(",")]
    mb = corpora.QUICK_MB if a.quick else a.mb

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    import s3fs

    SeaweedServer = corpora.checkout_module("s3_server").SeaweedServer

    from zephon_store import convert

    corpus = corpora.ensure("text", mb, log=log)
    work = tempfile.mkdtemp(prefix="zephon-bench-s3-")
    try:
        with SeaweedServer() as server:
            so = server.storage_options(read_timeout=60, connect_timeout=5)
            fs = s3fs.S3FileSystem(**so, skip_instance_cache=True)
            with contextlib.suppress(FileExistsError):
                fs.mkdir(BUCKET)
            url = f"s3://{BUCKET}/text"
            t0 = time.perf_counter()
            res = convert([os.path.join(corpus["dir"], "input")], url, storage_options=so,
                          workers=2, progress=False,
                          staging_dir=os.path.join(work, "staging"))
            t_convert = time.perf_counter() - t0
            log(f"converted to {url}: {res.num_shards} shards, {res.total_bytes / 1e6:.1f} MB "
                f"in {t_convert:.1f} s")
            raw: dict[str, list[dict]] = {c: [] for c in cases_run}
            for r in range(a.runs):
                warm_dir = os.path.join(work, f"warm-{r}")
                if "zephon_seq_warm" in cases_run:   # fill the warm cache; not timed
                    _spawn("zephon_seq_cold", url, so, warm_dir)
                for case in cases_run:
                    cache = warm_dir if case == "zephon_seq_warm" else os.path.join(
                        work, f"{case}-{r}")
                    raw[case].append(_spawn(case, url, so, cache))
                    log(f"  run {r} {case}: {raw[case][-1]['seconds']:.2f} s")
            two = _spawn("zephon_shuffled_cold", url, so, os.path.join(work, "two-epochs"),
                         epochs=2)
            clients = [_spawn(CLIENT_CASE, url, so, os.path.join(work, f"gets-{r}"))
                       for r in range(a.runs)] if CLIENT_CASE in a.cases.split(",") else []
            server_info = {"weed": server.weed}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    stored = raw["raw_cat_file"][0]["bytes"]
    cases = {"raw_cat_file": _summary(raw["raw_cat_file"], lambda r: r["bytes"] / 1e6)}
    for case in cases_run[1:]:
        cases[case] = _summary(raw[case], lambda r: r["stored_bytes"] / 1e6)
        last = raw[case][-1]
        cases[case].update({"bytes_fetched": last["bytes_fetched"], "requests": last["requests"],
                            "ranged_gets": last.get("ranged_gets"),
                            "fetched_over_consumed": round(
                                last["bytes_fetched"] / last["bytes_consumed"], 3)})
    def rate(case: str) -> float | None:
        return cases[case]["stored_MB_per_s"] if case in cases else None

    ratios = {}
    for num, den in (("zephon_seq_cold", "raw_cat_file"), ("zephon_fetch_cold", "raw_cat_file"),
                     ("zephon_seq_warm", "zephon_seq_cold")):
        if rate(num) is not None and rate(den) is not None:
            ratios[f"{num}/{den}"] = round(rate(num) / rate(den), 3)
    ratio = ratios.get("zephon_seq_cold/raw_cat_file")
    amp = cases.get("zephon_shuffled_cold", {}).get("fetched_over_consumed")
    second = two["per_epoch"][1] if len(two["per_epoch"]) > 1 else None
    out = {"mb": mb, "runs": a.runs, "server": server_info,
           "dataset": {"url": url, "shards": res.num_shards, "row_groups": res.num_row_groups,
                       "stored_bytes": stored, "convert_to_s3_s": round(t_convert, 1),
                       "convert_input_MB_per_s": round(corpus["input_bytes"] / 1e6 / t_convert,
                                                       1)},
           "cases": cases, "ratios": ratios, CLIENT_CASE: clients,
           "two_epochs_shuffled": {"per_epoch": two["per_epoch"], "cache": two["cache"]},
           "targets": {
               "zephon_seq_cold >= 0.8x raw cat_file": "not measured" if ratio is None
               else "met" if ratio >= 0.8 else f"missed ({ratio})",
               "fetched/consumed (shuffled, one node) <= 1.2": "not measured" if amp is None
               else "met" if amp <= 1.2 else f"missed ({amp})",
               "second epoch fetches nothing": "not measured" if second is None else (
                   "met" if second["bytes_fetched"] == 0
                   else f"missed ({second['bytes_fetched']} bytes)")}}
    print(json.dumps(out, indent=None if a.json else 1))
    return out


if __name__ == "__main__":
    main()

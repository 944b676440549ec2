#!/usr/bin/env python3
"""Benchmark: Grain's random-access ``ZephonSource`` indexed by Zephon's order, with and
without its decode-ahead.

The text corpus of ``benchmarks/corpora.py`` (the Python standard library's sources as
JSONL, ``--mb`` MB; only the Zephon copy, converted with the default ``WriteOptions``) is
read as a Grain pipeline does: ``grain.MapDataset.source(src).map(work).to_iter_dataset(
grain.ReadOptions(num_threads=T))`` over one epoch of positions (``--grain-threads T``:
Grain's own read-ahead, 16 threads by default; 0 reads in the iterating thread), ``work`` splitting each record's text into words (a stand-in
for a tokenizer: Python work in the reading thread). ``src`` is
``ZephonSource(ds, order=OrderOptions(seed=7, lanes=1), columns=["text"])``; the cases:

- ``ahead``: ``read_ahead=ReadAheadOptions(decode_ahead_bytes=32 << 20)`` (a remote
  source's default), the next 32 MiB of decoded row groups queued in the source's threads
  after each read;
- ``none``: ``read_ahead=ReadAheadOptions(decode_ahead_bytes=0)``: each row group decoded
  when a record of it is first asked for.

Each run is a fresh subprocess (cold decoded row groups, warm page cache), the cases
interleaved ``--runs`` times; wall time of the epoch (from the first record asked for) and
the process's CPU time; medians and the ratio of the medians.

``--s3-latency-ms L``: the dataset is converted to a local S3 server (SeaweedFS ``weed
mini`` on 127.0.0.1) and read through ``zephon_store.testing.s3_proxy.CountingProxy``, which
delays every request by ``L`` ms (a remote store's time to first byte); each run reads
through a fresh disk cache, so every row group is one GET.

    python -m benchmarks.bench_grain_source --mb 60 --runs 5 --json
    python -m benchmarks.bench_grain_source --mb 60 --runs 5 --s3-latency-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time

from . import corpora
from .harness import BENCH_DIR, run_child

SEED = 7


def dataset(mb: int) -> str:
    """The text corpus converted with the default WriteOptions (built once, cached)."""
    root = os.path.join(BENCH_DIR, "grain-source", f"text-{mb}mb-v{corpora.VERSION}")
    out = os.path.join(root, "zephon")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        from zephon_store import convert

        inp = os.path.join(root, "input")
        os.makedirs(inp, exist_ok=True)
        corpora._write_text_input(inp, mb)
        convert([inp], out, progress=False)
    return out


def child(url: str, case: str, options: str = "{}", threads: str = "16") -> dict:
    """One epoch through a Grain pipeline over the source; wall and CPU seconds.
    ``options``: JSON of the SourceOptions (a remote dataset's storage options and cache)."""
    import grain

    from zephon_store import OrderOptions, ReadAheadOptions, SourceOptions
    from zephon_store.grain import ZephonSource

    ahead = ReadAheadOptions(decode_ahead_bytes=(32 << 20) if case == "ahead" else 0)
    src = ZephonSource(url, order=OrderOptions(seed=SEED, lanes=1), columns=["text"],
                       read_ahead=ahead, source=SourceOptions(**json.loads(options)))
    pipeline = grain.MapDataset.source(src).map(lambda r: len(r["text"].split()))
    it = iter(pipeline.to_iter_dataset(grain.ReadOptions(num_threads=int(threads))))
    t0, c0 = time.perf_counter(), time.process_time()
    words = sum(it)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    src.close()
    return {"case": case, "records": len(src), "words": words, "wall_s": wall, "cpu_s": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=corpora.QUICK_MB)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--s3-latency-ms", type=float, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--grain-threads", type=int, default=16,
                    help="Grain's ReadOptions.num_threads (16: Grain's default; 0: none)")
    ap.add_argument("--child", nargs=4, metavar=("URL", "CASE", "OPTIONS", "THREADS"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(*a.child)))
        return
    local = dataset(a.mb)
    with contextlib.ExitStack() as stack:
        url, options = (local, {}) if a.s3_latency_ms is None else _on_s3(
            stack, local, a.s3_latency_ms / 1e3)
        got = _runs(url, options, a.runs, stack, a.grain_threads)
    words = {r["words"] for runs in got.values() for r in runs}
    assert len(words) == 1, f"the cases read different records: {words}"
    out = {"mb": a.mb, "records": got["ahead"][0]["records"], "runs": a.runs,
           "s3_latency_ms": a.s3_latency_ms, "grain_threads": a.grain_threads}
    for case, runs in got.items():
        out[case] = {k: {"median": statistics.median(r[k] for r in runs),
                         "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)}
                     for k in ("wall_s", "cpu_s")}
    out["wall_ratio_none_over_ahead"] = (out["none"]["wall_s"]["median"]
                                         / out["ahead"]["wall_s"]["median"])
    if a.json:
        print(json.dumps(out))
    else:
        for case in got:
            w, c = out[case]["wall_s"], out[case]["cpu_s"]
            print(f"{case:6s} wall {w['median']:.3f} s ({w['min']:.3f}-{w['max']:.3f}), "
                  f"cpu {c['median']:.3f} s")
        print(f"none / ahead (wall, medians): {out['wall_ratio_none_over_ahead']:.2f}x")


def _runs(url: str, options: dict, runs: int, stack, threads: int) -> dict[str, list[dict]]:
    """The cases interleaved ``runs`` times, each a fresh subprocess (and, remote, a fresh
    disk cache)."""
    got: dict[str, list[dict]] = {"ahead": [], "none": []}
    for _ in range(runs):
        for case in got:
            opts = dict(options)
            if options:
                opts["cache"] = stack.enter_context(tempfile.TemporaryDirectory())
            got[case].append(run_child("bench_grain_source", "--child", url, case,
                                       json.dumps(opts), str(threads)))
    return got


def _on_s3(stack, local: str, latency: float) -> tuple[str, dict]:
    """The local dataset's inputs converted to a local S3 server, read through a proxy that
    delays every request by ``latency`` seconds: (its URL, its storage options)."""
    import s3fs

    from zephon_store import convert

    server = stack.enter_context(corpora.checkout_module("s3_server").SeaweedServer())
    proxy = stack.enter_context(
        corpora.checkout_module("s3_proxy").CountingProxy(server.ports["s3"]))
    so = server.storage_options(read_timeout=60, connect_timeout=5)
    s3fs.S3FileSystem(**so, skip_instance_cache=True).mkdir("bench")
    url = "s3://bench/text"
    convert([os.path.join(os.path.dirname(local), "input")], url, storage_options=so,
            progress=False)
    proxy.latency(latency)
    return url, {"storage_options": server.storage_options(proxy.endpoint_url(),
                                                           read_timeout=60, connect_timeout=5)}


if __name__ == "__main__":
    main()

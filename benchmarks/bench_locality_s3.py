#!/usr/bin/env python3
"""Benchmark: read amplification per node on the real path (SeaweedFS S3), next to ``plan``.

Starts ``weed mini`` on 127.0.0.1 (``zephon_store.testing.s3_server.SeaweedServer``), writes
``--row-groups`` row groups of 20 records (each record ``--record-bytes`` of incompressible
text, so a row group is larger than the coalescer's 64 KiB gap and a node never reads a
neighbour it does not need as filler) and converts them to ``s3://bench/locality``.

For each simulated node count ``M`` (``--nodes``, default 2, 4, 8): ``W = 8 * M`` ranks,
8 samples per rank per step, default options (``lanes="auto"``, resolved by the loader from
the dataset and ``M``), the full steps of one epoch (``epochs=1``; the simulator runs the
same ``N // B`` steps). Each node is one
process with its own empty cache directory (``ZEPHON_CACHE_DIR``), running its ranks'
``ZephonLoader`` (``topology=Topology(8 * W, W, r, ranks_per_node=8)``) one after the other
over one shared ``Dataset`` (so the node's ranks share its disk cache, as on a real node). Reported
per node: bytes fetched from S3 (``Storage.stats.bytes_fetched``) / bytes consumed (each
row group's stored bytes times the fraction of its rows the node's ranks used), also without
the bytes read when the dataset is opened (manifest, side tables: the same for every node,
so they weigh more as a node's share shrinks), next to ``simulate``'s figure for the same
node (target: every node <= 1.2).

Then W = 1 throughput, before/after: one epoch of ``ZephonLoader`` (batch 256, default
options, cold cache) with this tree and, given ``--before DIR`` (a directory holding an
older ``zephon_store/``, e.g. ``git archive 598b993 zephon_store | tar -x -C DIR``),
with that tree, alternating, ``--runs`` times each; samples/s medians and their ratio.

    python -m benchmarks.bench_locality_s3 --before /tmp/before --json
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from .harness import ROOT, run_child

BUCKET = "bench"
ROWS = 20            # rows per row group, as in issue 21's datasets
RANKS_PER_NODE = 8
PER_RANK = 8         # samples per rank per step
W1_BATCH = 256


# ----------------------------------------------------------------------------- children


def child_node(url: str, so: dict, nodes: int, node: int) -> dict:
    import numpy as np

    from zephon_store import BatchOptions, StopOptions, Topology, as_numpy, open_dataset
    from zephon_store.torch import ZephonLoader

    world = nodes * RANKS_PER_NODE
    ds = open_dataset(url, storage_options=so)
    at_open = ds.storage.stats.bytes_fetched     # manifest and side tables, per node
    seqs, lanes = [], None
    t0 = time.perf_counter()
    for rank in range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE):
        loader = ZephonLoader(ds, topology=Topology(PER_RANK * world, world, rank,
                                                    ranks_per_node=RANKS_PER_NODE),
                              seed=0, stop=StopOptions(epochs=1.0),
                              batch=BatchOptions(with_seq=True, collate=as_numpy))
        lanes = loader.order.lanes
        seqs += [batch["_seq"] for batch in loader]
    m = ds.manifest
    ids = np.concatenate(seqs)
    rg = np.searchsorted(m.rg_row_start, ids, side="right") - 1
    used = np.bincount(rg, minlength=m.num_row_groups)
    consumed = float((m.rg_length * used / m.rg_rows).sum())
    st = ds.storage.stats
    return {"seconds": time.perf_counter() - t0, "samples": int(ids.size), "lanes": lanes,
            "bytes_fetched": st.bytes_fetched, "bytes_at_open": at_open,
            "requests": st.requests,
            "bytes_consumed": consumed}


def child_w1(url: str, so: dict) -> dict:
    from zephon_store import BatchOptions, SourceOptions, StopOptions, Topology, as_numpy
    from zephon_store.torch import ZephonLoader

    t0 = time.perf_counter()
    loader = ZephonLoader(url, topology=Topology(W1_BATCH, world_size=1, rank=0), seed=0,
                          source=SourceOptions(storage_options=so),
                          stop=StopOptions(epochs=1.0, drop_last=False),
                          batch=BatchOptions(collate=as_numpy))
    samples = sum(len(batch["text"]) for batch in loader)
    secs = time.perf_counter() - t0
    return {"seconds": secs, "samples": samples, "samples_per_s": samples / secs,
            "bytes_fetched": loader.dataset.storage.stats.bytes_fetched}


def child_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True, choices=["node", "w1"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--so", required=True)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--node", type=int, default=0)
    a = ap.parse_args(argv)
    so = json.loads(a.so)
    res = (child_node(a.url, so, a.nodes, a.node) if a.child == "node"
           else child_w1(a.url, so))
    print(json.dumps(res), flush=True)


# ----------------------------------------------------------------------------- parent


def _spawn(pkg: str, cache_dir: str, *args: str) -> dict:
    env = dict(os.environ, ZEPHON_CACHE_DIR=cache_dir)
    env.pop("ZEPHON_CACHE_BUDGET", None)
    return run_child("bench_locality_s3", *args, pkg=pkg, env=env)


def _write_input(directory: str, row_groups: int, record_bytes: int) -> None:
    """JSONL records of incompressible text (random bytes, base64), deterministic."""
    import numpy as np

    rng = np.random.default_rng(21)
    os.makedirs(directory, exist_ok=True)
    raw = record_bytes * 3 // 4
    per_file = 50 * ROWS
    for f in range(-(-row_groups * ROWS // per_file)):
        with open(os.path.join(directory, f"part-{f:04d}.jsonl"), "w") as out:
            for _ in range(min(per_file, row_groups * ROWS - f * per_file)):
                text = base64.b64encode(rng.bytes(raw)).decode()
                out.write(json.dumps({"text": text}) + "\n")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        child_main(argv)
        os._exit(0)   # as bench_s3: interpreter teardown is not part of the measurement
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row-groups", type=int, default=1000)
    ap.add_argument("--record-bytes", type=int, default=6000)
    ap.add_argument("--nodes", default="2,4,8")
    ap.add_argument("--before", default=None, help="directory holding an older zephon_store/")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    import numpy as np
    import s3fs

    from zephon_store import WriteOptions, convert, open_dataset
    from zephon_store.order import OrderOptions, Topology
    from zephon_store.runs.simulate import simulate
    from zephon_store.testing.s3_server import SeaweedServer

    work = tempfile.mkdtemp(prefix="zephon-bench-locality-")
    rows = []
    w1: dict[str, list[float]] = {"after": [], "before": []}
    try:
        _write_input(os.path.join(work, "input"), a.row_groups, a.record_bytes)
        with SeaweedServer() as server:
            so = server.storage_options(read_timeout=60, connect_timeout=5)
            fs = s3fs.S3FileSystem(**so, skip_instance_cache=True)
            with contextlib.suppress(FileExistsError):
                fs.mkdir(BUCKET)
            url = f"s3://{BUCKET}/locality"
            res = convert([os.path.join(work, "input")], url, storage_options=so,
                          options=WriteOptions(row_group_rows=ROWS, row_group_bytes=None),
                          progress=False, staging_dir=os.path.join(work, "staging"))
            m = open_dataset(url, storage_options=so).manifest
            log(f"{url}: {m.num_row_groups} row groups of {ROWS}, "
                f"{res.total_bytes / 1e6:.1f} MB, median row group "
                f"{int(np.median(m.rg_length)) / 1e3:.0f} kB")
            for nodes in [int(x) for x in a.nodes.split(",")]:
                world = nodes * RANKS_PER_NODE
                topo = Topology(PER_RANK * world, world, ranks_per_node=RANKS_PER_NODE)
                options = OrderOptions(seed=0).resolved(
                    m.num_row_groups, m.num_samples, nodes=nodes,
                    node_batch=PER_RANK * RANKS_PER_NODE)
                sim = simulate(m, options, topo, steps=m.num_samples // topo.global_batch)
                for node in range(nodes):
                    got = _spawn(ROOT, os.path.join(work, f"cache-{nodes}-{node}"), "--child",
                                 "node", "--url", url, "--so", json.dumps(so),
                                 "--nodes", str(nodes), "--node", str(node))
                    row = {"nodes": nodes, "world_size": world, "node": node,
                           "lanes": got["lanes"], "samples": got["samples"],
                           "bytes_fetched": got["bytes_fetched"],
                           "bytes_consumed": round(got["bytes_consumed"]),
                           "measured": round(got["bytes_fetched"] / got["bytes_consumed"], 4),
                           "measured_row_groups": round(
                               (got["bytes_fetched"] - got["bytes_at_open"])
                               / got["bytes_consumed"], 4),
                           "plan": sim["nodes"][node]["read_amplification"],
                           "requests": got["requests"]}
                    rows.append(row)
                    log(f"  M={nodes} node {node}: measured {row['measured']} (row groups "
                        f"{row['measured_row_groups']}) plan "
                        f"{row['plan']} (P={row['lanes']}, {got['seconds']:.1f} s)")
            trees = [("after", ROOT)] + ([("before", a.before)] if a.before else [])
            for r in range(a.runs):
                for name, pkg in trees:
                    got = _spawn(pkg, os.path.join(work, f"w1-{name}-{r}"), "--child", "w1",
                                 "--url", url, "--so", json.dumps(so))
                    w1[name].append(got["samples_per_s"])
                    log(f"  W=1 {name} run {r}: {got['samples_per_s']:.0f} samples/s")
            weed = server.weed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: round(statistics.median(v), 1) for k, v in w1.items() if v}
    worst = max(r["measured"] for r in rows)
    out = {"row_groups": a.row_groups, "rows_per_row_group": ROWS,
           "record_bytes": a.record_bytes, "ranks_per_node": RANKS_PER_NODE,
           "samples_per_rank_per_step": PER_RANK, "server": weed, "per_node": rows,
           "worst_measured": worst, "w1_samples_per_s": med,
           "w1_after_over_before": (round(med["after"] / med["before"], 3)
                                    if "before" in med else None),
           "targets": {"every node <= 1.2": worst <= 1.2}}
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for r in rows:
            print(f"M={r['nodes']:>2} node {r['node']}: measured {r['measured']:.3f} "
                  f"(row groups {r['measured_row_groups']:.3f})  "
                  f"plan {r['plan']:.3f}  (P={r['lanes']})")
        print(f"W=1 samples/s: {med}; after/before {out['w1_after_over_before']}")
    return out


if __name__ == "__main__":
    main()

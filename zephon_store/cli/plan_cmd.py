"""``zephon plan``: which sample ids each rank gets per step, and what that costs to read.

Pure computation over the manifest: no shard byte is read.
"""

from __future__ import annotations

import argparse

import numpy as np

from .common import UsageError, build_options, emit, positive_int, size_arg

# AWS S3's documented floor per partitioned prefix (GET/HEAD per second); beyond it S3 answers
# 503 SlowDown while it repartitions. Content-hashed shard keys spread over partitions only
# after S3 has split the prefix, so a cold bucket is held to this.
S3_PREFIX_GETS_PER_S = 5500
# A node start's metadata GETs: manifest.json and the shard and row-group side tables, once
# per node (docs/storage.md, "The start"); before issue 31 every rank made a HEAD + GET of each.
METADATA_GETS_PER_NODE = 3
METADATA_REQUESTS_PER_RANK_BEFORE = 6


def _steps(text: str) -> tuple[int, int]:
    try:
        a, b = text.split(":")
        lo, hi = int(a or 0), int(b)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--steps takes A:B (e.g. 0:4), got {text!r}") from exc
    if lo < 0 or hi <= lo:
        raise argparse.ArgumentTypeError(f"--steps A:B needs 0 <= A < B, got {text!r}")
    return lo, hi


def _lanes(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--lanes takes an int or 'auto', got {text!r}") from exc


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="print which samples each rank reads per step, and simulate "
                       "read amplification, row groups per step and cache footprint")
    p.add_argument("url", nargs="?", help="dataset URL (or --mixture FILE)")
    p.add_argument("--mixture", default=None, metavar="FILE",
                   help="plan a mixture file instead: per stage the realised proportions, "
                        "each source's epochs consumed and the step a capped source runs out")
    p.add_argument("--world-size", type=int, required=True, metavar="W")
    p.add_argument("--global-batch", type=int, required=True, metavar="B")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="DataLoader workers per rank (shows which worker makes each step)")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--seed", type=int, default=None,
                   help="default: the --mixture file's seed, else 0; a --seed that "
                        "disagrees with the file's is refused, as the loader refuses it")
    p.add_argument("--no-shuffle", action="store_true", help="sequential order")
    p.add_argument("--window-blocks", type=int, default=None, metavar="K")
    p.add_argument("--lanes", type=_lanes, default=None, metavar="P",
                   help="lane count, or 'auto' (the default: resolved from the dataset and the "
                        "node count the run starts on, as the loader does)")
    p.add_argument("--start-nodes", type=positive_int, default=None, metavar="M0",
                   help="resolve --lanes auto for a run that started on M0 nodes (default: "
                        "this plan's node count); shows a resume at another node count")
    p.add_argument("--steps", type=_steps, default=(0, 2), metavar="A:B",
                   help="steps to print (default 0:2)")
    p.add_argument("--cursor", type=int, default=0, help="start from this cursor, not step 0")
    p.add_argument("--simulate-steps", type=positive_int, default=None,
                   help="steps to simulate for the read figures (default: one epoch, <= 20000)")
    p.add_argument("--start-window", type=float, default=None, metavar="SECONDS",
                   help="also estimate the fleet's start: the requests every node makes for "
                        "its first batch (metadata, footers, coalesced row-group GETs), in "
                        "total, and the request rate if every node starts within SECONDS")
    p.add_argument("--bandwidth", type=float, default=None, metavar="MBPS",
                   help="also predict the first step rank 0 will wait for data if storage "
                        "delivers MBPS MB/s to it (the loader's stall forecast, before launch)")
    p.add_argument("--step-time", type=float, default=None, metavar="SECONDS",
                   help="with --bandwidth: the training loop's own time per step (required)")
    p.add_argument("--prefetch-bytes", type=size_arg, default=None, metavar="SIZE",
                   help="with --bandwidth: the loader's prefetch_bytes (default 64MiB)")
    p.add_argument("--json", action="store_true")
    from .common import add_storage_options

    add_storage_options(p)


def cmd_plan(args) -> int:
    from ..format.manifest import load_manifest
    from ..io.storage import Storage
    from ..order.assign import batch_owner, step_cursor
    from ..order.order import Order, OrderOptions
    from ..order.topology import Topology
    from ..runs.simulate import rank_ids, simulate

    if args.cursor < 0:
        raise UsageError(f"--cursor must be >= 0, got {args.cursor}")
    if args.mixture is not None:
        from .mixture_cmd import plan_mixture

        return plan_mixture(args)
    if args.url is None:
        raise UsageError("give a dataset URL (or --mixture FILE)")
    kw = {"seed": 0 if args.seed is None else args.seed, "shuffle": not args.no_shuffle}
    if args.window_blocks is not None:
        kw["window_blocks"] = args.window_blocks
    if args.lanes is not None:
        kw["lanes"] = args.lanes
    options = build_options(OrderOptions, **kw)
    topology = build_options(Topology, global_batch=args.global_batch,
                             world_size=args.world_size,
                             ranks_per_node=min(args.ranks_per_node, args.world_size))
    m = load_manifest(Storage(args.url, storage_options=args.storage_options))
    requested = options.lanes
    # As the loader does at a run's first start: "auto" from the dataset and the nodes (each
    # node taking ranks_per_node ranks' share of the batch).
    options = options.resolved(
        m.num_row_groups, m.num_samples,
        nodes=args.start_nodes or topology.num_nodes,
        node_batch=topology.local_batch * topology.ranks_per_node)
    order = Order(m.rg_rows, options)
    lo, hi = args.steps
    steps = []
    for s in range(lo, hi):
        cursor = step_cursor(args.cursor, s, args.global_batch)
        steps.append({"step": s, "cursor": cursor,
                      "worker": batch_owner(s, args.workers),
                      "ranks": [ids.tolist() for ids in rank_ids(order, topology, cursor)]})
    sim = simulate(m, options, topology, cursor=args.cursor, steps=args.simulate_steps)
    if args.start_window is not None:
        if not args.start_window > 0:
            raise UsageError(f"--start-window must be > 0 seconds, got {args.start_window}")
        sim["start"] = start_requests(m, rank_ids(order, topology, args.cursor),
                                      topology.ranks_per_node, window=args.start_window)
    out = {"dataset_id": m.dataset_id, "num_samples": m.num_samples,
           "world_size": args.world_size, "global_batch": args.global_batch,
           "num_workers": args.workers, "ranks_per_node": topology.ranks_per_node,
           "order": options.to_dict(), "lanes_requested": requested, "steps": steps, **sim}
    if args.bandwidth is not None:
        out["bandwidth"] = bandwidth_forecast(args, options, topology)
    if args.json:
        emit(out)
        return 0
    print(f"dataset {m.dataset_id}: {m.num_samples} samples, {m.num_row_groups} row groups")
    print(f"W={args.world_size} B={args.global_batch} nodes={sim['num_nodes']} "
          f"lanes={sim['effective_lanes']} (asked: {requested}; lane order: {sim['lane_order']})")
    for st in steps:
        print(f"step {st['step']} (cursor {st['cursor']}, worker {st['worker']}):")
        for r, ids in enumerate(st["ranks"]):
            shown = ids if len(ids) <= 16 else ids[:16] + ["..."]
            print(f"  rank {r}: {shown}")
    print(f"read amplification {sim['read_amplification']} (worst node "
          f"{sim['read_amplification_max_node']}) over {sim['simulated_steps']} steps; "
          f"row groups/step/node {sim['distinct_row_groups_per_step_per_node']}; "
          f"cache footprint {sim['cache_footprint_bytes_max'] / 1e6:.1f} MB")
    if "start" in sim:
        _print_start(sim["start"])
    if "bandwidth" in out:
        print(out["bandwidth"]["message"])
    return 0


def rank0_need(ds, options, topology, *, cursor: int, steps: int) -> list[float]:
    """The bytes each of rank 0's first ``steps`` steps from ``cursor`` fetch, with nothing
    on the node yet: the loader's own count (:func:`~zephon_store.observe.stall.step_need`
    over its :class:`~zephon_store.load.share_reader.ShareReader`)."""
    from ..load.share_reader import ShareReader
    from ..observe.stall import step_need
    from ..order.topology import Topology

    rank0 = Topology(topology.global_batch, topology.world_size, 0, topology.ranks_per_node)
    reader = ShareReader(ds, options, rank0, start_cursor=cursor)
    return step_need(reader.step_row_groups, ds.manifest.rg_length, range(steps))


def bandwidth_forecast(args, options, topology) -> dict:
    """``zephon plan --bandwidth``: rank 0's coming steps, from ``--cursor``, with nothing on
    the node yet, through the loader's own forecast (:mod:`zephon_store.observe.stall`):
    the first step's wait (the start) and the first later step that waits."""
    from ..io.prefetch import DEFAULT_PREFETCH_BYTES
    from ..observe.stall import Stall, stall_message
    from ..read.dataset import open_dataset

    if not args.bandwidth > 0:
        raise UsageError(f"--bandwidth must be > 0 MB/s, got {args.bandwidth}")
    if args.step_time is None or not args.step_time > 0:
        raise UsageError("--bandwidth needs --step-time SECONDS > 0: the training loop's own "
                         "time per step (measure a few steps, or take it from a profile)")
    budget = DEFAULT_PREFETCH_BYTES if args.prefetch_bytes is None else args.prefetch_bytes
    steps = args.simulate_steps or 2000
    with open_dataset(args.url, storage_options=args.storage_options) as ds:
        need = rank0_need(ds, options, topology, cursor=args.cursor, steps=steps)
    rate = args.bandwidth * 1e6
    stall = Stall.first(need, rate=rate, step_s=args.step_time, budget=budget)
    out = {"mbps": args.bandwidth, "step_time_s": args.step_time, "prefetch_bytes": budget,
           "steps_forecast": len(need), "first_step_wait_s": round(need[0] / rate, 3),
           "need_mbps": round(sum(need) / (len(need) * args.step_time) / 1e6, 2),
           "stall": None}
    if stall is None:
        msg = (f"at {args.bandwidth:g} MB/s and {args.step_time:g} s a step, rank 0 waits "
               f"~{out['first_step_wait_s']:.2g} s for its first step and then keeps up over "
               f"{len(need)} steps (they need {out['need_mbps']:g} MB/s on average)")
    else:
        out["stall"] = {"step": stall.step, "wait_s": round(stall.wait_s, 3),
                        "need_mbps": round(stall.need_bps / 1e6, 2)}
        msg = (f"rank 0 waits ~{out['first_step_wait_s']:.2g} s for its first step; then "
               + stall_message(stall).removeprefix(
                   "zephon: "))
    out["message"] = msg
    return out


def start_requests(manifest, ids_per_rank, ranks_per_node: int, *, window: float) -> dict:
    """What a fleet's start asks storage for, from the manifest alone.

    Per node: the metadata GETs (3: one process fetches each object for the node), one
    footer GET per shard its first step reads, one GET per row-group chunk of a format-v4
    index its row groups fall in (formats/SPEC.md 4.1), and one ranged GET per coalesced run
    of the row groups it reads (``coalesce_ranges``, as the prefetcher groups them); every other
    request of the node's processes is served by its disk cache. In total and as a rate if
    all nodes start evenly within ``window`` seconds, against S3's 5,500 GET/s per prefix;
    ``hot_object_gets_per_s``: the rate every node's GET of ``manifest.json`` (and of each
    side table) puts on that one object. ``before``: the metadata requests of a node before
    issue 31 (a HEAD and a GET of 3 objects per rank).
    """
    from ..format.index import locate
    from ..io.coalesce import RowGroupSpan, coalesce_ranges

    nodes = -(-len(ids_per_rank) // ranks_per_node)
    footers, ranges, chunks = [], [], []
    details = getattr(manifest, "details", None)
    for n in range(nodes):
        ids = np.concatenate(ids_per_rank[n * ranks_per_node:(n + 1) * ranks_per_node])
        rgs = np.unique(locate(manifest, ids).row_group)
        footers.append(int(np.unique(manifest.rg_shard[rgs]).size))
        chunks.append(0 if details is None else int(np.unique(rgs // details.per_chunk).size))
        ranges.append(len(coalesce_ranges(
            RowGroupSpan(int(rg), int(manifest.rg_offset[rg]), int(manifest.rg_length[rg]),
                         int(manifest.rg_shard[rg])) for rg in rgs)))
    per_node = [METADATA_GETS_PER_NODE + f + r + c for f, r, c in zip(footers, ranges, chunks)]
    total = int(sum(per_node))
    rate = total / window
    return {
        "nodes": nodes, "ranks_per_node": ranks_per_node, "window_s": window,
        "metadata_per_node": METADATA_GETS_PER_NODE,
        "footers_per_node_max": max(footers), "row_group_gets_per_node_max": max(ranges),
        "index_chunks_per_node_max": max(chunks),
        "requests_per_node_mean": round(total / nodes, 1), "requests_per_node_max": max(per_node),
        "requests_total": total, "gets_per_s": round(rate, 1),
        "hot_object_gets_per_s": round(nodes / window, 1),
        "s3_prefix_gets_per_s": S3_PREFIX_GETS_PER_S,
        "fits_one_prefix": rate <= S3_PREFIX_GETS_PER_S,
        "min_window_s": round(total / S3_PREFIX_GETS_PER_S, 2),
        "before": {"metadata_per_node": METADATA_REQUESTS_PER_RANK_BEFORE * ranks_per_node,
                   "requests_total": total + nodes * (
                       METADATA_REQUESTS_PER_RANK_BEFORE * ranks_per_node
                       - METADATA_GETS_PER_NODE)},
    }


def _print_start(st: dict) -> None:
    print(f"start of {st['nodes']} nodes x {st['ranks_per_node']} ranks within "
          f"{st['window_s']:g} s: {st['requests_per_node_mean']} requests per node (max "
          f"{st['requests_per_node_max']}: {st['metadata_per_node']} metadata, "
          f"{st['footers_per_node_max']} footers, {st['index_chunks_per_node_max']} index "
          f"chunks, {st['row_group_gets_per_node_max']} row-group "
          f"GETs), {st['requests_total']} in total, {st['gets_per_s']} GET/s "
          f"({'within' if st['fits_one_prefix'] else 'ABOVE'} S3's "
          f"{st['s3_prefix_gets_per_s']}/s per prefix; the shortest window that fits: "
          f"{st['min_window_s']} s); manifest.json gets {st['hot_object_gets_per_s']} GET/s; "
          f"before issue 31: {st['before']['requests_total']} in total")

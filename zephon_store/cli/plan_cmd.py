"""``zephon plan``: which sample ids each rank gets per step, and what that costs to read.

Pure computation over the manifest: no shard byte is read.
"""

from __future__ import annotations

import argparse

from .common import UsageError, build_options, emit, positive_int


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
    p.add_argument("--json", action="store_true")
    from .common import add_storage_options

    add_storage_options(p)


def cmd_plan(args) -> int:
    from ..format.manifest import load_manifest
    from ..io.storage import Storage
    from ..load.simulate import rank_ids, simulate
    from ..order.assign import batch_owner, step_cursor
    from ..order.order import Order, OrderOptions
    from ..order.topology import Topology

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
    out = {"dataset_id": m.dataset_id, "num_samples": m.num_samples,
           "world_size": args.world_size, "global_batch": args.global_batch,
           "num_workers": args.workers, "ranks_per_node": topology.ranks_per_node,
           "order": options.to_dict(), "lanes_requested": requested, "steps": steps, **sim}
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
    return 0

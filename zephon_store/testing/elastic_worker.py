#!/usr/bin/env python3
"""One phase of an elastic job, run by torchrun: resume, consume steps, checkpoint.

Each rank builds a :class:`~zephon_store.torch.ZephonLoader` (world size and rank from
torchrun), optionally restores it from a ``torch.distributed.checkpoint`` (DCP) directory,
consumes ``--steps`` global steps, then saves the loader state with DCP. The loader state
is replicated (identical on every rank), so DCP stores each value once and any world size
can load it.

    torchrun --standalone --nproc_per_node=4 -m zephon_store.testing.elastic_worker \\
        DATASET --global-batch 12 --steps 20 --save ckpt/1 --run-log run.jsonl \\
        --log-dir logs --tag phase1
    torchrun --standalone --nproc_per_node=3 -m zephon_store.testing.elastic_worker \\
        DATASET --global-batch 12 --steps 30 --num-workers 2 --load ckpt/1 --save ckpt/2 \\
        --run-log run.jsonl --log-dir logs --tag phase2

Two records, for two questions:

- ``--run-log``: the loader appends the phase's segment to the run log, the one record of
  what a run consumed; ``zephon audit``, ``trace`` and ``where``
  (:class:`~zephon_store.runs.accounting.RunContext`) read it.
- ``--log-dir``: what the batches actually held, which a run log (positions and the order
  that places samples there) cannot show: ``<log-dir>/<tag>.rank<r>.jsonl``, one line per
  step ``{"tag", "rank", "world_size", "num_workers", "step", "global_step", "cursor",
  "global_batch", "ids"}`` (``cursor``: before the step; ``step`` counts this phase's
  steps, ``global_step`` the run's; ``ids`` the delivered ``_seq``; ``masked`` and
  ``denied_payload`` with ``--deny-list``: the flags, and how many payload values of the
  denied rows were not blank, which must be 0; ``sources`` for a mixture), and lines
  ``{"event": "loaded" | "saved", "state": ...}``. Tests and ``scripts/elastic_demo.py``
  check these ids against the run log's trace and an uninterrupted run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", help="dataset URL (local path or s3://bucket/prefix) or a "
                   "mixture file (.toml/.json)")
    p.add_argument("--storage-options", default=None, help="JSON dict for fsspec")
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True, help="global steps to consume")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window-blocks", type=int, default=None)
    p.add_argument("--lanes", type=int, default=None)
    p.add_argument("--load", default=None, help="DCP checkpoint directory to resume from")
    p.add_argument("--save", default=None, help="DCP checkpoint directory to write at the end")
    p.add_argument("--run-log", default=None,
                   help="the loader's run log (rank 0 appends this phase's segment)")
    p.add_argument("--deny-list", default=None, help="deny list file: mask those samples")
    p.add_argument("--log-dir", default=None,
                   help="write each rank's delivered ids per step to <log-dir>/<tag>.rank<r>.jsonl")
    p.add_argument("--tag", default="run", help="the name of this phase's files in --log-dir")
    return p.parse_args(argv)


def order_options(args: argparse.Namespace):
    from ..order import OrderOptions

    kw = {"seed": args.seed}
    if args.window_blocks is not None:
        kw["window_blocks"] = args.window_blocks
    if args.lanes is not None:
        kw["lanes"] = args.lanes
    return OrderOptions(**kw)


def same_on_every_rank(dist, value, what: str):
    """All-gather ``value`` and fail unless every rank holds the same one.

    DCP keeps one copy of each replicated key, written by whichever rank its planner picks;
    it does not compare the ranks' values. A loader state that differed between ranks would
    be saved half from one rank and half from another, so check before saving.
    """
    if not dist.is_initialized():
        return value
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    if any(v != values[0] for v in values):
        raise SystemExit(f"{what} differs between ranks: {values}")
    return value


def denied_payload(batch: dict) -> int:
    """Payload values (columns not starting with ``_``) of the batch's denied rows that are
    not blank: a takedown's bytes must never reach the training loop, so this is 0."""
    rows = [j for j, m in enumerate(batch["_masked"].tolist()) if m]
    leaked = 0
    for key, column in batch.items():
        if key.startswith("_"):
            continue
        for j in rows:
            v = column[j]
            v = v.tolist() if hasattr(v, "tolist") else v
            leaked += not (not v or (isinstance(v, list) and not any(v)))
    return leaked


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from ..load.options import BatchOptions, SourceOptions, StopOptions, WorkerOptions
    from ..order.topology import Topology
    from ..torch import ZephonLoader

    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    storage_options = json.loads(args.storage_options) if args.storage_options else None
    loader = ZephonLoader(args.dataset, topology=Topology(args.global_batch, world, rank),
                          order=order_options(args),
                          source=SourceOptions(storage_options=storage_options),
                          batch=BatchOptions(with_seq=True),
                          workers=WorkerOptions(num_workers=args.num_workers,
                                                prefetch=args.prefetch),
                          stop=StopOptions(max_steps=args.steps), run_log=args.run_log,
                          deny_list=args.deny_list)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        ids_log = open(os.path.join(args.log_dir, f"{args.tag}.rank{rank}.jsonl"), "w",
                       encoding="utf-8")
    else:
        ids_log = contextlib.nullcontext()
    with ids_log as log:
        def write(record: dict) -> None:
            if log is not None:
                log.write(json.dumps({"tag": args.tag, "rank": rank, **record}) + "\n")

        if args.load:
            # DCP loads in place into a template with the same keys: the fresh loader's own
            # state. Non-tensor values come back as the Python objects that were saved.
            template = {"loader": loader.state_dict()}
            dcp.load(template, checkpoint_id=args.load)
            loader.load_state_dict(template["loader"])
            write({"event": "loaded", "state": same_on_every_rank(
                dist, loader.state_dict(), "loaded loader state")})
        t0 = time.perf_counter()
        cursor = loader.state_dict()["cursor"]
        step = 0
        for batch in loader:
            ids = [int(i) for i in batch["_seq"].tolist()]
            record = {"world_size": world, "num_workers": args.num_workers, "step": step,
                      "global_step": loader.step - 1, "cursor": cursor,
                      "global_batch": args.global_batch, "ids": ids}
            if "_masked" in batch:
                record["masked"] = [bool(m) for m in batch["_masked"].tolist()]
                record["denied_payload"] = denied_payload(batch)
            if "_source" in batch:   # a mixture (the dataset argument is a mixture file)
                record["sources"] = [int(k) for k in batch["_source"].tolist()]
            write(record)
            cursor += args.global_batch
            step += 1
        if step != args.steps:
            raise SystemExit(f"rank {rank}: consumed {step} steps, expected {args.steps}")
        state = same_on_every_rank(dist, loader.state_dict(), "loader state")
        if args.save:
            dcp.save({"loader": state}, checkpoint_id=args.save)
            write({"event": "saved", "state": state, "seconds": time.perf_counter() - t0})
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

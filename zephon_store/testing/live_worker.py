#!/usr/bin/env python3
"""One torchft replica group (one process) training on a live-elastic loader, for tests.

The replica joins the lighthouse's quorums with a torchft ``Manager`` over gloo and draws
each step's share from :class:`~zephon_store.torch.live.LiveZephonLoader`. Its "model" is a
counter of what the committed steps consumed: each step allreduces ``[count, sum of ids,
sum of squared ids]`` of its share (the "gradient"), and adds it to the model only when the
step commits. The model and the loader travel in torchft's state transfer to a joining
replica. ``--kill STEP:PHASE`` makes the process SIGKILL itself at the first step at or past
``STEP`` (the manager's step) with at least ``--kill-quorum`` participants, at ``PHASE``: ``served`` (after drawing its share, before the
allreduce), ``reduced`` (after the allreduce, before ``should_commit``) or ``committed``.

    python -m zephon_store.testing.live_worker DATASET --replica-id 1 \\
        --lighthouse http://host:29510 --global-batch 10 --seed 7 --epochs 1.5 \\
        --log logs/replica1.0.jsonl --kill 12:reduced --run-log logs/run.jsonl

Log: one JSON line per event, flushed at once (a killed process keeps what it wrote):
``{"event": "served", "step", "cursor", "participants", "index", "ids", "made_by"}``
(``made_by``: the process that made the batch, with ``--num-workers``), then
``{"event": "reduced", "step", "cursor", "sums"}`` and ``{"event": "committed", "step",
"cursor", "ok", "sums"}``, and ``{"event": "done", "model", "state"}`` at the end.
Used by ``tests/integration/test_live_torchft.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", help="dataset URL")
    p.add_argument("--replica-id", required=True)
    p.add_argument("--lighthouse", required=True, help="lighthouse address (http://host:port)")
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lanes", type=int, default=None)
    p.add_argument("--window-blocks", type=int, default=None)
    p.add_argument("--epochs", type=float, required=True)
    p.add_argument("--min-replicas", type=int, default=2)
    p.add_argument("--sync-quorum", action="store_true",
                   help="torchft's synchronous quorum (a joining replica heals before the "
                        "step and takes part in it); default: asynchronous")
    p.add_argument("--timeout", type=float, default=10.0, help="torchft timeouts, seconds")
    p.add_argument("--kill", default=None, help="STEP:PHASE at which to SIGKILL this process")
    p.add_argument("--kill-quorum", type=int, default=1,
                   help="kill only in a step with at least this many participants (so that "
                        "the others can go on)")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="seconds each step takes (stands in for the forward and backward)")
    p.add_argument("--bad-index", type=int, default=None,
                   help="claim participant index 0 from this manager step on (bad input)")
    p.add_argument("--log", required=True)
    p.add_argument("--run-log", default=None,
                   help="the loader's run log (every replica appends to the same file)")
    p.add_argument("--num-workers", type=int, default=0,
                   help="the loader's process workers (forked beside torchft's threads)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from ..load.options import BatchOptions, StopOptions, WorkerOptions
    from ..torch.live import LiveZephonLoader, ReplicaOptions

    model = torch.zeros(3, dtype=torch.int64)
    # The store serves the process group's rendezvous: it lives as long as the manager.
    manager, store = _manager(args, model)
    loader = LiveZephonLoader(
        args.dataset, global_batch=args.global_batch, order=_order_options(args),
        replica=ReplicaOptions(manager=manager, participants=_participants(args, manager)),
        batch=BatchOptions(with_seq=True, transform=_made_by if args.num_workers else None),
        stop=StopOptions(epochs=args.epochs), run_log=args.run_log,
        workers=WorkerOptions(num_workers=args.num_workers))
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    with open(args.log, "a", encoding="utf-8") as log:
        def write(record: dict) -> None:
            log.write(json.dumps({"replica": args.replica_id, "pid": os.getpid(), **record})
                      + "\n")
            log.flush()

        _train(args, manager, loader, model, write)
        write({"event": "done", "step": manager.current_step(), "model": model.tolist(),
               "state": loader.state_dict()})
    manager.shutdown(wait=False)
    del store
    return 0


def _made_by(batch: dict) -> dict:
    """The batch with ``_pid``: the process that made it (a worker's, with workers)."""
    import numpy as np

    return {**batch, "_pid": np.full(len(batch["_seq"]), os.getpid(), dtype=np.int64)}


def _order_options(args: argparse.Namespace):
    """The loader's order from ``--seed``, ``--lanes`` and ``--window-blocks``."""
    from ..order import OrderOptions

    kw = {"seed": args.seed}
    if args.lanes is not None:
        kw["lanes"] = args.lanes
    if args.window_blocks is not None:
        kw["window_blocks"] = args.window_blocks
    return OrderOptions(**kw)


def _manager(args: argparse.Namespace, model):
    """This replica's torchft ``Manager`` over gloo (``model`` travels in its state transfer),
    and the ``TCPStore`` it rendezvouses through: the caller keeps it alive (freed, it stops
    serving and the process group's configure times out)."""
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo

    timeout = timedelta(seconds=args.timeout)
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)

    def load_model(sd: dict) -> None:
        model.copy_(sd["model"])

    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=args.min_replicas,
                      load_state_dict=load_model, state_dict=lambda: {"model": model.clone()},
                      replica_id=str(args.replica_id), store_addr="localhost",
                      store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=args.lighthouse, timeout=timeout,
                      quorum_timeout=timeout * 3, connect_timeout=timeout,
                      use_async_quorum=not args.sync_quorum)
    return manager, store


def _participants(args: argparse.Namespace, manager):
    """None (the loader asks the manager), or with ``--bad-index`` the manager's answer with
    participant index 0 claimed from that manager step on."""
    if args.bad_index is None:
        return None
    from ..torch.live import manager_participants

    quorum = manager_participants(manager)

    def participants():
        index, count = quorum()
        if manager.current_step() >= args.bad_index and index is not None:
            index = 0
        return index, count

    return participants


def _train(args: argparse.Namespace, manager, loader, model, write) -> None:
    """Each step: draw the share, allreduce its sums, add them to ``model`` if the step
    commits; log each phase and SIGKILL this process at ``--kill``'s."""
    import torch
    from torch.distributed import ReduceOp

    kill_step, kill_phase = None, None
    if args.kill:
        step, kill_phase = args.kill.split(":")
        kill_step = int(step)

    def maybe_die(phase: str, participants: int) -> None:
        if kill_step is not None and phase == kill_phase and \
                manager.current_step() >= kill_step and participants >= args.kill_quorum:
            write({"event": "killed", "phase": phase, "step": manager.current_step()})
            os.kill(os.getpid(), signal.SIGKILL)

    batches = iter(loader)
    while True:
        manager.start_quorum()
        batch = next(batches, None)
        if batch is None:
            break
        claim = loader.last_step
        step = manager.current_step()
        ids = [int(i) for i in batch["_seq"].tolist()]
        made_by = int(batch["_pid"][0]) if "_pid" in batch and len(ids) else None
        write({"event": "served", "step": step, "cursor": claim.cursor,
               "participants": claim.participants, "index": claim.index, "ids": ids,
               "made_by": made_by})
        maybe_die("served", claim.participants)
        time.sleep(args.step_delay)
        grad = torch.tensor([len(ids), sum(ids), sum(i * i for i in ids)], dtype=torch.int64)
        manager.allreduce(grad, reduce_op=ReduceOp.SUM).wait()
        write({"event": "reduced", "step": step, "cursor": claim.cursor,
               "sums": grad.tolist()})
        maybe_die("reduced", claim.participants)
        ok = manager.should_commit()
        if ok:
            model.add_(grad)
        write({"event": "committed", "step": step, "cursor": claim.cursor, "ok": ok,
               "sums": grad.tolist()})
        maybe_die("committed", claim.participants)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: torchft 0.2.0's process group sometimes aborts in it
    # ("terminate called without an active exception", SIGABRT) after all work is done and
    # logged, which would read as a crash.
    os._exit(code)

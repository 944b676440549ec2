"""``LiveZephonLoader``: each step split among the replicas present, the cursor moved by commits.

The torch shell over :class:`zephon_store.load.live.LiveLoader` (the Loader with per-step
participants and the commit rule): tensors, and the torchft wiring. With a ``Manager``:
the participants are the quorum's replicas whose gradients count
(:func:`manager_participants`; a healing replica reads nothing that step); the cursor moves
when ``should_commit()`` moved ``current_step()``; the state is registered for torchft's
state transfer; the participants check their claims through ``manager.allreduce``.

Draw each step's batch after the step's quorum was started (``manager.start_quorum()``,
which torchft's ``Optimizer.zero_grad()`` calls) and before ``should_commit()``::

    manager = torchft.Manager(pg=torchft.ProcessGroupGloo(), min_replica_size=2, ...)
    loader = LiveZephonLoader("s3://bucket/ds", global_batch=1024, seed=7,
                              replica=ReplicaOptions(manager=manager))
    optimizer = torchft.Optimizer(manager, torch.optim.AdamW(model.parameters()))
    batches = iter(loader)
    while True:
        optimizer.zero_grad()          # starts the step's quorum
        batch = next(batches)          # this replica's share of the step
        model(batch).backward()        # gradients averaged by torchft's DDP
        optimizer.step()               # should_commit(); the cursor follows

Without torchft: :class:`ReplicaOptions`' ``participants`` (``(index, count)`` of the
current step; ``index`` None: present, not reading), ``commits`` (a counter of committed
steps) or :meth:`commit` after each step, and ``agree`` (e.g. :func:`distributed_agreement`).

>>> loader = LiveZephonLoader(tiny_dataset, global_batch=8, seed=7,
...                           replica=ReplicaOptions(participants=lambda: (1, 3)))
>>> batches = iter(loader)
>>> next(batches)["id"].tolist()
[78, 45, 68]
>>> loader.commit(False)                 # the step broke: served again, to any quorum
>>> next(batches)["id"].tolist()
[78, 45, 68]
>>> loader.commit(True); loader.state_dict()["cursor"]
8
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..load.live import LiveLoader, LiveTopologyError, StepClaim
from ..load.options import (
    BatchOptions,
    ReadAheadOptions,
    SourceOptions,
    StopOptions,
    WorkerOptions,
    as_numpy,
    grouped,
    option_group,
)
from ..order.order import OrderOptions
from .loader import TorchProcesses, to_torch

__all__ = ["LiveZephonLoader", "ReplicaOptions", "distributed_agreement", "manager_agreement",
           "manager_participants"]

Participants = Callable[[], tuple]
Agree = Callable[[StepClaim], Sequence[StepClaim] | None]


def manager_participants(manager) -> Participants:
    """``(index, count)`` of this replica among the replicas whose gradients count this step.

    torchft's quorum numbers ``num_participants()`` replicas, but a replica that is healing
    at the step (``is_participating()`` False, e.g. the non-primary replicas at step 0 with
    ``init_sync``) has its gradient zeroed by ``manager.allreduce``: its share of the data
    would be read and never trained on. So each replica sums a one-hot vector of its quorum
    rank through ``manager.allreduce`` (torchft zeroes a healer's): the ranks that came
    through are the step's participants, numbered in quorum order. Every replica sees the
    same vector, so they agree by construction. When the collective failed the step cannot
    commit; the replica then reads nothing.
    """
    from torch.distributed import ReduceOp

    def participants() -> tuple[int | None, int]:
        n = manager.num_participants()
        if n <= 0:
            return None, n
        rank = manager.participating_rank()
        present = torch.zeros(n, dtype=torch.int64)
        if rank is not None and manager.is_participating() and 0 <= rank < n:
            present[rank] = 1
        manager.allreduce(present, reduce_op=ReduceOp.SUM).wait()
        if manager.errored() is not None:
            return None, n
        flags = present.numpy()
        if (flags > 1).any():
            raise LiveTopologyError(
                f"torchft quorum ranks {np.flatnonzero(flags > 1).tolist()} were claimed by "
                "more than one replica; the quorum is inconsistent, nothing is read")
        count = int(flags.sum())
        if count == 0:
            return None, n
        if rank is None or flags[rank] == 0:
            return None, count
        return int(flags[:rank].sum()), count

    return participants


def manager_agreement(manager) -> Agree:
    """All-gather the participants' claims through a torchft ``Manager``.

    A ``(num_participants, 4)`` int64 table is summed with ``manager.allreduce``: each
    participant fills the row of its ``participating_rank()`` with its claim, a replica that
    is not participating sends zeros (torchft zeroes them). Returns None when the collective
    failed (the manager then does not commit the step, so it needs no check).
    """
    from torch.distributed import ReduceOp

    def agree(claim: StepClaim) -> list[StepClaim] | None:
        n = max(1, manager.num_participants())
        rank = manager.participating_rank()
        table = torch.zeros((n, 4), dtype=torch.int64)
        if rank is not None and claim.index is not None and 0 <= rank < n:
            table[rank] = torch.from_numpy(claim.as_row())
        manager.allreduce(table, reduce_op=ReduceOp.SUM).wait()
        if manager.errored() is not None:
            return None
        rows = table.numpy()
        doubled = np.flatnonzero(rows[:, 0] > 1)
        if doubled.size:
            raise LiveTopologyError(
                f"torchft quorum ranks {doubled.tolist()} were claimed by more than one "
                f"replica at cursor {claim.cursor}; the quorum is inconsistent, nothing is read")
        return [c for c in map(StepClaim.from_row, rows) if c is not None]

    return agree


def distributed_agreement(group=None) -> Agree:
    """All-gather the claims over a ``torch.distributed`` group (every member, every step)."""
    import torch.distributed as dist

    def agree(claim: StepClaim) -> list[StepClaim]:
        mine = torch.from_numpy(claim.as_row())
        rows = [torch.zeros(4, dtype=torch.int64)
                for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, mine, group=group)
        return [c for c in (StepClaim.from_row(r.numpy()) for r in rows) if c is not None]

    return agree


@dataclass(frozen=True)
class ReplicaOptions:
    """How this replica takes part in a live run: ``manager``, a torchft ``Manager``
    (participants, commits, agreement and state transfer from it); or the callables
    ``participants`` (``(index, count)`` of the current step; ``index`` None: present, not
    reading), ``commits`` (a counter of committed steps; else :meth:`LiveLoader.commit`
    after each step) and ``agree`` (e.g. :func:`distributed_agreement`);
    ``group_size``/``group_rank`` split a participant's share among the ranks of its replica
    group; ``state_key`` names the loader's entry in the manager's state transfer."""

    manager: Any = None
    participants: Participants | None = None
    commits: Callable[[], int] | None = None
    agree: Agree | None = None
    group_size: int = 1
    group_rank: int = 0
    state_key: str = "zephon_loader"


# The flat keywords of ReplicaOptions' fields (each now warns).
_REPLICA_FLAT = tuple(f.name for f in dataclasses.fields(ReplicaOptions))
# The flat keywords LiveZephonLoader took before its option groups.
_LIVE_FLAT = frozenset({"columns", "with_seq", "transform", "collate", "epochs", "drop_last",
                        "storage_options", "cache", "prefetch_bytes", "coalesce",
                        "decode_ahead_bytes", "decoded_cache", "num_workers", "prefetch",
                        "multiprocessing_context", "expect_dataset_id"})


class LiveZephonLoader(LiveLoader):
    """This replica's share of each step of a live-elastic run (module docstring: wiring).

    ``global_batch`` samples per committed step over all participants (any participant
    count splits it, unevenly when it does not divide); ``replica``: how this replica takes
    part (:class:`ReplicaOptions`: a torchft ``manager``, or the ``participants``,
    ``commits`` and ``agree`` callables; the replica group's split; the state key). The rest
    are :class:`~zephon_store.torch.ZephonLoader`'s, with the same meaning: ``dataset`` (a
    URL, a ``Dataset`` or a mixture), ``seed``/``order``, the option groups ``source``,
    ``batch``, ``read_ahead``, ``stop`` (``epochs``/``drop_last``: a live step counts when it
    commits, so ``max_steps`` is refused) and ``workers`` (each quorum shape's batches from
    a new ``DataLoader``), ``deny_list`` and ``run_log`` (every replica appends a
    ``"live": true`` line when it takes the run up; ``zephon audit`` checks the run). The
    flat keywords of before the groups (``manager=``, ``participants=``, ``columns=``...)
    still work for one release and warn. State and loads: ``LiveLoader``'s.
    """

    def __init__(self, dataset, *, global_batch: int, replica: ReplicaOptions | None = None,
                 seed: int | None = None, order: OrderOptions | None = None,
                 source: SourceOptions | None = None, batch: BatchOptions | None = None,
                 read_ahead: ReadAheadOptions | None = None, stop: StopOptions | None = None,
                 workers: WorkerOptions | None = None, run_log: str | None = None,
                 deny_list=None, **deprecated) -> None:
        replica = _replica(replica, {k: deprecated.pop(k) for k in _REPLICA_FLAT
                                     if k in deprecated})
        if deprecated.get("collate", to_torch) is None:
            deprecated["collate"] = as_numpy   # the flat spelling's None: numpy batches
        groups = grouped("LiveZephonLoader", {"source": source, "batch": batch,
                                              "read_ahead": read_ahead, "stop": stop,
                                              "workers": workers}, deprecated,
                         allowed=_LIVE_FLAT)
        manager, participants = replica.manager, replica.participants
        commits, agree = replica.commits, replica.agree
        if manager is not None:
            participants = participants or manager_participants(manager)
            commits = commits or manager.current_step
            agree = agree or manager_agreement(manager)
        if participants is None:
            raise ValueError("pass replica=ReplicaOptions(manager=...) (torchft) or "
                             "ReplicaOptions(participants=...) (a callable giving (index, "
                             "count) for the current step)")
        if groups["stop"].max_steps is not None:
            raise ValueError("LiveZephonLoader: stop.max_steps is not a bound of a live run "
                             "(a step counts when it commits); bound it with epochs")
        batch = groups["batch"]
        if batch.collate is None:
            batch = dataclasses.replace(batch, collate=to_torch)
        super().__init__(
            dataset, global_batch=global_batch, participants=participants, commits=commits,
            agree=agree, group_size=replica.group_size, group_rank=replica.group_rank,
            seed=seed, order=order, source=groups["source"], batch=batch,
            read_ahead=groups["read_ahead"], stop=groups["stop"],
            workers=TorchProcesses(groups["workers"]), run_log=run_log, deny_list=deny_list)
        if manager is not None:
            manager.register_state_dict_fn(replica.state_key, self.load_state_dict,
                                           self.state_dict)


def _replica(given: ReplicaOptions | None, flat: dict) -> ReplicaOptions:
    """``given``, or the group of the flat replica keywords (which warn)."""
    if flat:
        spelled = ", ".join(f"{k}=..." for k in flat)
        warnings.warn(f"LiveZephonLoader({spelled}) is deprecated: pass replica=ReplicaOptions("
                      f"{spelled}); the flat keywords go in the next release",
                      DeprecationWarning, stacklevel=3)
    return option_group("replica", given, ReplicaOptions, **flat)


"""Who reads which position: ranks within a step, DataLoader workers within a rank.

Pure functions, no state. They decide only *which rank (or worker) reads which position*;
*which sample sits at a position* is :mod:`zephon_store.order`'s business and never
depends on anything here (DESIGN section 1).

Rank rule for the step starting at ``cursor`` (it covers ``[cursor, cursor + B)``; each of
the ``W`` ranks gets ``b = B // W`` positions, increasing):

- **lane mode** (``lanes % W == 0``): rank ``r`` takes the positions ``p`` whose position
  inside its epoch, ``q = p % N``, satisfies ``q % W == r``. The order puts position ``q``
  in lane ``q % P``, so with ``W | P`` a rank reads only the lanes ``l`` with
  ``l % W == r``: whole lanes, a fixed ``P / W`` of them, and hence few blocks. This needs
  each residue to occur exactly ``b`` times in the step, which holds for every step that
  stays inside one epoch (``B`` consecutive ``q`` values, ``W | B``). A step that crosses
  an epoch boundary is checked; if the residues are unbalanced it falls back to plain
  mode for that one step. Without ``epoch_size`` the residue is taken of ``p`` itself
  (always balanced; lane-aligned in every epoch only when ``W | N``).
- **plain mode** (otherwise): contiguous slices, rank ``r`` takes
  ``[cursor + r*b, cursor + (r+1)*b)``.

Both rules partition the step, so exactly-once holds for any sequence of world sizes,
batch sizes and restarts: the step boundaries are all that the cursor records.

Worker rule: DataLoader worker ``k`` of ``n`` makes the local batches ``i`` (counted from
the loader's start cursor) with ``i % n == k``; torch's DataLoader returns worker outputs
round-robin, so the main process sees batches ``0, 1, 2, ...`` for any ``num_workers``.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import numpy as np

from .topology import Topology

__all__ = [
    "positions_for_rank",
    "tail_positions_for_rank",
    "step_is_lane_aligned",
    "step_ranks",
    "step_cursor",
    "batch_owner",
    "batches_for_worker",
]


def _check_step(cursor: int, global_batch: int, world_size: int, rank: int,
                lanes: int) -> None:
    if cursor < 0:
        raise ValueError(f"cursor must be >= 0, got {cursor}")
    Topology(global_batch, world_size, rank)
    if lanes <= 0:
        raise ValueError(f"lanes must be > 0, got {lanes}")


def _lane_ranks(cursor: int, global_batch: int, world_size: int, lanes: int,
                epoch_size: int | None) -> np.ndarray | None:
    """The rank of every position of the step in lane mode, or ``None`` for plain mode.

    The one place the rule picks its mode (module docstring): lane mode needs
    ``world_size | lanes`` and balanced residues.
    """
    if lanes % world_size:
        return None
    return _step_residues(cursor, global_batch, world_size, epoch_size)


def _step_residues(cursor: int, global_batch: int, world_size: int,
                   epoch_size: int | None) -> np.ndarray | None:
    """Residue ``q % W`` of every position of the step if balanced, else ``None``.

    Returns ``None`` only for steps that cross an epoch boundary with unbalanced residues.
    """
    positions = np.arange(cursor, cursor + global_batch, dtype=np.int64)
    if epoch_size is None:
        return positions % world_size
    if epoch_size <= 0:
        raise ValueError(f"epoch_size must be > 0, got {epoch_size}")
    if cursor // epoch_size == (cursor + global_batch - 1) // epoch_size:
        # B consecutive q values with W | B: every residue occurs B / W times.
        return (positions % epoch_size) % world_size
    residues = (positions % epoch_size) % world_size
    counts = np.bincount(residues, minlength=world_size)
    return residues if (counts == global_batch // world_size).all() else None


def step_is_lane_aligned(cursor: int, global_batch: int, world_size: int, *, lanes: int = 1,
                         epoch_size: int | None = None) -> bool:
    """Whether :func:`positions_for_rank` uses lane mode for this step.

    >>> step_is_lane_aligned(0, 8, 4, lanes=8, epoch_size=100)
    True
    >>> step_is_lane_aligned(96, 8, 4, lanes=8, epoch_size=102)  # crosses epoch 0 -> 1
    False
    """
    _check_step(cursor, global_batch, world_size, 0, lanes)
    return _lane_ranks(cursor, global_batch, world_size, lanes, epoch_size) is not None


def step_ranks(cursor: int, global_batch: int, world_size: int, *, lanes: int = 1,
               epoch_size: int | None = None) -> np.ndarray:
    """The rank that reads each position of the step ``[cursor, cursor + global_batch)``.

    The same rule as :func:`positions_for_rank`, for all ranks at once: element ``j`` is
    the rank of position ``cursor + j`` (the plan simulator's view of a step).

    >>> step_ranks(0, 8, 2).tolist()                 # plain: contiguous halves
    [0, 0, 0, 0, 1, 1, 1, 1]
    >>> step_ranks(0, 8, 2, lanes=4).tolist()        # lanes: residue mod 2
    [0, 1, 0, 1, 0, 1, 0, 1]
    """
    _check_step(cursor, global_batch, world_size, 0, lanes)
    if world_size > 1:
        ranks = _lane_ranks(cursor, global_batch, world_size, lanes, epoch_size)
        if ranks is not None:
            return ranks
    return np.arange(global_batch, dtype=np.int64) // (global_batch // world_size)


def positions_for_rank(cursor: int, global_batch: int, world_size: int, rank: int, *,
                       lanes: int = 1, epoch_size: int | None = None) -> np.ndarray:
    """The positions rank ``rank`` consumes in the step ``[cursor, cursor + global_batch)``.

    ``lanes`` is the order's effective lane count (``Order.effective_lanes``) and
    ``epoch_size`` its ``num_samples``; see the module docstring for the rule. Every rank
    gets ``global_batch // world_size`` increasing positions and the ranks' sets partition
    the step.

    >>> positions_for_rank(0, 8, 2, 1).tolist()              # plain: contiguous halves
    [4, 5, 6, 7]
    >>> positions_for_rank(0, 8, 2, 1, lanes=4).tolist()     # lanes: residue 1 mod 2
    [1, 3, 5, 7]
    >>> positions_for_rank(0, 6, 4, 0)
    Traceback (most recent call last):
    ...
    ValueError: world_size must divide global_batch: global_batch=6 is not a multiple of world_size=4; pick a global batch that is
    """
    _check_step(cursor, global_batch, world_size, rank, lanes)
    per_rank = global_batch // world_size
    if world_size > 1:
        ranks = _lane_ranks(cursor, global_batch, world_size, lanes, epoch_size)
        if ranks is not None:
            return cursor + np.flatnonzero(ranks == rank).astype(np.int64)
    start = cursor + rank * per_rank
    return np.arange(start, start + per_rank, dtype=np.int64)


def tail_positions_for_rank(cursor: int, end: int, world_size: int, rank: int) -> np.ndarray:
    """The positions rank ``rank`` consumes in a last, short step ``[cursor, end)``.

    A run bounded by ``end`` (the loader's ``epochs`` with ``drop_last=False``) ends with
    a step of ``end - cursor`` positions, fewer than a global batch. They are split into
    contiguous slices as evenly as they go: rank ``r`` takes
    ``[cursor + r*R // W, cursor + (r+1)*R // W)``, so slice sizes differ by at most one
    and a rank may get none when ``R < W``. The slices partition the step: exactly once.

    >>> [tail_positions_for_rank(100, 105, 2, r).tolist() for r in range(2)]
    [[100, 101], [102, 103, 104]]
    """
    if not 0 <= cursor <= end:
        raise ValueError(f"need 0 <= cursor <= end, got cursor={cursor}, end={end}")
    if world_size <= 0:
        raise ValueError(f"world_size must be > 0, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    r = end - cursor
    return np.arange(cursor + rank * r // world_size, cursor + (rank + 1) * r // world_size,
                     dtype=np.int64)


def step_cursor(start_cursor: int, i: int, global_batch: int) -> int:
    """Cursor of the ``i``-th step of a loader that started at ``start_cursor``.

    >>> step_cursor(1000, 3, 64)
    1192
    """
    if i < 0:
        raise ValueError(f"step index must be >= 0, got {i}")
    return start_cursor + i * global_batch


def batch_owner(i: int, num_workers: int) -> int:
    """The DataLoader worker that makes local batch ``i`` (0 = main process if no workers).

    >>> [batch_owner(i, 3) for i in range(6)]
    [0, 1, 2, 0, 1, 2]
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if i < 0:
        raise ValueError(f"batch index must be >= 0, got {i}")
    return i % num_workers if num_workers else 0


def batches_for_worker(worker_id: int, num_workers: int, start: int = 0,
                       stop: int | None = None) -> Iterator[int]:
    """Batch indices worker ``worker_id`` makes, in order: ``start + worker_id + j*n``.

    ``num_workers == 0`` means the main process makes every batch (``worker_id`` must be 0).
    Batch ``start`` goes to worker 0 because torch's round-robin begins with worker 0.
    Endless unless ``stop`` (exclusive) is given.

    >>> list(batches_for_worker(1, 3, stop=8))
    [1, 4, 7]
    >>> list(batches_for_worker(0, 0, start=5, stop=8))
    [5, 6, 7]
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if not 0 <= worker_id < max(1, num_workers):
        raise ValueError(f"worker_id must be in [0, {max(1, num_workers)}), got {worker_id}")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    step = max(1, num_workers)
    first = start + worker_id
    if stop is None:
        return count(first, step)
    return iter(range(first, max(first, stop), step))

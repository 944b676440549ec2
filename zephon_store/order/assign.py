"""Who reads which position: ranks within a step, DataLoader workers within a rank.

Pure functions, no state. They decide only *which rank (or worker) reads which position*;
*which sample sits at a position* is :mod:`zephon_store.order`'s business and never
depends on anything here (DESIGN section 1).

**The rank rule** (one rule, for every world size, lane count and epoch; the loader, the
``zephon plan`` simulator, the audit and live elasticity all call it). The step starting at
``cursor`` covers the positions ``[cursor, cursor + B)``. The order puts position ``p`` in
lane ``(p % N) % P`` (``N = epoch_size``, ``P = lanes``; without ``epoch_size``, ``p % P``).

1. Sort the step's positions by lane, stably (within a lane, by position).
2. Cut that sequence into ``n`` contiguous pieces, piece ``i`` being the slots
   ``[floor(i*B/n), floor((i+1)*B/n))``: participant ``i`` (a rank, a replica group) takes
   piece ``i``, returned as increasing positions. With ``n | B`` every piece has ``B / n``.

The pieces partition the step, so exactly-once holds for any sequence of participant
counts, batch sizes and restarts: the step boundaries are all that the cursor records.
With ``P = 1`` the pieces are contiguous slices of the step. With ``P > 1`` participant
``i`` reads a contiguous range of lanes, and consecutive participants read neighbouring
ranges; torchrun numbers the ranks of a node consecutively, so a node reads one range of
about ``P / nodes`` lanes and shares at most its two boundary lanes with its neighbours
(``docs/order.md``, "Locality at scale"). The lanes are sorted by their absolute id, not
relative to the step, so a participant's range stays put from step to step.

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
    "positions_for_participant",
    "positions_for_rank",
    "tail_positions_for_rank",
    "step_owners",
    "step_ranks",
    "step_cursor",
    "batch_owner",
    "batches_for_worker",
]


def _check_rule(cursor: int, global_batch: int, participants: int, lanes: int,
                epoch_size: int | None) -> None:
    if cursor < 0:
        raise ValueError(f"cursor must be >= 0, got {cursor}")
    if global_batch <= 0:
        raise ValueError(f"global_batch must be > 0, got {global_batch}")
    if participants <= 0:
        raise ValueError(f"participants must be > 0, got {participants}")
    if lanes <= 0:
        raise ValueError(f"lanes must be > 0, got {lanes}")
    if epoch_size is not None and epoch_size <= 0:
        raise ValueError(f"epoch_size must be > 0, got {epoch_size}")


def _piece(global_batch: int, participants: int, index: int) -> tuple[int, int]:
    """Slots ``[lo, hi)`` of the lane-sorted step that participant ``index`` takes."""
    return (index * global_batch // participants,
            (index + 1) * global_batch // participants)


def _in_one_epoch(cursor: int, global_batch: int, epoch_size: int | None) -> bool:
    return epoch_size is None or cursor // epoch_size == (cursor + global_batch - 1) // epoch_size


def _lane_sorted(cursor: int, global_batch: int, lanes: int,
                 epoch_size: int | None) -> np.ndarray:
    """The step's positions sorted by lane, then by position (the general path)."""
    positions = np.arange(cursor, cursor + global_batch, dtype=np.int64)
    if lanes == 1:
        return positions
    q = positions if epoch_size is None else positions % epoch_size
    return positions[np.argsort(q % lanes, kind="stable")]


def _piece_in_one_epoch(cursor: int, global_batch: int, lanes: int, epoch_size: int | None,
                        lo: int, hi: int) -> np.ndarray:
    """Slots ``[lo, hi)`` of the lane-sorted step, for a step inside one epoch: O(P + b).

    The step holds ``B`` consecutive values of ``q``, so lane ``l`` occurs
    ``f = B // P`` times, plus once more for the ``r = B % P`` lanes that follow the first
    one, ``q0 % P``, cyclically; its ``k``-th position is ``cursor + (l - q0) % P + k*P``.
    """
    q0 = cursor if epoch_size is None else cursor % epoch_size
    f, r = divmod(global_batch, lanes)
    lane = np.arange(lanes, dtype=np.int64)
    first = (lane - q0) % lanes                  # offset of the lane's first position
    counts = f + (first < r)
    start = np.cumsum(counts) - counts           # first slot of each lane
    a = int(np.searchsorted(start, lo, side="right")) - 1
    b = int(np.searchsorted(start, hi, side="left"))
    sel = lane[a:b]
    k_lo = np.maximum(0, lo - start[sel])
    k_hi = np.minimum(counts[sel], hi - start[sel])
    n = k_hi - k_lo
    rep = np.repeat(np.arange(sel.size), n)
    k = k_lo[rep] + (np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n))
    out = cursor + first[sel][rep] + k * lanes
    out.sort()
    return out


def positions_for_participant(cursor: int, global_batch: int, participants: int, index: int,
                              *, lanes: int = 1, epoch_size: int | None = None) -> np.ndarray:
    """The positions participant ``index`` of ``participants`` takes in the step at ``cursor``.

    The rank rule of the module docstring, for any number of participants: piece ``index``
    holds ``floor((index+1)*B/n) - floor(index*B/n)`` positions (sizes differ by at most
    one when ``n`` does not divide ``B``; a participant may get none when ``n > B``), in
    increasing order, and the pieces of ``index = 0 .. n-1`` partition
    ``[cursor, cursor + global_batch)``. ``lanes`` is the order's ``effective_lanes`` and
    ``epoch_size`` its ``num_samples``.

    >>> positions_for_participant(0, 10, 3, 1).tolist()            # lanes=1: slices 3, 3, 4
    [3, 4, 5]
    >>> [positions_for_participant(0, 8, 2, i, lanes=4).tolist() for i in range(2)]
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    _check_rule(cursor, global_batch, participants, lanes, epoch_size)
    if not 0 <= index < participants:
        raise ValueError(f"index must be in [0, {participants}), got {index}")
    lo, hi = _piece(global_batch, participants, index)
    if lanes == 1:
        return np.arange(cursor + lo, cursor + hi, dtype=np.int64)
    if _in_one_epoch(cursor, global_batch, epoch_size):
        return _piece_in_one_epoch(cursor, global_batch, lanes, epoch_size, lo, hi)
    return np.sort(_lane_sorted(cursor, global_batch, lanes, epoch_size)[lo:hi])


def step_owners(cursor: int, global_batch: int, participants: int, *, lanes: int = 1,
                epoch_size: int | None = None) -> np.ndarray:
    """The participant that takes each position of the step (element ``j``: ``cursor + j``).

    :func:`positions_for_participant` for all participants at once (the simulator's view).

    >>> step_owners(0, 8, 2, lanes=4).tolist()
    [0, 0, 1, 1, 0, 0, 1, 1]
    """
    _check_rule(cursor, global_batch, participants, lanes, epoch_size)
    bounds = np.arange(participants + 1, dtype=np.int64) * global_batch // participants
    owner_of_slot = np.repeat(np.arange(participants, dtype=np.int64), np.diff(bounds))
    owners = np.empty(global_batch, dtype=np.int64)
    owners[_lane_sorted(cursor, global_batch, lanes, epoch_size) - cursor] = owner_of_slot
    return owners


def step_ranks(cursor: int, global_batch: int, world_size: int, *, lanes: int = 1,
               epoch_size: int | None = None) -> np.ndarray:
    """The rank that reads each position of a full step (``world_size`` divides the batch).

    >>> step_ranks(0, 8, 2).tolist()                 # one lane: contiguous halves
    [0, 0, 0, 0, 1, 1, 1, 1]
    >>> step_ranks(0, 8, 2, lanes=4).tolist()        # lanes 0-1 to rank 0, lanes 2-3 to rank 1
    [0, 0, 1, 1, 0, 0, 1, 1]
    """
    Topology(global_batch, world_size)
    return step_owners(cursor, global_batch, world_size, lanes=lanes, epoch_size=epoch_size)


def positions_for_rank(cursor: int, global_batch: int, world_size: int, rank: int, *,
                       lanes: int = 1, epoch_size: int | None = None) -> np.ndarray:
    """The positions rank ``rank`` consumes in the step ``[cursor, cursor + global_batch)``.

    :func:`positions_for_participant` with ``world_size`` ranks, which must divide the
    batch: every rank gets ``global_batch // world_size`` increasing positions and the
    ranks' sets partition the step.

    >>> positions_for_rank(0, 8, 2, 1).tolist()              # one lane: contiguous halves
    [4, 5, 6, 7]
    >>> positions_for_rank(0, 8, 2, 1, lanes=4).tolist()     # lanes 2 and 3
    [2, 3, 6, 7]
    >>> positions_for_rank(0, 6, 4, 0)
    Traceback (most recent call last):
    ...
    ValueError: world_size must divide global_batch: global_batch=6 is not a multiple of world_size=4; pick a global batch that is
    """
    if cursor < 0:
        raise ValueError(f"cursor must be >= 0, got {cursor}")
    Topology(global_batch, world_size, rank)
    return positions_for_participant(cursor, global_batch, world_size, rank, lanes=lanes,
                                     epoch_size=epoch_size)


def tail_positions_for_rank(cursor: int, end: int, world_size: int, rank: int, *,
                            lanes: int = 1, epoch_size: int | None = None) -> np.ndarray:
    """The positions rank ``rank`` consumes in a last, short step ``[cursor, end)``.

    A run bounded by ``end`` (the loader's ``epochs`` with ``drop_last=False``) ends with
    a step of ``R = end - cursor`` positions, fewer than a global batch. The same rule
    splits it as evenly as it goes (:func:`positions_for_participant` with ``R`` positions):
    piece sizes differ by at most one and a rank may get none when ``R < W``. The pieces
    partition the step: exactly once.

    >>> [tail_positions_for_rank(100, 105, 2, r).tolist() for r in range(2)]
    [[100, 101], [102, 103, 104]]
    """
    if not 0 <= cursor <= end:
        raise ValueError(f"need 0 <= cursor <= end, got cursor={cursor}, end={end}")
    if world_size <= 0:
        raise ValueError(f"world_size must be > 0, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if end == cursor:
        return np.zeros(0, dtype=np.int64)
    return positions_for_participant(cursor, end - cursor, world_size, rank, lanes=lanes,
                                     epoch_size=epoch_size)


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

"""Who reads which position: ranks within a step, DataLoader workers within a rank.

Pure functions, no state. They decide only *which rank (or worker) reads which position*;
*which sample sits at a position* is :mod:`zephon_store.order`'s business and never
depends on anything here (DESIGN section 1).

**The rank rule** (one rule for every world size, lane count and epoch; the loader, the
``zephon plan`` simulator, the audit and live elasticity all call it). The step starting at
``cursor`` covers the positions ``[cursor, cursor + B)``; ``n`` participants (ranks, or
replica groups) share it, ``ranks_per_node`` consecutive ones per node, so there are
``M = ceil(n / ranks_per_node)`` nodes. ``P`` is the order's lane count.

1. *Key.* Position ``p`` has the lane key ``k = p % P``. Inside epoch ``e`` the order puts
   ``p`` in lane ``(p - e*N) % P``: the key is the lane up to a rotation that is fixed for the
   whole epoch, so a participant that owns a set of keys owns a fixed set of lanes all
   epoch long. And a step that crosses an epoch boundary is still ``B`` consecutive keys.
2. *Lane order.* The keys are put in one fixed order: by ``k`` itself when ``P`` divides
   ``B`` (every key then occurs ``B / P`` times in every step); otherwise *interleaved*:
   by node class ``k % M``, classes in a golden-ratio order, then by ``k // M``.
3. *Cut.* The step's positions are sorted by their key's place in that order (then by
   position) and cut into ``n`` contiguous pieces; participant ``i`` takes the slots
   ``[floor(i*B/n), floor((i+1)*B/n))``, returned as increasing positions.

The pieces partition the step, so exactly-once holds for any sequence of participant counts,
batch sizes and restarts: the step boundaries are all that the cursor records. With
``P = 1`` the pieces are contiguous slices of the step.

Why two lane orders: a node should read the same lanes step after step, which needs its
piece to cover the same keys in every step. When ``P | B`` every key occurs equally often,
so the cut points of a contiguous order stay on the same keys and node ``m`` reads the lanes
``[m*P/M, (m+1)*P/M)``, sharing at most a boundary lane with each neighbour. When ``P``
does not divide ``B``, the ``B % P`` keys that occur once more form an arc that moves by
``B % P`` every step; with contiguous ranges it would land on a few nodes at a time and push
every cut point around. Interleaved classes take an equal share of any arc (within one
position), and the golden-ratio order of the classes keeps the running surplus, hence the
cut points' drift, within a few positions. ``docs/order.md`` ("Locality at scale") gives
the measured bounds.

Worker rule: DataLoader worker ``k`` of ``n`` makes the local batches ``i`` (counted from
the loader's start cursor) with ``i % n == k``; torch's DataLoader returns worker outputs
round-robin, so the main process sees batches ``0, 1, 2, ...`` for any ``num_workers``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from itertools import count

import numpy as np

from .topology import Topology

__all__ = [
    "positions_for_participant",
    "positions_for_rank",
    "tail_positions_for_rank",
    "lane_order",
    "step_owners",
    "step_ranks",
    "step_cursor",
    "batch_owner",
    "batches_for_worker",
]

# 1/phi: stepping through the node classes by round(M / phi) visits them in an order whose
# every prefix holds a near-equal share of any arc of keys (the three-distance property).
_GOLDEN_STEP = (math.sqrt(5) - 1) / 2


def _check_rule(cursor: int, global_batch: int, participants: int, lanes: int,
                epoch_size: int | None, ranks_per_node: int) -> None:
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
    if ranks_per_node <= 0:
        raise ValueError(f"ranks_per_node must be > 0, got {ranks_per_node}")


@functools.lru_cache(maxsize=32)
def _lane_order_cached(lanes: int, nodes: int, contiguous: bool) -> tuple[np.ndarray, np.ndarray]:
    if contiguous or nodes == 1 or lanes == 1:
        order = np.arange(lanes, dtype=np.int64)
    else:
        step = max(1, round(nodes * _GOLDEN_STEP))
        while math.gcd(step, nodes) != 1:
            step += 1
        class_at = (np.arange(nodes, dtype=np.int64) * step) % nodes  # place -> class
        place_of_class = np.empty(nodes, dtype=np.int64)
        place_of_class[class_at] = np.arange(nodes, dtype=np.int64)
        key = np.arange(lanes, dtype=np.int64)
        order = np.lexsort((key // nodes, place_of_class[key % nodes]))
    place = np.empty(lanes, dtype=np.int64)
    place[order] = np.arange(lanes, dtype=np.int64)
    order.flags.writeable = False
    place.flags.writeable = False
    return order, place


def lane_order(lanes: int, global_batch: int, nodes: int = 1) -> np.ndarray:
    """The keys ``0 .. lanes-1`` in the order the rank rule cuts them (module docstring).

    Contiguous when ``lanes`` divides ``global_batch``, else interleaved by node class.

    >>> lane_order(6, 12, nodes=2).tolist()                      # 6 | 12: contiguous
    [0, 1, 2, 3, 4, 5]
    >>> lane_order(6, 8, nodes=2).tolist()                       # class 0, then class 1
    [0, 2, 4, 1, 3, 5]
    """
    if lanes <= 0 or global_batch <= 0 or nodes <= 0:
        raise ValueError(f"lanes, global_batch and nodes must be > 0, got {lanes}, "
                         f"{global_batch}, {nodes}")
    return _lane_order_cached(lanes, nodes, global_batch % lanes == 0)[0].copy()


def _nodes(participants: int, ranks_per_node: int) -> int:
    return -(-participants // ranks_per_node)


def _piece(global_batch: int, participants: int, index: int) -> tuple[int, int]:
    """Slots ``[lo, hi)`` of the sorted step that participant ``index`` takes."""
    return (index * global_batch // participants,
            (index + 1) * global_batch // participants)


def _slots(cursor: int, global_batch: int, lanes: int, nodes: int, lo: int,
           hi: int) -> np.ndarray:
    """Positions in slots ``[lo, hi)`` of the sorted step, increasing: O(P + hi - lo).

    The step holds ``B`` consecutive keys, so key ``k`` occurs ``f = B // P`` times, plus
    once more for the ``r = B % P`` keys from ``cursor % P`` on (cyclically); its ``j``-th
    position is ``cursor + (k - cursor) % P + j*P``: ``cursor`` plus offsets that depend on
    ``cursor % P`` only, computed once per residue (a loader asks for thousands of steps
    ahead, and the per-call numpy work was most of a small step's cost).
    """
    return _slot_offsets(cursor % lanes, global_batch, lanes, nodes, lo, hi) + cursor


@functools.lru_cache(maxsize=4096)
def _slot_offsets(residue: int, global_batch: int, lanes: int, nodes: int, lo: int,
                  hi: int) -> np.ndarray:
    """:func:`_slots` at ``cursor = residue`` minus ``residue`` (read-only: it is shared)."""
    cursor = residue
    order, _ = _lane_order_cached(lanes, nodes, global_batch % lanes == 0)
    f, r = divmod(global_batch, lanes)
    first = (order - cursor) % lanes            # offset of each key's first position
    counts = f + (first < r)
    start = np.cumsum(counts) - counts          # first slot of each key, in lane order
    a = int(np.searchsorted(start, lo, side="right")) - 1
    b = int(np.searchsorted(start, hi, side="left"))
    j_lo = np.maximum(0, lo - start[a:b])
    j_hi = np.minimum(counts[a:b], hi - start[a:b])
    n = j_hi - j_lo
    rep = np.repeat(np.arange(b - a), n)
    j = j_lo[rep] + np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    out = first[a:b][rep] + j * lanes
    out.sort()
    out.setflags(write=False)
    return out


def positions_for_participant(cursor: int, global_batch: int, participants: int, index: int,
                              *, lanes: int = 1, epoch_size: int | None = None,
                              ranks_per_node: int = 1) -> np.ndarray:
    """The positions participant ``index`` of ``participants`` takes in the step at ``cursor``.

    The rank rule of the module docstring, for any number of participants: piece ``index``
    holds ``floor((index+1)*B/n) - floor(index*B/n)`` positions (sizes differ by at most
    one when ``n`` does not divide ``B``; a participant gets none when ``n > B`` leaves it
    an empty piece), in increasing order, and the pieces of ``index = 0 .. n-1`` partition
    ``[cursor, cursor + global_batch)``. ``lanes`` is the order's ``effective_lanes``;
    ``ranks_per_node`` consecutive participants share a node (a disk cache). ``epoch_size``
    (the order's ``num_samples``) is only checked: the key ``p % P`` needs no epoch.

    >>> positions_for_participant(0, 10, 3, 1).tolist()            # one lane: slices 3, 3, 4
    [3, 4, 5]
    >>> [positions_for_participant(0, 8, 2, i, lanes=4).tolist() for i in range(2)]
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    _check_rule(cursor, global_batch, participants, lanes, epoch_size, ranks_per_node)
    if not 0 <= index < participants:
        raise ValueError(f"index must be in [0, {participants}), got {index}")
    lo, hi = _piece(global_batch, participants, index)
    if lanes == 1:
        return np.arange(cursor + lo, cursor + hi, dtype=np.int64)
    return _slots(cursor, global_batch, lanes, _nodes(participants, ranks_per_node), lo, hi)


def step_owners(cursor: int, global_batch: int, participants: int, *, lanes: int = 1,
                epoch_size: int | None = None, ranks_per_node: int = 1) -> np.ndarray:
    """The participant that takes each position of the step (element ``j``: ``cursor + j``).

    :func:`positions_for_participant` for all participants at once, computed by sorting
    the step (the simulator's view, and an independent check of the closed form).

    >>> step_owners(0, 8, 2, lanes=4).tolist()
    [0, 0, 1, 1, 0, 0, 1, 1]
    """
    _check_rule(cursor, global_batch, participants, lanes, epoch_size, ranks_per_node)
    _, place = _lane_order_cached(lanes, _nodes(participants, ranks_per_node),
                                  global_batch % lanes == 0)
    positions = np.arange(cursor, cursor + global_batch, dtype=np.int64)
    by_key = np.argsort(place[positions % lanes], kind="stable")
    bounds = np.arange(participants + 1, dtype=np.int64) * global_batch // participants
    owners = np.empty(global_batch, dtype=np.int64)
    owners[by_key] = np.repeat(np.arange(participants, dtype=np.int64), np.diff(bounds))
    return owners


def step_ranks(cursor: int, global_batch: int, world_size: int, *, lanes: int = 1,
               epoch_size: int | None = None, ranks_per_node: int = 1) -> np.ndarray:
    """The rank that reads each position of a full step (``world_size`` divides the batch).

    >>> step_ranks(0, 8, 2).tolist()                 # one lane: contiguous halves
    [0, 0, 0, 0, 1, 1, 1, 1]
    >>> step_ranks(0, 8, 2, lanes=4).tolist()        # keys 0-1 to rank 0, keys 2-3 to rank 1
    [0, 0, 1, 1, 0, 0, 1, 1]
    """
    Topology(global_batch, world_size)
    return step_owners(cursor, global_batch, world_size, lanes=lanes, epoch_size=epoch_size,
                       ranks_per_node=ranks_per_node)


def positions_for_rank(cursor: int, global_batch: int, world_size: int, rank: int, *,
                       lanes: int = 1, epoch_size: int | None = None,
                       ranks_per_node: int = 1) -> np.ndarray:
    """The positions rank ``rank`` consumes in the step ``[cursor, cursor + global_batch)``.

    :func:`positions_for_participant` with ``world_size`` ranks, which must divide the
    batch: every rank gets ``global_batch // world_size`` increasing positions and the
    ranks' sets partition the step.

    >>> positions_for_rank(0, 8, 2, 1).tolist()              # one lane: contiguous halves
    [4, 5, 6, 7]
    >>> positions_for_rank(0, 8, 2, 1, lanes=4).tolist()     # keys 2 and 3
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
                                     epoch_size=epoch_size, ranks_per_node=ranks_per_node)


def tail_positions_for_rank(cursor: int, end: int, world_size: int, rank: int, *,
                            lanes: int = 1, epoch_size: int | None = None,
                            ranks_per_node: int = 1) -> np.ndarray:
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
                                     epoch_size=epoch_size, ranks_per_node=ranks_per_node)


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

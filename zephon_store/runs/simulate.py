"""What a job would read, without reading it: the ``zephon plan`` simulator.

Given the manifest, order options and topology, it computes (pure functions; no shard byte
is read) which sample ids each rank gets per step, by the loader's own rank rule
(:func:`zephon_store.order.assign.step_ranks`, with the topology's ``ranks_per_node``), and
per node (``ranks_per_node`` consecutive ranks):

- **read amplification**: bytes fetched / bytes consumed, where a node fetches every row
  group its ranks touch once (a node-local cache large enough to hold what is in flight;
  see footprint) and consumes the compressed bytes of the rows it uses
  (``length * rows_used / rows`` of each row group);
- **distinct row groups per step**, the decode working set of a step;
- **cache footprint**: the peak bytes of row groups that the node has started but not
  finished, i.e. the cache a node needs for the amplification above to hold.
"""

from __future__ import annotations

import numpy as np

from ..order.assign import positions_for_rank, step_cursor, step_ranks
from ..order.order import Order, OrderOptions, shuffle_quality
from ..order.topology import Topology


def rank_ids(order: Order, topology: Topology, cursor: int) -> list[np.ndarray]:
    """The sample ids of every rank for the step starting at ``cursor``."""
    t = topology
    return [order.sample_at(positions_for_rank(cursor, t.global_batch, t.world_size, r,
                                               lanes=order.effective_lanes,
                                               epoch_size=order.num_samples,
                                               ranks_per_node=t.ranks_per_node))
            for r in range(t.world_size)]


def rank_of_positions(order: Order, topology: Topology, cursors) -> np.ndarray:
    """``[steps, global_batch]``: the rank of every position of the steps at ``cursors``.

    :func:`zephon_store.order.assign.step_ranks` per step: the simulator uses the loader's
    rank rule, not a copy of it.
    """
    t = topology
    return np.stack([step_ranks(int(c), t.global_batch, t.world_size,
                                lanes=order.effective_lanes, epoch_size=order.num_samples,
                                ranks_per_node=t.ranks_per_node)
                     for c in cursors]).reshape(len(cursors), t.global_batch)


def simulate(manifest, order_options: OrderOptions, topology: Topology, *, cursor: int = 0,
             steps: int | None = None, order=None, end: int | None = None) -> dict:
    """Simulate ``steps`` steps from ``cursor``; by default exactly one epoch's positions.

    The default covers ``[cursor, cursor + N)``: ``ceil(N / B)`` steps (at most 20,000),
    the positions of the last step past ``cursor + N`` left out. A whole epoch is what a
    node's amplification is about: each epoch permutes the blocks anew, so a node's lanes
    are new blocks every epoch, and a partial epoch would count the windows it leaves half
    read. ``topology.rank`` is ignored (every rank is simulated); ``topology.ranks_per_node``
    groups ranks into nodes and is passed to the rank rule. ``order``: the order to simulate
    (default ``Order(manifest.rg_rows, order_options)``; a mixture passes its mixed order
    over its virtual manifest, :mod:`zephon_store.mix.mixed`). ``end``: the first position
    the order cannot serve (a mixture whose capped source runs out), never simulated.
    """
    if order is None:
        order = Order(manifest.rg_rows, order_options)
    t = topology
    b = t.global_batch
    limit = None
    if steps is None:
        steps = max(1, min(20_000, -(-order.num_samples // b)))
        limit = min(steps * b, order.num_samples)
    if end is not None:
        steps = max(1, min(steps, (end - cursor) // b))   # full steps before the end
        limit = None if limit is None else min(limit, steps * b)
    cursors = np.array([step_cursor(cursor, j, b) for j in range(steps)], dtype=np.int64)
    pos = (cursors[:, None] + np.arange(b, dtype=np.int64)[None, :]).reshape(-1)
    ranks = rank_of_positions(order, t, cursors).reshape(-1)
    step_of = np.repeat(np.arange(steps), b)
    if limit is not None:
        pos, ranks, step_of = pos[:limit], ranks[:limit], step_of[:limit]
    ids = order.sample_at(pos)
    rg = np.searchsorted(manifest.rg_row_start, ids, side="right") - 1
    nodes = ranks // t.ranks_per_node
    per_node, distinct_per_step = [], []
    tot_fetched = tot_consumed = 0.0
    for node in range(t.num_nodes):
        sel = nodes == node
        if sel.any():
            row, fetched, consumed, per_step = _node_stats(manifest, rg[sel], step_of[sel],
                                                           steps)
            per_node.append({"node": node, **row})
            distinct_per_step.append(per_step)
            tot_fetched += fetched
            tot_consumed += consumed
    ranks_distinct = []
    for r in range(min(t.world_size, 64)):
        sel = ranks == r
        key = step_of[sel] * (manifest.num_row_groups + 1) + rg[sel]
        ranks_distinct.append(len(np.unique(key)) / steps)
    batches = min(steps, 200) if end is None else max(1, min(steps, 200, end // b))
    quality = shuffle_quality(order, b, num_batches=batches, shard_of_block=manifest.rg_shard,
                              end=end)
    amps = [p["read_amplification"] for p in per_node]
    return {
        "effective_lanes": order.effective_lanes,
        "simulated_steps": steps,
        "read_amplification": round(tot_fetched / tot_consumed, 4) if tot_consumed else 0.0,
        "read_amplification_max_node": max(amps),
        "distinct_row_groups_per_step_per_node": round(
            float(np.mean([d.mean() for d in distinct_per_step])), 2),
        "distinct_row_groups_per_step_per_rank": round(float(np.mean(ranks_distinct)), 2),
        "cache_footprint_bytes_max": max(p["cache_footprint_bytes"] for p in per_node),
        "num_nodes": t.num_nodes,
        "lane_order": ("contiguous" if b % order.effective_lanes == 0 else "interleaved"),
        "shuffle_quality": quality,
        "nodes": per_node,
    }


def _node_stats(manifest, node_rg: np.ndarray, node_step: np.ndarray,
                steps: int) -> tuple[dict, float, float, np.ndarray]:
    """One node's row of :func:`simulate` from the row group and step of each of its
    positions; its bytes fetched and consumed (unrounded, for the totals); its distinct
    row groups per step."""
    touched, first_idx, where = np.unique(node_rg, return_index=True, return_inverse=True)
    # Only the touched row groups' lengths: format v4 fetches them in chunks on first use.
    len_touched = np.asarray(manifest.rg_length[touched], dtype=np.float64)
    fetched = float(len_touched.sum())
    consumed = float((len_touched[where] / manifest.rg_rows[node_rg].astype(np.float64)).sum())
    # footprint: bytes of row groups between their first and last touch, peak over steps
    last_idx = len(node_rg) - 1 - np.unique(node_rg[::-1], return_index=True)[1]
    first_step, last_step = node_step[first_idx], node_step[last_idx]
    delta = np.zeros(steps + 1)
    np.add.at(delta, first_step, len_touched)
    np.add.at(delta, last_step + 1, -len_touched)
    footprint = float(np.cumsum(delta)[:-1].max())
    key = node_step * (manifest.num_row_groups + 1) + node_rg
    per_step = np.bincount(np.unique(key) // (manifest.num_row_groups + 1), minlength=steps)
    return {"bytes_fetched": int(fetched),
            "bytes_consumed": int(consumed),
            "read_amplification": round(fetched / consumed, 4) if consumed else 0.0,
            "distinct_row_groups_per_step": round(float(per_step.mean()), 2),
            "cache_footprint_bytes": int(footprint)}, fetched, consumed, per_step
